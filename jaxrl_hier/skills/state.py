"""The scheduler's state file and the run lock.

`scheduler_state.json` is rewritten atomically (temp file, fsync, rename) after every transition,
and the previous version is kept as `scheduler_state.prev.json`, so a crash at any moment leaves a
readable state. A state file that does not parse is refused, never overwritten.

`scheduler.lock` records the owner's pid, host and a heartbeat. A second `run`/`resume` on the same
directory is refused while the owner lives; a lock whose pid is gone (same host) or whose heartbeat
is older than `stale_after_s` (another host) is stale and taken over, with a log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxrl_hier.config import ConfigError
from jaxrl_hier.io import atomic_write_json

STATE_FILE = "scheduler_state.json"
PREV_FILE = "scheduler_state.prev.json"
LOCK_FILE = "scheduler.lock"
STATUSES = ("pending", "running", "completed", "failed")
log = logging.getLogger("jaxrl_hier.skills")


class StateError(ConfigError):
    """A missing, corrupt or locked run directory (the message says how to recover)."""


@dataclass
class SkillRecord:
    id: int
    name: str
    spec: dict[str, Any]
    status: str = "pending"
    attempts: int = 0  # attempts started
    steps: int = 0  # env steps of the current attempt
    total_steps: int = 0  # over all attempts
    success_rate: float | None = None
    episodes: int = 0
    slot: int | None = None
    started_round: int = 0  # the round at which the current attempt started
    wall_s: float = 0.0
    rounds: int = 0
    reason: str = ""  # why it failed
    proposed_by: str = ""

    @property
    def dirname(self) -> str:
        return f"{self.id:03d}_{self.name}"


@dataclass
class SchedulerState:
    target: str
    skills: list[SkillRecord] = field(default_factory=list)
    round: int = 0
    checkpoint_round: int | None = None  # the runner checkpoint that matches the running slots
    generation: str = "active"  # active | paused | finished | stopped
    generation_reason: str = ""
    version: int = 1

    def record(self, name: str) -> SkillRecord:
        for r in self.skills:
            if r.name == name:
                return r
        raise KeyError(name)

    def by_status(self, *statuses: str) -> list[SkillRecord]:
        return [r for r in self.skills if r.status in statuses]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "SchedulerState":
        skills = [SkillRecord(**r) for r in data.pop("skills")]
        state = SchedulerState(skills=skills, **data)
        for r in skills:
            if r.status not in STATUSES:
                raise ValueError(f"skill '{r.name}' has unknown status '{r.status}'")
        return state


def save_state(directory: Path, state: SchedulerState) -> None:
    path = directory / STATE_FILE
    if path.exists():
        os.replace(path, directory / PREV_FILE)  # atomic; the new file below is atomic too
    atomic_write_json(path, state.to_json())


def load_state(directory: Path) -> SchedulerState:
    path = directory / STATE_FILE
    if not path.is_file():
        raise StateError(f"no {STATE_FILE} in {directory}: this is not a skills run directory (start one with "
                         "`python -m jaxrl_hier.skills run --config ... --output-dir DIR`).")
    try:
        return SchedulerState.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as err:
        prev = directory / PREV_FILE
        hint = (f"copy {prev.name} (the state one transition earlier) over it and run resume again"
                if prev.is_file() else "restore it from a backup or start a new --output-dir")
        raise StateError(f"{path} is corrupt ({type(err).__name__}: {err}). The file was left as it is; to recover, "
                         f"{hint}.") from None


# ---------------------------------------------------------------------------- lock
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive lock on a run directory, with stale-lock takeover (see the module docstring)."""

    def __init__(self, directory: Path, stale_after_s: float = 900.0):
        self.path = directory / LOCK_FILE
        self.stale_after_s = stale_after_s
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # half-written by a crashed owner: stale

    def _stale(self, held: dict) -> bool:
        if not held or "pid" not in held:
            return True
        if held.get("host") == self.owner["host"]:
            return not _pid_alive(int(held["pid"]))
        return time.time() - float(held.get("heartbeat", 0)) > self.stale_after_s

    def acquire(self) -> None:
        body = json.dumps({**self.owner, "heartbeat": time.time()})
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = self._read()
                if held is None:
                    continue  # released in between: try again
                if not self._stale(held):
                    raise StateError(f"{self.path.parent} is in use by pid {held.get('pid')} on {held.get('host')} "
                                     f"(lock {self.path}). Wait for that run to end or stop it; a lock whose "
                                     "owner has died is taken over automatically.")
                log.warning("taking over the stale lock %s (pid %s on %s is gone)", self.path, held.get("pid"),
                            held.get("host"))
                atomic_write_json(self.path, json.loads(body))
                return
            with os.fdopen(fd, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            return
        raise StateError(f"could not take the lock {self.path}; try again.")

    def heartbeat(self) -> None:
        atomic_write_json(self.path, {**self.owner, "heartbeat": time.time()})

    def release(self) -> None:
        held = self._read()
        if held and held.get("pid") == self.owner["pid"] and held.get("host") == self.owner["host"]:
            self.path.unlink(missing_ok=True)
