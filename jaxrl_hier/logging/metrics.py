"""metrics.jsonl, TensorBoard and W&B sinks (plots: `logging.plots`).

`metrics.jsonl` gets one JSON object per logged update, flushed and fsynced line by line (and
the directory fsynced when the file is created). On resume it is cut back to the records at or
before the restored update, rewritten through `jaxrl_hier.io.atomic_writer`, so a resumed run
writes exactly the lines an uninterrupted run would have written. In a multi-process run only
process 0 writes: the others build the writer with `primary=False` and it does nothing.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from jaxrl_hier.io import atomic_write_text, fsync_dir


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null for 'no episode finished in this update'."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: str | Path) -> list[dict]:
    """Parse a JSONL file, skipping a torn last line left by a crash."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


class MetricsWriter:
    """Appends records to `metrics.jsonl` and forwards them to the optional TensorBoard/W&B sinks.

    `primary=False` (every process but 0 of a multi-process run) makes every method a no-op, so
    the training loop stays the same on all processes.
    """

    def __init__(self, output_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "jaxrl_hier", config: dict | None = None, primary: bool = True,
                 filename: str = "metrics.jsonl"):
        self.path = Path(output_dir) / filename
        self.primary = primary
        self._file = None
        self._tb = None
        self._wandb = None
        if not primary:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        if wandb:
            import wandb as wandb_lib  # presence checked by the CLI before anything compiles
            # Offline unless the user configured otherwise: nothing here reaches a server by default.
            os.environ.setdefault("WANDB_MODE", "offline")
            self._wandb = wandb_lib.init(project=wandb_project, dir=str(output_dir), config=config or {},
                                         resume="allow", id=Path(output_dir).name)

    def truncate_after(self, update: int) -> None:
        """Keep only records with `update <= update` (resume after a crash)."""
        if not self.primary:
            return
        kept = [r for r in read_jsonl(self.path) if r.get("update", 0) <= update]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        if not self.primary:
            return
        if self._file is None:
            created = not self.path.exists()
            self._file = open(self.path, "a")
            if created:  # the new directory entry must survive a crash as well as the lines
                fsync_dir(self.path.parent)
        record = {k: _clean(v) for k, v in record.items()}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        step = int(record.get("env_steps", record.get("update", 0)))
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if v is not None}, step=step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
