"""Scheduler logic with a fast fake trainer: slots, frontier blocking, retries, failure isolation,
crash and resume, the state file and the lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_hier.envs import make
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.skills.config import skills_config_from_dict
from jaxrl_hier.skills.generators import GeneratorUnavailable, TechTreePlanner
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.state import LOCK_FILE, PREV_FILE, STATE_FILE, RunLock, StateError, load_state
from jaxrl_hier.skills.trainer import RoundResult, quantities_for

QUANTITIES = tuple(quantities_for(make("TechTree-v0")[0], techtree_library()))


class Crash(Exception):
    pass


class FakeTrainer:
    """Success rate per round from a script; checkpoints and experts as JSON files."""

    def __init__(self, slots=2, never=(), fail_first=(), crash_at=None):
        self.slots, self.quantity_names = slots, QUANTITIES
        self.never, self.fail_first, self.crash_at = set(never), set(fail_first), crash_at
        self.slot_skill, self.progress = [None] * slots, [0] * slots
        self.starts: list[str] = []
        self.running_sets: list[tuple[str, ...]] = []
        self.rounds = 0
        self.restored: dict[str, int] = {}

    def init(self, key):
        self.slot_skill, self.progress = [None] * self.slots, [0] * self.slots

    def start(self, slots, library, experts, key):
        for i, name in slots.items():
            missing = [d for d in library.closure(name) if d not in experts]
            assert not missing, f"{name} started without the experts of {missing}"
            self.slot_skill[i], self.progress[i] = name, 0
            self.starts.append(name)

    def _rate(self, name, progress):
        if name in self.never or (name in self.fail_first and self.starts.count(name) == 1):
            return 0.1
        return 0.5 if progress < 2 else 0.95

    def train_round(self):
        self.rounds += 1
        if self.crash_at is not None and self.rounds == self.crash_at:
            raise Crash("simulated crash")
        self.running_sets.append(tuple(n for n in self.slot_skill if n))
        out = []
        for i, name in enumerate(self.slot_skill):
            self.progress[i] += 1
            out.append(RoundResult(self._rate(name, self.progress[i]) if name else None, 100, 1000, 1.0, 5.0))
        return out

    def expert(self, slot):
        return {"skill": self.slot_skill[slot], "rounds": self.progress[slot]}

    def save_checkpoint(self, directory, step, meta):
        atomic_write_json(Path(directory) / f"{step}.json", {"skills": self.slot_skill, "progress": self.progress})

    def restore_checkpoint(self, directory, step):
        data = json.loads((Path(directory) / f"{step}.json").read_text())
        self.slot_skill, self.progress = data["skills"], data["progress"]
        self.restored = {n: p for n, p in zip(self.slot_skill, self.progress) if n}

    def save_expert(self, directory, expert, meta):
        atomic_write_json(Path(directory) / "expert.json", expert)

    def load_expert(self, directory):
        return json.loads((Path(directory) / "expert.json").read_text())


class RecordingPlanner(TechTreePlanner):
    def __init__(self, tree, fail_after=None):
        super().__init__(tree)
        self.contexts, self.fail_after = [], fail_after

    def propose(self, context, validate):
        self.contexts.append(context)
        if self.fail_after is not None and len(self.contexts) > self.fail_after:
            raise GeneratorUnavailable("http://127.0.0.1:9/v1 unreachable after 4 retries")
        return super().propose(context, validate)


def config(**kw):
    values = dict(env="TechTree-v0", target="all", max_parallel_skills=2, skill_timesteps=3000, min_episodes=10,
                  max_retries=1, max_experts=8, max_conditions=2, success_rate_threshold=0.8)
    values.update(kw)
    return skills_config_from_dict(values)


def run(tmp_path, trainer, generator=None, resume=False, **kw):
    lib = techtree_library()
    sched = Scheduler(config(**kw), tmp_path, trainer, generator or RecordingPlanner(lib), lib)
    return sched.run(resume=resume)


def test_slots_retries_failure_isolation_and_frontier_blocking(tmp_path):
    trainer = FakeTrainer(never={"collect_three_wood"}, fail_first={"place_table"})
    planner = RecordingPlanner(techtree_library())
    state = run(tmp_path, trainer, planner)
    status = {r.name: r for r in state.skills}
    assert status["collect_three_wood"].status == "failed" and status["collect_three_wood"].attempts == 2
    assert "< 0.8" in status["collect_three_wood"].reason
    assert status["place_table"].status == "completed" and status["place_table"].attempts == 2  # retried once
    # Failure isolation: everything that does not depend on the failed skill completed.
    assert all(r.status == "completed" for r in state.skills if r.name != "collect_three_wood")
    assert len(state.skills) == len(techtree_library())
    # Never more skills at once than slots; independent skills did share the slots.
    assert max(len(s) for s in trainer.running_sets) == 2
    assert ("place_table", "collect_three_wood") in trainer.running_sets
    # Completed skills were never started again; only retried ones twice.
    assert {n: trainer.starts.count(n) for n in set(trainer.starts) if trainer.starts.count(n) > 1} == {
        "place_table": 2, "collect_three_wood": 2}
    # Frontier blocking: no proposal was asked for while a proposed skill waited on unfinished ones.
    for ctx in planner.contexts:
        done = {s["name"] for s in ctx.skills if s["status"] == "completed"}
        assert all(set(s["requires"]) <= done for s in ctx.skills if s["status"] == "pending"), ctx
    assert state.generation == "finished"
    # On disk: the state file, the previous one, per-skill spec with the expert index map and metrics.
    assert load_state(tmp_path).to_json() == state.to_json() and (tmp_path / PREV_FILE).is_file()
    spec = json.loads((tmp_path / "skills" / f"{status['collect_stone'].id:03d}_collect_stone" / "spec.json").read_text())
    assert spec["plan"] == ["collect_wood", "place_table", "make_wood_pickaxe"]
    assert [e["local"] for e in spec["expert_index"]] == [0, 1, 2, 8]
    lines = (tmp_path / "skills" / f"{status['collect_stone'].id:03d}_collect_stone" / "metrics.jsonl").read_text()
    assert len(lines.splitlines()) == status["collect_stone"].rounds == 2
    assert not (tmp_path / LOCK_FILE).exists()


def test_dependents_of_a_failed_skill_fail_without_blocking_others(tmp_path):
    trainer = FakeTrainer(never={"make_wood_pickaxe"})
    state = run(tmp_path, trainer, max_retries=0)
    status = {r.name: r.status for r in state.skills}
    assert status["make_wood_pickaxe"] == "failed"
    assert status["collect_three_wood"] == "completed" and status["place_table"] == "completed"
    # collect_stone was proposed while make_wood_pickaxe trained; it fails with it, and nothing that
    # needs a failed skill is proposed after that.
    assert status["collect_stone"] == "failed"
    assert state.record("collect_stone").reason == "dependency 'make_wood_pickaxe' failed"
    assert "make_stone_pickaxe" not in status and state.generation == "finished"


def test_crash_then_resume_never_retrains_completed_skills(tmp_path):
    first = FakeTrainer(crash_at=4)
    with pytest.raises(Crash):
        run(tmp_path, first)
    before = load_state(tmp_path)
    completed = {r.name for r in before.by_status("completed")}
    running = {r.name for r in before.by_status("running")}
    assert completed and running
    second = FakeTrainer()
    state = run(tmp_path, second, resume=True)
    assert not completed & set(second.starts)  # never started again
    assert set(second.restored) == running and all(p > 0 for p in second.restored.values())  # continued
    assert not running & set(second.starts)  # from their checkpoint, not from scratch
    assert all(r.status == "completed" for r in state.skills)


def test_generator_unavailable_stops_generation_and_keeps_work(tmp_path):
    planner = RecordingPlanner(techtree_library(), fail_after=3)
    state = run(tmp_path, FakeTrainer(), planner)
    assert state.generation == "stopped" and "unreachable" in state.generation_reason
    assert [r.status for r in state.skills] == ["completed"] * 3


def test_corrupt_state_file_is_refused_and_kept(tmp_path):
    run(tmp_path, FakeTrainer())
    (tmp_path / STATE_FILE).write_text('{"target": "all", "skills": [')
    with pytest.raises(StateError, match=f"corrupt.*copy {PREV_FILE}"):
        load_state(tmp_path)
    assert (tmp_path / STATE_FILE).read_text() == '{"target": "all", "skills": ['
    with pytest.raises(StateError, match="not a skills run directory"):
        load_state(tmp_path / "nowhere")


def test_lock_refuses_a_live_owner_and_takes_over_a_stale_one(tmp_path):
    lock_path = tmp_path / LOCK_FILE
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for held, stale in [({"pid": dead.pid, "host": host, "heartbeat": time.time()}, True),
                        ({"pid": os.getppid(), "host": host, "heartbeat": time.time()}, False),
                        ({"pid": 1, "host": "elsewhere", "heartbeat": time.time() - 3600}, True),
                        ({"pid": 1, "host": "elsewhere", "heartbeat": time.time()}, False)]:
        lock_path.write_text(json.dumps(held))
        lock = RunLock(tmp_path, stale_after_s=600)
        if stale:
            lock.acquire()
            assert json.loads(lock_path.read_text())["pid"] == os.getpid()
            lock.release()
            assert not lock_path.exists()
        else:
            with pytest.raises(StateError, match="in use by pid"):
                lock.acquire()
