"""The two kill windows of a run directory (`jaxrl_hier.runs.ResumableRun`), replayed on a finished
run: every algorithm's lifecycle test calls `assert_kill_windows_replay` (tests/test_run_lifecycle.py
for PPO, SFT, GRPO and the guided agent; tests/search/test_pgts_cli.py for PGTS's PPO stage, whose
earlier stages make a run too dear to train twice).

1. Killed after the last step's metrics row was written and before its checkpoint: `--resume`
   restores the checkpoint before, drops the logged row and replays that step to the same numbers.
2. Killed before the first checkpoint, after the first row was written: `--resume` starts the stage
   over and writes every row once, with the same numbers; a step-0 evaluation's row is kept, not
   evaluated again.

Each row is marked before the resume: the rows up to the restored step must keep their mark (the
resume went on from that checkpoint, not from the start) and the later ones come back unmarked with
the same numbers.

A kill is made by deleting what it would not have written: the newest checkpoint (all of them for
window 2), and the stage's seal where it has one (`DONE`, its saved model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Sequence

#: wall-clock figures, the only values a replay may change
VOLATILE = ("time_s", "fps", "search_steps_per_s", "tokens_per_s")


def rows(path: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock values."""
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE and not k.startswith("time/")}
            for line in path.read_text().splitlines()]


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want):
        assert a == b, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def _steps(checkpoints: Path) -> list[int]:
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())


def _kill(stage: Path, seal: Sequence[str], checkpoints_to_drop: list[int]) -> None:
    for step in checkpoints_to_drop:
        shutil.rmtree(stage / "checkpoints" / str(step))
    for name in seal:
        path = stage / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _mark_rows(stage: Path, keep: int | None = None) -> None:
    """Marks every row of metrics.jsonl (the first `keep` only, when given, the others cut off)."""
    lines = (stage / "metrics.jsonl").read_text().splitlines()[:keep]
    (stage / "metrics.jsonl").write_text("".join(json.dumps({**json.loads(x), "kept": True}) + "\n" for x in lines))


def _resumed_from(stage: Path, resume: Callable[[], int], restored: int, finished: list[dict]) -> None:
    """`resume` goes on from step `restored`: the marked rows up to it stay as they were, later ones
    are replayed to the same numbers."""
    assert resume() == 0
    got = rows(stage / "metrics.jsonl")
    for row in got:
        assert row.pop("kept", False) == (row.get("update", 0) <= restored), row
    assert_same_rows(got, finished)


def assert_kill_windows_replay(stage: Path, resume: Callable[[], int], *, seal: Sequence[str] = (),
                               files: Sequence[str] = ()) -> None:
    """`stage`: the directory of a finished stage (its metrics.jsonl, rows carrying their step as
    `update`, and checkpoints/, which holds at least its last two steps); `resume`: runs `--resume`
    on the run and returns its exit code; `seal`: what the stage writes when it ends, after its last
    row (for a sealed stage: DONE, model); `files`: other files of the stage that must come out the
    same (e.g. PGTS's trees.txt)."""
    finished = rows(stage / "metrics.jsonl")
    kept = {name: (stage / name).read_bytes() for name in files}
    steps = _steps(stage / "checkpoints")
    assert len(steps) >= 2 and len(finished) >= 2, (steps, len(finished))

    # 1. after the last row, before its checkpoint: goes on from the one before
    _kill(stage, seal, [steps[-1]])
    _mark_rows(stage)
    _resumed_from(stage, resume, steps[-2], finished)
    assert _steps(stage / "checkpoints") == steps
    assert {name: (stage / name).read_bytes() for name in files} == kept

    # 2. before the first checkpoint, after the first row: starts over, and a step-0 evaluation's row
    # is kept rather than evaluated again (a first row of a training step is replayed)
    _kill(stage, seal, _steps(stage / "checkpoints"))
    _mark_rows(stage, keep=1)
    _resumed_from(stage, resume, 0, finished)
    assert _steps(stage / "checkpoints") == steps
    assert {name: (stage / name).read_bytes() for name in files} == kept
