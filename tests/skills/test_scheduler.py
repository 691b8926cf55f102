"""Scheduler logic with a fast fake trainer (tests/skills/fake_skills_trainer.py: checkpoints go
through the real Checkpointer): slots, frontier blocking, retries, failure isolation, per-skill
budgets, crash and resume, the state file and the lock, including kills inside each window
between two writes (a child process that exits at a named point, as under SIGKILL)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from fake_skills_trainer import CHILD_LEARN_ROUNDS, Crash, FakeTrainer, RecordingPlanner, config, run

from jaxrl_hier.checkpointing.checkpoints import Checkpointer, CheckpointError
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.skills import scheduler as scheduler_module
from jaxrl_hier.skills import state as state_module
from jaxrl_hier.skills.generators import ProposalContext
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.llm_generator import answer_loop
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.state import (CRASH_ENV, CRASH_EXIT_CODE, LOCK_FILE, PREV_FILE, STATE_FILE, RunLock,
                                     StateError, load_state)

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("fake_skills_trainer.py")


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
