"""A run directory's checkpoints and JSONL logs, kept in step so that a kill at any instant leaves
a resumable run: the one loop skeleton of every trainer CLI (PPO, GRPO, the guided agent, PGTS's
PPO stage).

    with ResumableRun(out / "checkpoints", meta, keep=3, every=50, total=1000, resume=True) as run:
        state, start = run.restore(state)      # the latest checkpoint when resuming, else (state, 0)
        writer = run.log(out)                  # metrics.jsonl cut back to the restored step
        if run.first_row_due(writer):          # not logged before a kill preceding the first checkpoint
            writer.write({"update": 0, **evaluate(state)})
        def step(state, done):                 # the chunk after step `done`: run it, log it
            state, metrics = ...
            writer.write({"update": done + 1, **metrics})
            return state, 1, {"loss": ...}     # steps taken, the progress bar's postfix
        state, end = run.run_steps(args, state, total=total, desc="sft", step=step)
        # checkpointed every `every` steps and at `total`; the bar is closed whatever happens

Rows logged after the latest checkpoint are replayed on resume, so `log` drops them first (rows
carry their step as `update`); a step is logged before it is checkpointed, so no row is lost.
Checkpoints are saved by every process (Orbax coordinates a multi-process save); logs are written
by process 0 only (`primary`). `restore` comes before `log` so that a refused restore (a checkpoint
of another run's shapes) has changed no file of the run; the run's config.yaml (`config_file`, a
`RunConfigFile`) is written only once `restore` has succeeded.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxrl_hier.runs.directory import RunConfigFile
from jaxrl_hier.runs.progress import progress_bar

#: a stage's step: (state, steps done so far) -> (state, steps it took, the progress bar's postfix or None)
Step = Callable[[Any, int], "tuple[Any, int, Mapping[str, Any] | None]"]


class ResumableRun:
    def __init__(self, directory: str | Path, meta: Mapping[str, Any], *, keep: int, every: int, total: int | None,
                 resume: bool, primary: bool = True, config_file: RunConfigFile | None = None):
        """`every`: steps between checkpoints (0: none on the way); `total`: the last step, always
        checkpointed (None: not, for a stage that saves its own result when it ends); `config_file`:
        the run's RunConfigFile, told when the restore succeeded (None: a stage that writes none)."""
        from jaxrl_hier.checkpointing import Checkpointer  # Orbax loads only when a run starts

        self.ckpt = Checkpointer(directory, keep=keep)
        self.meta = dict(meta)
        self.every, self.total, self.resume, self.primary = every, total, resume, primary
        self.config_file = config_file
        self.start = 0
        self._writers: list[Any] = []

    def restore(self, state: Any) -> tuple[Any, int]:
        """(state, step): the latest checkpoint's when resuming and there is one, else (state, 0)."""
        latest = self.ckpt.latest_step() if self.resume else None
        if latest is not None:
            state, _ = self.ckpt.restore(latest, state, expect=self.meta)
            self.start = latest
        if self.config_file is not None:
            self.config_file.restored()
        return state, self.start

    def log(self, directory: str | Path, filename: str = "metrics.jsonl", **kwargs: Any):
        """A MetricsWriter of `directory/filename` holding only rows up to the restored step."""
        from jaxrl_hier.logging import MetricsWriter

        writer = MetricsWriter(directory, primary=self.primary, filename=filename, **kwargs)
        self._writers.append(writer)
        writer.truncate_after(self.start)
        return writer

    def first_row_due(self, writer: Any) -> bool:
        """Whether the run's step-0 row (the evaluation before training) is still to be written: the
        run starts at step 0 and `writer` (one of `log`'s) holds no update-0 row. A run killed before
        its first checkpoint restarts at step 0 but keeps the row it logged there, which a second
        evaluation would duplicate. Process 0 reads the file and decides for every process, as the
        evaluation may be a collective computation that all of them must enter."""
        if self.start:
            return False
        from jaxrl_hier.logging import read_jsonl
        from jaxrl_hier.runs.process import from_primary

        logged = self.primary and any(r.get("update", 0) == 0 for r in read_jsonl(writer.path))
        return not from_primary(logged)

    def due(self, step: int) -> bool:
        return (self.total is not None and step == self.total) or bool(self.every and step % self.every == 0)

    def save_if_due(self, step: int, state: Any) -> None:
        if self.due(step):
            self.ckpt.save(step, state, self.meta)

    def run_steps(self, args: argparse.Namespace, state: Any, *, total: int, desc: str, step: Step,
                  unit: int = 1) -> tuple[Any, int]:
        """The loop between the restore and the end, the same for every trainer: `step` goes on from
        the steps done so far (the restored step at first) and logs what it did; the state is
        checkpointed whenever `due`; the progress bar (`unit` of its ticks a step: env steps for PPO)
        is closed whatever happens. Returns (state, the last step)."""
        done = self.start
        with progress_bar(args, total * unit, done * unit, desc) as progress:
            while done < total:
                state, n, postfix = step(state, done)
                done += n
                if progress is not None:
                    progress.update(n * unit)
                    if postfix:
                        progress.set_postfix(postfix)
                self.save_if_due(done, state)
        return state, done

    def close(self) -> None:
        """Wait for the last save and close the logs (also after an error: what was saved stays)."""
        try:
            self.ckpt.close()
        finally:
            for writer in self._writers:
                writer.close()

    def __enter__(self) -> "ResumableRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
