"""The run directory's identity: where a run goes, whether it may start there, and its config.yaml.

A fresh run gets `--output-dir` or runs/<name>-<time> (`resolve_output_dir`) and is refused in a
directory that already holds a run (`refuse_existing_run`); a resume is refused when its config
differs from the saved one outside the algorithm's safe keys (`check_resume_changes` against
`load_saved_config`). config.yaml is written through `RunConfigFile`: a fresh run's once every
check has passed, a resumed run's only once its checkpoint is restored, so that a refused restore
leaves the file as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from jaxrl_hier.config import ConfigError, build_dataclass, read_yaml, to_dict
from jaxrl_hier.io import atomic_write_text
from jaxrl_hier.runs.process import is_primary

# Files whose presence means a directory already holds a run.
RUN_FILES = ("config.yaml", "metrics.jsonl")


def resolve_output_dir(args: argparse.Namespace, name: str) -> Path:
    """--output-dir, or runs/<name>-<time> for a fresh run."""
    if args.output_dir is not None:
        return args.output_dir
    return Path("runs") / f"{name.replace(':', '_').replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"


def refuse_existing_run(output_dir: Path) -> None:
    """A fresh run never appends to, or overwrites, an earlier run's files."""
    found = [name for name in RUN_FILES if (output_dir / name).exists()]
    ckpt = output_dir / "checkpoints"
    if ckpt.is_dir() and any(ckpt.iterdir()):
        found.append("checkpoints/")
    if found:
        raise ConfigError(f"{output_dir} already holds an earlier run ({', '.join(found)}): pass --resume to "
                          "continue it, or choose another --output-dir.")


def check_resume_changes(saved: Any, config: Any, safe_keys: Sequence[str], prefix: str = "") -> None:
    """Refuse a resume whose config differs from the saved one in a key outside `safe_keys` (a key of
    a nested section by its dotted name, e.g. 'ppo.total_timesteps')."""
    for field in dataclasses.fields(config):
        name = prefix + field.name
        before, after = getattr(saved, field.name), getattr(config, field.name)
        if dataclasses.is_dataclass(after) and type(before) is type(after):
            check_resume_changes(before, after, safe_keys, prefix=name + ".")
        elif before != after and name not in safe_keys:
            raise ConfigError(
                f"cannot change '{name}' on --resume ({before!r} in the run, {after!r} asked): it changes "
                f"what the run learns. Keys a resume may change: {', '.join(safe_keys)}. Start a new run with "
                "another --output-dir to change it."
            )


def load_saved_config(cls: type, output_dir: Path) -> Any:
    """The config a run directory was started with (its config.yaml without the `algorithm` key)."""
    raw = read_yaml(output_dir / "config.yaml")
    raw.pop("algorithm", None)
    return build_dataclass(cls, raw, source=str(output_dir / "config.yaml"))


def save_run_config(path: Path, algorithm: str, config: Any) -> None:
    """config.yaml with `algorithm` first, atomically, on process 0 only."""
    if is_primary():
        atomic_write_text(path, yaml.safe_dump({"algorithm": algorithm, **to_dict(config)}, sort_keys=False))


class RunConfigFile:
    """A run's config.yaml, written when it is safe to: `checked()` when every input check has
    passed, `restored()` when the checkpoint the run continues from is restored (ResumableRun calls
    it). A fresh run writes at the first of the two (so a run killed in its first stage can be
    resumed), a resumed run only at `restored()`: a refused restore leaves config.yaml as it was,
    and a good one records the keys the resume changed. Written once, by process 0."""

    def __init__(self, output_dir: Path, algorithm: str, config: Any, *, resume: bool):
        self.path, self.algorithm, self.config, self.resume = output_dir / "config.yaml", algorithm, config, resume
        self.saved = False

    def checked(self) -> None:
        if not self.resume:
            self._save()

    def restored(self) -> None:
        self._save()

    def _save(self) -> None:
        if not self.saved:
            save_run_config(self.path, self.algorithm, self.config)
            self.saved = True
