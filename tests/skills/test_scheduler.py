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
from fake_skills_trainer import CHILD_LEARN_ROUNDS, QUANTITIES, Crash, FakeTrainer, RecordingPlanner, config, run

from jaxrl_hier.checkpointing.checkpoints import Checkpointer, CheckpointError
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.skills import scheduler as scheduler_module
from jaxrl_hier.skills import state as state_module
from jaxrl_hier.skills.generators import ProposalContext, make_validator
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.llm_generator import answer_loop
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.spec import SkillError, SkillLibrary
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
    # its last attempt's expert is kept (chain fine-tuning may start from it); a skill that never ran has none
    failed_dir = tmp_path / "skills" / state.record("make_wood_pickaxe").dirname
    assert json.loads((failed_dir / "expert.json").read_text())["skill"] == "make_wood_pickaxe"
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


# ---------------------------------------------------------------------------- kills between two writes
def summary(state):
    """What a run computed, skill by skill (wall time aside): equal runs trained equally."""
    return {r.name: (r.status, r.attempts, r.total_steps, r.rounds, r.success_rate) for r in state.skills}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run as the child's, never interrupted."""
    out = tmp_path_factory.mktemp("reference")
    return summary(run(out, FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS)))


def run_child(out, *args, crash_at=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop(CRASH_ENV, None)
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, str(CHILD), str(out), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("crash_at", [
    "state.prev_written:12",  # window 1: .prev copied, the new state not written yet
    "round.checkpoint_saved:4",  # window 2: round 5's checkpoint saved, the state still names round 4's
])
def test_kill_between_two_writes_then_resume_loses_and_retrains_nothing(tmp_path, reference, crash_at):
    child = run_child(tmp_path, crash_at=crash_at)
    assert child.returncode == CRASH_EXIT_CODE, child.stdout + child.stderr[-3000:]
    killed = load_state(tmp_path)  # a complete state file at the path resume reads
    assert (tmp_path / LOCK_FILE).exists()  # left behind by the kill, taken over below
    completed = {r.name for r in killed.by_status("completed")}
    continuing = {r.name for r in killed.by_status("running") if r.started_round < killed.checkpoint_round}
    assert completed and continuing, killed  # the kill fell mid-run, with skills past a checkpoint
    steps = Checkpointer(tmp_path / "checkpoints", keep=None, asynchronous=False).all_steps()
    if crash_at.startswith("round"):
        assert max(steps) == killed.checkpoint_round + 1  # the stale step the replayed round saves again
    else:
        assert (tmp_path / PREV_FILE).read_bytes() == (tmp_path / STATE_FILE).read_bytes()

    trainer = FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS)
    state = run(tmp_path, trainer, resume=True)
    assert summary(state) == reference  # nothing lost, nothing trained twice
    assert not completed & set(trainer.starts)  # completed skills were loaded, never started again
    assert continuing <= set(trainer.restored) and not continuing & set(trainer.starts)  # from their checkpoint
    for r in state.skills:  # one metrics row per round that counts, none from the replayed round twice
        updates = [row["update"] for row in read_jsonl(tmp_path / "skills" / r.dirname / "metrics.jsonl")]
        assert len(updates) == len(set(updates)) == r.rounds, (r.name, updates)
    assert not (tmp_path / LOCK_FILE).exists()


def test_checkpointer_refuses_a_step_orbax_would_skip_and_deletes_newer_steps(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3, asynchronous=False)
    for step in (1, 2, 3):
        ckpt.save(step, {"x": np.full(2, step)}, {})
    with pytest.raises(CheckpointError, match="step 2 was not saved.*latest step there is 3"):
        ckpt.save(2, {"x": np.full(2, 20)}, {})  # Orbax returns False and writes nothing
    assert Checkpointer(tmp_path, keep=3).delete_newer_than(1) == [2, 3]  # another manager: ckpt's list is old
    ckpt.save(2, {"x": np.full(2, 20)}, {})
    state, meta = ckpt.restore(2, {"x": np.zeros(2, np.int64)}, {})
    assert state["x"].tolist() == [20, 20] and meta["step"] == 2 and ckpt.all_steps() == [1, 2]


