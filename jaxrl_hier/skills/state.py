"""The scheduler's state file and the run lock.

`scheduler_state.json` is replaced atomically (temp file, fsync, rename over it) after every
transition, so at every instant the path `resume` reads holds a complete state. Before that, the
current version is copied (atomically too) to `scheduler_state.prev.json`, the state one
transition earlier. A state file that does not parse is refused, never overwritten. In a
multi-process JAX run only process 0 writes; the others read.

`scheduler.lock` records the owner's pid, host and a heartbeat, refreshed by a background thread
while the run lives (a long round must not look dead). A second `run`/`resume` on the same
directory is refused while the owner lives; a lock whose pid is gone (same host) or whose
heartbeat is older than `stale_after_s` (another host) is stale and taken over, with a log line.
Reading a lock, judging it and replacing it happen under an exclusive `flock` on
`scheduler.lock.mutex`, so of two resumers that find the same stale lock exactly one wins; the
kernel drops a flock when its holder dies, so the mutex itself can never go stale.

The heartbeat says the process is alive, not that it is working (a run once hung inside an
XLA op for minutes while its heartbeat beat on). So the lock also holds `progress`, the time (and
round) of the scheduler's last real step, advanced only by `RunLock.progress` after each skill
start and each round. When it is older than `stuck_after_s` (0: off), the heartbeat thread logs an
error naming what the run was doing, stops refreshing the heartbeat and marks the lock `stuck`; a
lock marked stuck, or whose progress is older than the bound (a process so hung that even its
heartbeat thread stopped), is stale to `resume` even while its pid lives, and is taken over. The
stuck process never writes after that: `progress` and `check` raise once the lock is not its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from jaxrl_hier.config import ConfigError
from jaxrl_hier.io import atomic_write_bytes, atomic_write_json
from jaxrl_hier.runs import is_primary
from jaxrl_hier.skills.spec import Skill, SkillLibrary

STATE_FILE = "scheduler_state.json"
PREV_FILE = "scheduler_state.prev.json"
LOCK_FILE = "scheduler.lock"
MUTEX_FILE = "scheduler.lock.mutex"
STATUSES = ("pending", "running", "completed", "failed")
log = logging.getLogger("jaxrl_hier.skills")

# ---------------------------------------------------------------------------- crash points
# Named points between two writes that must survive a kill. Tests stop a run at one of them:
# a subprocess through the environment variable, `POINT` or `POINT:N` (the N-th time it is
# reached), exits there at once as under SIGKILL; in process, tests replace `crash_hook`.
CRASH_ENV = "JAXRL_HIER_SKILLS_CRASH_AT"
CRASH_EXIT_CODE = 86
_reached: dict[str, int] = {}


def _exit_at_named_point(name: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or not wanted.startswith(name):
        return
    _reached[name] = _reached.get(name, 0) + 1
    point, _, nth = wanted.partition(":")
    if point == name and _reached[name] == int(nth or 1):
        os._exit(CRASH_EXIT_CODE)  # no cleanup, no finally: what a kill leaves behind


crash_hook: Callable[[str], None] = _exit_at_named_point


def crash_point(name: str) -> None:
    crash_hook(name)


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
    max_timesteps: int | None = None  # the proposal's own budget per attempt (LLMs may give one)
    # [successes, reached episodes] of the current attempt's latest rounds: the shortest run of
    # rounds, newest last, that holds at least `min_episodes` episodes (success_rate is over it)
    window: list = field(default_factory=list)
    # "" (training, restarts as configured) or "fresh": restarts off, judged on fresh-world episodes
    phase: str = ""
    phase_steps: int = 0  # env steps of the current attempt when its phase began
    # With restarts, before any fresh-world phase: the `window` of the episodes that began in a fresh
    # world (the states the skill's frozen chain hands it), which `fresh_phase: needed` judges
    fresh_window: list = field(default_factory=list)

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
    # Chain fine-tuning (skills.chain) after the skills: status "" (not begun) | running | done, its
    # target and plan, env steps and chunks done, and the chunk whose checkpoint matches them.
    chain: dict = field(default_factory=dict)
    # The learned manager (skills.manager) after the chain: status "" | running | done, the skills it
    # chooses among, env steps and chunks done (the chunk whose checkpoint matches them).
    manager: dict = field(default_factory=dict)
    # The manager's generalist stage (`manager.generalist_timesteps`), before the manager's own:
    # status "" | running | done, env steps and chunks done.
    generalist: dict = field(default_factory=dict)
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
    """Copy the current state to PREV_FILE, then replace STATE_FILE; both writes are atomic, and
    the live file is never moved away, so a kill anywhere leaves a complete STATE_FILE."""
    if not is_primary():
        return
    path = directory / STATE_FILE
    if path.exists():
        atomic_write_bytes(directory / PREV_FILE, path.read_bytes())
        crash_point("state.prev_written")
    atomic_write_json(path, state.to_json())


def load_state(directory: Path) -> SchedulerState:
    path = directory / STATE_FILE
    if not path.is_file() and (directory / PREV_FILE).is_file():
        # Left by versions that moved the live file to PREV_FILE before writing the new one.
        raise StateError(f"{path} is missing but {PREV_FILE} is there (a run killed while replacing its state): "
                         f"copy {PREV_FILE} to {STATE_FILE} and run resume again.")
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
    """An exclusive lock on a run directory, with stale-lock takeover and a heartbeat thread (see
    the module docstring). `lost` holds the new owner when another run took the lock over."""

    def __init__(self, directory: Path, stale_after_s: float = 900.0, heartbeat_s: float | None = None,
                 stuck_after_s: float = 0.0):
        self.path = Path(directory) / LOCK_FILE
        self.mutex_path = Path(directory) / MUTEX_FILE
        self.stale_after_s = stale_after_s
        self.stuck_after_s = stuck_after_s  # no progress for this long: stuck (0: never judged stuck)
        # Several beats per staleness (and stuck) period, so one slow write never makes a live run
        # look dead, and a stuck one is marked within a quarter period of the bound.
        bounds = [stale_after_s] + ([stuck_after_s] if stuck_after_s > 0 else [])
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else min(60.0, min(bounds) / 4)
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self.lost: dict | None = None
        self.stuck = False  # this run marked its own lock stuck (no progress for stuck_after_s)
        self._stuck_at = 0.0
        self._beat_at = time.time()
        self._progress = {"progress": time.time(), "round": None, "done": "acquired the lock", "doing": "starting"}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def _mutex(self) -> Iterator[None]:
        """Exclusive across processes (and threads: each call opens its own file description)."""
        self.mutex_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.mutex_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # written by hand or by a foreign tool: stale

    def _mine(self, held: dict | None) -> bool:
        return bool(held) and held.get("pid") == self.owner["pid"] and held.get("host") == self.owner["host"]

    def _stale(self, held: dict) -> bool:
        if not held or "pid" not in held:
            return True
        try:
            if held.get("stuck") or self._no_progress_for(held) is not None:
                return True  # alive perhaps, but hung: see the module docstring
            if held.get("host") == self.owner["host"]:
                return not _pid_alive(int(held["pid"]))
            return time.time() - float(held.get("heartbeat", 0)) > self.stale_after_s
        except (TypeError, ValueError):
            return True  # not a lock this code wrote

    def _no_progress_for(self, held: dict) -> float | None:
        """Seconds since the holder's last progress when past the bound (the `stuck_after_s` the holder
        wrote, which knows its rounds; this run's when it wrote none), else None. Locks without progress
        (older versions): None."""
        bound = float(held["stuck_after_s"] if "stuck_after_s" in held else self.stuck_after_s)
        if bound <= 0 or "progress" not in held:
            return None
        age = time.time() - float(held["progress"])
        return age if age > bound else None

    def _write(self) -> None:
        if not self.stuck:  # a stuck run's heartbeat no longer moves
            self._beat_at = time.time()
        atomic_write_json(self.path, {**self.owner, "heartbeat": self._beat_at, **self._progress,
                                      "stuck_after_s": self.stuck_after_s, "stuck": self.stuck,
                                      **({"stuck_at": self._stuck_at} if self.stuck else {})})

    def acquire(self) -> None:
        with self._mutex():
            held = self._read()
            if held is not None and not self._stale(held):
                raise StateError(f"{self.path.parent} is in use by pid {held.get('pid')} on {held.get('host')} "
                                 f"(lock {self.path}). Wait for that run to end or stop it; a lock whose "
                                 "owner has died is taken over automatically.")
            if held is not None and (held.get("stuck") or self._no_progress_for(held) is not None):
                log.warning("taking over the lock %s of a stuck run: pid %s on %s made no progress since %s (round "
                            "%s, last: %s; it was %s). That process may still be alive: it writes nothing more, "
                            "stop it (kill %s).", self.path, held.get("pid"), held.get("host"),
                            time.strftime("%H:%M:%S", time.localtime(float(held.get("progress", 0)))),
                            held.get("round"), held.get("done"), held.get("doing"), held.get("pid"))
            elif held is not None:
                log.warning("taking over the stale lock %s (pid %s on %s is gone, or its heartbeat is older than "
                            "%g s)", self.path, held.get("pid"), held.get("host"), self.stale_after_s)
            crash_point("lock.judged")  # the lock was judged free or stale; now it is replaced
            self.stuck = False
            self._progress = {"progress": time.time(), "round": None, "done": "acquired the lock",
                              "doing": "starting"}
            self._write()
        self.lost = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._judge_stuck()
                self.heartbeat()
            except OSError as err:  # a full or flaky disk: the next beat tries again
                log.warning("could not refresh the lock %s: %s", self.path, err)
            if self.lost is not None:
                return

    def _judge_stuck(self) -> None:
        """In the heartbeat thread: no progress for `stuck_after_s` marks this run stuck (once)."""
        idle = time.time() - self._progress["progress"]
        if self.stuck or self.stuck_after_s <= 0 or idle <= self.stuck_after_s:
            return
        self.stuck, self._stuck_at = True, time.time()
        log.error("run %s is stuck: no progress for %.0f s (stuck_after_s=%g) while %s (round %s; last progress: "
                  "%s). The lock is marked stuck and its heartbeat stopped: `python -m jaxrl_hier.skills resume "
                  "%s` from another process takes the run over, and this one (pid %s) writes nothing more.",
                  self.path.parent, idle, self.stuck_after_s, self._progress["doing"], self._progress["round"],
                  self._progress["done"], self.path.parent, self.owner["pid"])

    def progress(self, round: int | None, done: str, doing: str) -> None:
        """The scheduler made real progress (`done`; next it is `doing`): the only call that moves the
        lock's `progress`. Raises, before the caller writes anything, if the lock was taken over."""
        self.check()
        self._progress = {"progress": time.time(), "round": round, "done": done, "doing": doing}
        if self.stuck:  # late, but not taken over: the run goes on, and says so
            log.warning("run %s made progress again (%s) after being marked stuck; the lock is its own still, "
                        "so it goes on", self.path.parent, done)
            self.stuck = False
        with self._mutex():
            held = self._read()
            if self._mine(held):
                self._write()
        self.check()

    def doing(self, what: str) -> None:
        """Name what the run does until its next progress (in the stuck error and the lock file);
        moves nothing: a label is not progress."""
        self._progress = {**self._progress, "doing": what}

    def heartbeat(self) -> None:
        """Refresh the heartbeat, unless another run took the lock over (then set `lost`)."""
        with self._mutex():
            held = self._read()
            if not self._mine(held):
                self.lost = held or {}
                log.error("the lock %s was taken over by pid %s on %s; this run stops writing", self.path,
                          self.lost.get("pid"), self.lost.get("host"))
                return
            self._write()

    def check(self) -> None:
        """Raise if the lock was taken over (this run's heartbeat lapsed): never two writers."""
        held = self._read()  # a small file, replaced atomically: cheap beside a round
        if self.lost is None and not self._mine(held):
            self.lost = held or {}
        if self.lost is not None:
            raise StateError(f"the lock {self.path} was taken over by pid {self.lost.get('pid')} on "
                             f"{self.lost.get('host')} (this run's heartbeat was older than {self.stale_after_s:g} s, "
                             f"or it made no progress for stuck_after_s={self.stuck_after_s:g} s and was marked stuck); "
                             "this run stopped without writing more. Let the other run finish.")

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def release(self) -> None:
        self.stop_heartbeat()
        with self._mutex():
            if self._mine(self._read()):
                self.path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- the run's skills
def run_library(state: SchedulerState, catalog: SkillLibrary) -> SkillLibrary:
    """Every skill proposed in a run, as Skill objects (Python predicates taken from `catalog`)."""
    return SkillLibrary(tuple(_skill(r, catalog) for r in state.skills))


def _skill(r: SkillRecord, catalog: SkillLibrary) -> Skill:
    if r.name in catalog and catalog[r.name].to_dict() == r.spec:
        return catalog[r.name]
    if "predicate" in r.spec:
        raise StateError(f"skill '{r.name}' uses the Python predicate {r.spec['predicate']}, which the library "
                         "passed to this run does not define; pass the same library as the run that proposed it.")
    return Skill.from_dict(r.spec, source=f"{STATE_FILE} skill '{r.name}'")


def read_spec(directory: Path) -> dict:
    return json.loads((directory / "spec.json").read_text())
