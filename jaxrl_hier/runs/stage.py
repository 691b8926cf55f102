"""Stages of a run directory sealed by a DONE file: SFT warm-starts, PGTS's reward model, verifier and
imitation, each a folder whose `DONE` (a JSON summary, written last and atomically by process 0)
says the stage is complete. A resumed run loads a sealed stage and redoes an unsealed one (from its
own checkpoints where it has them).

    stage_summary(stage)   the summary of a sealed stage, or None
    seal_stage(stage, s)   write DONE (process 0; atomic, so a kill leaves the stage unsealed, not half-sealed)
    run_params_stage(...)  a stage whose product is one parameter tree, kept as its only checkpoint
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from jaxrl_hier.runs.process import is_primary

DONE = "DONE"


def stage_summary(stage: Path) -> dict | None:
    """The summary a finished stage sealed, or None while it is unfinished."""
    done = Path(stage) / DONE
    return json.loads(done.read_text()) if done.is_file() else None


def seal_stage(stage: Path, summary: dict) -> None:
    """Mark `stage` complete with its summary: the last write of a stage, by process 0 only."""
    if is_primary():
        from jaxrl_hier.io import atomic_write_json

        atomic_write_json(Path(stage) / DONE, summary)


def run_params_stage(stage: Path, target: Any, meta: dict, step: int,
                     train: Callable[[Any], tuple[Any, dict]]) -> tuple[Any, dict, bool]:
    """A stage whose product is one parameter tree: stage/checkpoints holds it and stage/DONE (written
    last) its summary. A finished stage is restored into `target`'s structure; otherwise
    `train(target) -> (params, summary)` runs and its params are saved as checkpoint `step`, a
    checkpoint of a run killed before DONE being replaced. Returns (params, summary, was finished)."""
    from jaxrl_hier.checkpointing import Checkpointer

    ckpt = Checkpointer(Path(stage) / "checkpoints", keep=1)
    try:
        summary = stage_summary(stage)
        if summary is not None:
            params, _ = ckpt.restore(ckpt.latest_step(), target, expect=meta)
            return params, summary, True
        params, summary = train(target)
        ckpt.delete_newer_than(None)
        ckpt.save(step, params, meta)
        ckpt.wait()
        seal_stage(stage, summary)
        return params, summary, False
    finally:
        ckpt.close()


__all__ = ["DONE", "run_params_stage", "seal_stage", "stage_summary"]