# ---------------------------------------------------------------------------- the lock
RACER = """
import sys, time, pathlib
from jaxrl_hier.skills import state
d = pathlib.Path(sys.argv[1])
(d / sys.argv[2]).touch()
while not (d / "go").exists():
    time.sleep(0.01)
# Widen the window between judging the lock stale and replacing it.
state.crash_hook = lambda name: time.sleep(0.5) if name == "lock.judged" else None
try:
    state.RunLock(d).acquire()
except state.StateError as err:
    print("lost", err, flush=True)
    sys.exit(0)
print("won", flush=True)
while not (d / "release").exists():  # hold the lock (alive) until the other racer has decided
    time.sleep(0.01)
"""


def test_two_resumers_race_for_a_stale_lock_and_one_wins(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "heartbeat": 0}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), f"ready{i}"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        end = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)) and time.monotonic() < end:
            time.sleep(0.05)
        (tmp_path / "go").touch()
        loser = None
        while loser is None and time.monotonic() < end:
            loser = next((p for p in racers if p.poll() is not None), None)
            time.sleep(0.05)
        assert loser is not None, "no racer lost: both took the lock"
        winner = racers[1 - racers.index(loser)]
        out, err = loser.communicate()
        assert out.startswith("lost") and "in use by pid" in out, out + err
        held = json.loads((tmp_path / LOCK_FILE).read_text())
        assert held["pid"] == winner.pid and winner.poll() is None
    finally:
        (tmp_path / "release").touch()
        for p in racers:
            p.wait(timeout=60)
    assert "won" in winner.stdout.read()


def test_heartbeat_keeps_the_lock_of_a_long_round_fresh(tmp_path):
    """A round longer than the staleness limit: another host must not take the live run's lock;
    once the heartbeat stops, it may, and the old owner stops before writing."""
    elsewhere = RunLock(tmp_path, stale_after_s=1.0)
    elsewhere.owner = {"pid": 1, "host": "elsewhere"}
    refused = []

    def long_round(n):
        if n == 2:
            time.sleep(2.5)  # 2.5 staleness periods (the heartbeat beats every 0.25 s)
            with pytest.raises(StateError, match="in use by pid") as err:
                elsewhere.acquire()
            refused.append(str(err.value))

    state = run(tmp_path, FakeTrainer(round_hook=long_round), stale_lock_s=1.0)
    assert refused and all(r.status == "completed" for r in state.skills)

    lock = RunLock(tmp_path, stale_after_s=1.0)
    lock.acquire()
    lock.stop_heartbeat()  # the control: without the heartbeat a shorter wait makes it stale
    time.sleep(1.5)
    elsewhere.acquire()
    lock.heartbeat()
    with pytest.raises(StateError, match="taken over by pid 1 on elsewhere"):
        lock.check()
    lock.release()  # not ours any more: left alone
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "elsewhere"
    elsewhere.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_run_whose_lock_was_taken_over_stops_without_writing(tmp_path):
    elsewhere = RunLock(tmp_path, stale_after_s=0.5)
    elsewhere.owner = {"pid": 1, "host": "elsewhere"}
    before = {}
    sched = None

    def take_over(n):
        if n == 3:
            before["state"] = (tmp_path / STATE_FILE).read_bytes()
            sched.lock.stop_heartbeat()
            time.sleep(0.8)
            elsewhere.acquire()

    lib = techtree_library()
    sched = Scheduler(config(stale_lock_s=0.5), tmp_path, FakeTrainer(round_hook=take_over), RecordingPlanner(lib), lib)
    sched.lock.heartbeat_s = 0.1
    with pytest.raises(StateError, match="taken over by pid 1 on elsewhere"):
        sched.run()
    assert (tmp_path / STATE_FILE).read_bytes() == before["state"]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "elsewhere"
    elsewhere.release()


# ---------------------------------------------------------------------------- processes, budgets
def test_only_process_0_writes_the_run_directory(tmp_path, monkeypatch):
    run(tmp_path, FakeTrainer(learn_rounds=3), max_rounds=4)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "checkpoints" not in p.parts}
    monkeypatch.setattr(jax, "process_index", lambda: 1)  # every process but 0 of a multi-process run
    state = run(tmp_path, FakeTrainer(learn_rounds=3), resume=True, max_rounds=6)
    assert state.round == 6 and load_state(tmp_path).round == 4  # trained, read, wrote nothing
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "checkpoints" not in p.parts} == files
    assert not (tmp_path / LOCK_FILE).exists()


def test_max_rounds_stops_and_a_larger_one_goes_on(tmp_path, reference):
    first = run(tmp_path, FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS), max_rounds=5)
    assert first.round == 5 and first.by_status("running") and first.generation == "active"
    state = run(tmp_path, FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS), resume=True)
    assert summary(state) == reference


