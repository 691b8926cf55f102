"""Compare two runs' metrics.jsonl files, every field but wall times."""
import json, sys
from pathlib import Path
a, b = Path(sys.argv[1]), Path(sys.argv[2])
for fa in sorted(a.rglob("metrics.jsonl")):
    fb = b / fa.relative_to(a)
    if not fb.exists():
        print("missing in b:", fa.relative_to(a)); continue
    ra = [json.loads(l) for l in open(fa)]; rb = [json.loads(l) for l in open(fb)]
    strip = lambda r: {k: v for k, v in r.items() if "wall" not in k and not k.endswith("_s") and "per_s" not in k and "time" not in k}
    same = len(ra) == len(rb) and all(strip(x) == strip(y) for x, y in zip(ra, rb))
    print("same" if same else "DIFFERENT", fa.relative_to(a), len(ra), len(rb))
