"""benchmarks/skills/compare_runs.py: where two runs' stages part."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.skills.compare_runs import main  # noqa: E402


def write(run: Path, stage: str, rows: list[dict]) -> None:
    (run / stage).mkdir(parents=True, exist_ok=True)
    (run / stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_stage_is_the_same_or_parts_at_its_first_differing_chunk(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    rows = [{"update": i, "loss": 1.0 + i, "wall_s": 3.0 + i, "env_steps_per_s": 100.0} for i in range(4)]
    write(old, "skills/000_collect_wood", rows)
    write(new, "skills/000_collect_wood", [{**r, "wall_s": 9.0, "env_steps_per_s": 5.0} for r in rows])  # times only
    write(old, "generalist", rows)
    write(new, "generalist", rows[:2] + [{**rows[2], "loss": 3.3}] + rows[3:])
    write(old, "manager", rows)
    assert main([str(old), str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["generalist: the same for 2 chunks; chunk 2 differs in loss, by at most 1.0e-01 relative",
                   "manager: missing in the new run",
                   "skills/000_collect_wood: the same in all 4 chunks"]