def test_max_wall_s_stops_between_rounds_and_resume_goes_on(tmp_path, reference):
    """A clock that advances 10 s per round: max_wall_s=35 stops after the 4th round (the check comes
    before a round, never inside one), leaving running skills running; resume finishes the same run."""
    now = [0.0]
    lib = techtree_library()
    trainer = FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS, round_hook=lambda n: now.__setitem__(0, now[0] + 10.0))
    sched = Scheduler(config(max_wall_s=35), tmp_path, trainer, RecordingPlanner(lib), lib, clock=lambda: now[0])
    first = sched.run()
    assert first.round == 4 and first.by_status("running") and first.generation == "active"
    state = run(tmp_path, FakeTrainer(learn_rounds=CHILD_LEARN_ROUNDS), resume=True)
    assert summary(state) == reference


def test_a_proposals_max_timesteps_is_its_budget_per_attempt(tmp_path):
    planner = RecordingPlanner(techtree_library(), budgets={"place_table": 1000, "collect_three_wood": 10**9})
    state = run(tmp_path, FakeTrainer(never={"place_table", "collect_three_wood"}), planner, max_retries=0)
    # 1000 steps (one round) for place_table; collect_three_wood asked for more than the config's 3000
    assert state.record("place_table").total_steps == 1000 and "after 1,000 steps" in state.record("place_table").reason
    assert state.record("collect_three_wood").total_steps == 3000
    assert load_state(tmp_path).record("place_table").max_timesteps == 1000
    validate = make_validator(SkillLibrary(()), techtree_library(), QUANTITIES, 8, 2)
    for bad in (0, "1000", True, 1.5):
        with pytest.raises(SkillError, match="'max_timesteps' must be a positive integer"):
            validate({"name": "a", "success": ["inventory.wood >= 1"], "max_timesteps": bad})


def test_an_llm_answer_with_max_timesteps_reaches_the_scheduler(tmp_path):
    answers = iter(['{"name": "collect_wood", "requires": [], "success": ["achievement.collect_wood == 1"], '
                    '"max_timesteps": 0}',  # refused by the schema, re-asked
                    '{"name": "collect_wood", "requires": [], "success": ["achievement.collect_wood == 1"], '
                    '"max_timesteps": 2000}', '{"done": true}'])

    class ScriptedLLM:
        def propose(self, context: ProposalContext, validate):
            return answer_loop(lambda messages: next(answers), context, validate, 3, "scripted", scheduler_module.log)

    state = run(tmp_path, FakeTrainer(), ScriptedLLM())
    assert [(r.name, r.max_timesteps, r.status) for r in state.skills] == [("collect_wood", 2000, "completed")]


def test_success_rate_pools_the_latest_rounds_until_min_episodes():
    """A deep skill's rounds hold few reached episodes: its rate pools the fewest latest rounds with
    at least min_episodes of them, and a round with enough episodes stands alone."""
    from jaxrl_hier.skills.trainer import RoundResult

    w = []
    for rate, n in [(0.0, 30), (0.5, 30), (1.0, 30)]:
        w = scheduler_module._window(w, RoundResult(rate, n, 0, None, None), min_episodes=64)
    assert w == [[0.0, 30], [15.0, 30], [30.0, 30]]  # 60 episodes without the oldest: not enough to drop it
    w = scheduler_module._window(w, RoundResult(0.9, 40, 0, None, None), min_episodes=64)
    assert w == [[30.0, 30], [36.0, 40]]  # 70 episodes in the latest two: rate 66/70
    w = scheduler_module._window(w, RoundResult(None, 0, 0, None, None), min_episodes=64)  # no episode: kept
    assert w == [[30.0, 30], [36.0, 40]]
    assert scheduler_module._window(w, RoundResult(0.25, 64, 0, None, None), min_episodes=64) == [[16.0, 64]]


