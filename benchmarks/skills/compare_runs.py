"""Where two skills runs part: for each stage's `metrics.jsonl` under OLD_RUN (skills, chain,
generalist, manager), whether NEW_RUN's holds the same numbers, and if not, the first chunk where a
field differs and the largest relative difference there. Wall times and rates are left out: two
runs of the same program agree in everything else on one machine.

    python benchmarks/skills/compare_runs.py OLD_RUN NEW_RUN

Either may be a run directory or a committed results folder with the runs' metrics. Prints one line
per stage; exit 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# fields that measure time, not the program: never compared
TIMED = ("wall", "time", "per_s")


def chunks(path: Path) -> list[dict]:
    """A metrics.jsonl's rows without the timed fields."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not any(t in k for t in TIMED) and not k.endswith("_s")} for row in rows]


def relative(x: object, y: object) -> float:
    """|x - y| / |x| for numbers; 1.0 where the two differ otherwise (a string, a missing field)."""
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return abs(x - y) / max(abs(x), 1e-12)
    return 1.0


def compare(old: list[dict], new: list[dict]) -> str:
    """One line: the same in all chunks both have, or the first chunk that differs and how."""
    first = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), None)
    lengths = "" if len(old) == len(new) else f" (old {len(old)} chunks, new {len(new)})"
    if first is None:
        return f"the same in all {min(len(old), len(new))} chunks{lengths}"
    x, y = old[first], new[first]
    fields = sorted(k for k in {*x, *y} if x.get(k) != y.get(k))
    worst = max(relative(x.get(k), y.get(k)) for k in fields)
    return (f"the same for {first} chunks; chunk {first} differs in {', '.join(fields)}, by at most "
            f"{worst:.1e} relative{lengths}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    for path in sorted(args.old.rglob("metrics.jsonl")):
        stage = path.relative_to(args.old)
        other = args.new / stage
        line = compare(chunks(path), chunks(other)) if other.exists() else "missing in the new run"
        print(f"{stage.parent}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
