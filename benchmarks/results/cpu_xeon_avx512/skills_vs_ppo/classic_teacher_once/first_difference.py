"""Where two runs' stages part: for each metrics.jsonl under OLD_RUN that NEW_RUN also has, the first
chunk with a field (wall times aside) that differs, and the largest relative difference there.

    python first_difference.py OLD_RUN NEW_RUN
"""
import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if "wall" not in k} for line in path.open()]


old, new = Path(sys.argv[1]), Path(sys.argv[2])
for fa in sorted(old.rglob("metrics.jsonl")):
    fb = new / fa.relative_to(old)
    if not fb.exists():
        continue
    ra, rb = rows(fa), rows(fb)
    first = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
    if first is None:
        print(f"{fa.relative_to(old)}: the same in all {min(len(ra), len(rb))} chunks")
        continue
    x, y = ra[first], rb[first]
    rel = max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-12) for k in x if x[k] != y.get(k))
    print(f"{fa.relative_to(old)}: the same for {first} chunks; chunk {first} differs in "
          f"{sorted(k for k in x if x[k] != y.get(k))}, by at most {rel:.1e} relative")