def test_fresh_world_phase_ends_restarts_and_waits_for_failures_to_end(tmp_path):
    """A skill with dependencies that passes with restarts trains on from fresh worlds (restart
    probability 0 in its slot) and completes on its fresh-world rate, counted only after
    `fresh_min_timesteps` of the phase; a root skill has no such phase."""
    # place_table's fresh-world rate: the quick successes first (1.0), then its steady state
    trainer = FakeTrainer(slots=1, fresh_rates={"place_table": [1.0, 0.7, 0.7, 0.95]})
    state = run(tmp_path, trainer, target="place_table", max_parallel_skills=1, restart_prob=0.9,
                fresh_success_rate_threshold=0.9, fresh_min_timesteps=1500, skill_timesteps=20000)
    table = state.record("place_table")
    assert table.status == "completed" and table.phase == "fresh" and state.record("collect_wood").phase == ""
    assert trainer.restart_calls == [("place_table", 0.0)]  # restarts ended once, for the skill with a dependency
    rows = [json.loads(line) for line in (tmp_path / "skills" / table.dirname / "metrics.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in rows]
    first_fresh = phases.index("fresh")
    assert phases[:first_fresh] == ["train"] * first_fresh and first_fresh == 2  # passed with restarts in round 2
    fresh = rows[first_fresh:]
    # 1,000 steps a round: the first fresh round (1.0, the quick successes only) is not counted, the
    # 0.7 rounds keep it training, and it completes on its 0.95 round, not on the early 1.0
    assert [r["success_rate"] for r in rows[first_fresh:]] == [None, 0.7, 0.7, 0.95]


@pytest.mark.parametrize("fresh_rate, phase", [(0.7, ""), (0.5, "fresh")])
def test_needed_fresh_phase_runs_only_for_a_skill_short_from_fresh_worlds(tmp_path, caplog, fresh_rate, phase):
    """`fresh_phase: needed`: a skill whose fresh-world episodes of the restart phase already pass the
    fresh threshold completes when it passes with restarts; one below it trains on from fresh worlds."""
    trainer = FakeTrainer(slots=1, restart_fresh_rates={"place_table": fresh_rate})
    state = run(tmp_path, trainer, target="place_table", max_parallel_skills=1, restart_prob=0.9, min_episodes=64,
                fresh_success_rate_threshold=0.6, fresh_phase="needed", skill_timesteps=20000)
    table = state.record("place_table")
    assert table.status == "completed" and table.phase == phase
    assert trainer.restart_calls == ([] if phase == "" else [("place_table", 0.0)])
    rows = [json.loads(line) for line in (tmp_path / "skills" / table.dirname / "metrics.jsonl").read_text().splitlines()]
    assert [r["fresh_episodes"] for r in rows[:2]] == [50, 50]  # two rounds hold min_episodes
    # below success_rate_threshold (0.8) but above the fresh bar the config chose: no warning
    assert not [m for m in caplog.messages if "its rate is" in m]


def test_a_skill_that_passed_on_its_anchors_alone_is_reported(tmp_path, caplog):
    """With restarts and no fresh-world phase, a skill whose fresh-world episodes fall short of the
    threshold completes with a warning that names the rate and the setting that trains it on."""
    trainer = FakeTrainer(slots=1, restart_fresh_rates={"place_table": 0.25})
    with caplog.at_level("WARNING", logger="jaxrl_hier.skills"):
        state = run(tmp_path, trainer, target="place_table", max_parallel_skills=1, restart_prob=0.9, min_episodes=64)
    assert state.record("place_table").status == "completed"
    warnings = [m for m in caplog.messages if "from fresh worlds its rate is 0.25 (100 episodes)" in m]
    assert len(warnings) == 1 and "fresh_success_rate_threshold" in warnings[0]


def test_greedy_evaluation_runs_every_nth_round(tmp_path):
    trainer = FakeTrainer()
    run(tmp_path, trainer, max_rounds=7, greedy_eval_every=3)
    assert trainer.greedy_evals == [False, False, True, False, False, True, False]
    never = FakeTrainer()
    run(tmp_path / "never", never, max_rounds=3, greedy_eval_every=0)
    assert never.greedy_evals == [False] * 3


@pytest.mark.parametrize("chain_timesteps,target_attempts", [(0, 2), (1000, 1)])
def test_the_target_is_not_retried_when_chain_fine_tuning_follows(tmp_path, monkeypatch, chain_timesteps,
                                                                  target_attempts):
    # The chain phase itself (skills.chain, tests/skills/test_chain.py) is not what this checks.
    monkeypatch.setattr(Scheduler, "_chain", lambda self: None)
    trainer = FakeTrainer(fail_first={"place_table"}, never={"make_wood_pickaxe"})
    state = run(tmp_path, trainer, target="make_wood_pickaxe", max_retries=1, chain_timesteps=chain_timesteps)
    assert state.record("place_table").status == "completed" and state.record("place_table").attempts == 2
    target = state.record("make_wood_pickaxe")
    assert target.status == "failed" and target.attempts == trainer.starts.count("make_wood_pickaxe") == target_attempts
    assert (tmp_path / "skills" / target.dirname / "expert.json").is_file()  # the chain starts from it
