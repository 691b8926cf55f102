"""The skills CLI: bad input (exit 2 before compiling), resume overrides (safe keys only), and a
real TechTree run of four skills that is SIGKILLed mid-way and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fake_skills_trainer import FakeTrainer

from jaxrl_hier.skills.cli import main
from jaxrl_hier.skills.state import LOCK_FILE, PREV_FILE, STATE_FILE, load_state

ROOT = Path(__file__).resolve().parents[2]

SKILLS_YAML = """\
- name: collect_wood
  success: [achievement.collect_wood == 1]
- name: place_table
  requires: [collect_wood]
  success: [achievement.place_table == 1]
- name: collect_three_wood
  requires: [collect_wood]
  success: [inventory.wood >= 3]
- name: make_wood_pickaxe
  requires: [place_table]
  success: [achievement.make_wood_pickaxe == 1]
"""

CONFIG = """\
env: TechTree-v0
library: {library}
target: all
max_parallel_skills: 2
success_rate_threshold: 0.8
min_episodes: 64
max_retries: 1
skill_timesteps: 400000
min_skill_timesteps: 30720
updates_per_round: 10
max_experts: 4
max_conditions: 2
restart_prob: 0.9
ppo: {{num_envs: 64, num_steps: 16, num_minibatches: 4, lr: 0.001, hidden_size: 64, num_layers: 2}}
"""


def write_config(tmp_path: Path, skills: str = SKILLS_YAML) -> Path:
    (tmp_path / "skills.yaml").write_text(skills)
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(library=tmp_path / "skills.yaml"))
    return path


@pytest.mark.parametrize("skills,overrides,message", [
    ("- name: a\n  requires: [b]\n  success: [inventory.wood >= 1]\n"
     "- name: b\n  requires: [a]\n  success: [inventory.wood >= 1]\n", [], "cycle: a -> b -> a"),
    ("- name: a\n  requires: [nothing]\n  success: [inventory.wood >= 1]\n", [], "unknown skill 'nothing'"),
    ("- name: a\n  success: [inventory.gold >= 1]\n", [], "unknown quantity 'inventory.gold'"),
    (SKILLS_YAML, ["max_paralel_skills=2"], "Did you mean 'max_parallel_skills'"),
    (SKILLS_YAML, ["ppo.num_envz=64"], "unknown config key 'num_envz' in skills config section 'ppo'. Did you mean"),
    (SKILLS_YAML, ["generator=openai"], "needs 'llm_base_url'"),
    (SKILLS_YAML, ["generator=planner", "target=fly"], "target 'fly' is not"),
    (SKILLS_YAML, ["max_attempt_steps=-1"], "'max_attempt_steps' must be >= 0"),
    (SKILLS_YAML, ["greedy_eval_every=-2"], "'greedy_eval_every' must be >= 0"),
    (SKILLS_YAML, ["bank_shapes=all"], "'bank_shapes' must be 'fit' or 'max'"),
    (SKILLS_YAML, ["chain_moe_dispatch=dense"], "'chain_moe_dispatch' must be 'gather' or 'mask'"),
    (SKILLS_YAML, ["chain_update_epochs=-1"], "'chain_update_epochs' must be >= 0"),
    (SKILLS_YAML, ["fresh_phase=sometimes"], "'fresh_phase' must be 'always' or 'needed'"),
    (SKILLS_YAML, ["fresh_phase=needed"], "'fresh_phase: needed' chooses which skills run the fresh-world phase"),
    (SKILLS_YAML, ["ppo.matmul_dtype=bfloat16"], "'ppo.matmul_dtype: bfloat16' is for PPO's own MLP"),
    (SKILLS_YAML, ["skill_world_uses=0"], "'skill_world_uses' must be positive, got 0"),
    (SKILLS_YAML, ["skill_world_uses=4", "ppo.reset_mode=optimistic"],
     "'skill_world_uses: 4' needs 'ppo.reset_mode: pool' (got 'optimistic')"),
])
def test_bad_input_exits_2_with_one_message(tmp_path, capsys, skills, overrides, message):
    config = write_config(tmp_path, skills)
    code = main(["run", "--config", str(config), "--output-dir", str(tmp_path / "out"), *overrides])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out" / STATE_FILE).exists()


def test_resume_and_status_refuse_what_is_not_a_run(tmp_path, capsys):
    assert main(["resume", str(tmp_path)]) == 2
    assert "not a skills run directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a skills run directory" in capsys.readouterr().err
    (tmp_path / STATE_FILE).write_text("{")
    assert main(["status", str(tmp_path)]) == 2
    assert "corrupt" in capsys.readouterr().err and (tmp_path / STATE_FILE).read_text() == "{"
    # Only the previous state (left by older versions killed mid-write): neither a fresh run on
    # top of its checkpoints nor a resume that guesses.
    (tmp_path / STATE_FILE).rename(tmp_path / PREV_FILE)
    assert main(["resume", str(tmp_path)]) == 2
    assert f"copy {PREV_FILE} to {STATE_FILE}" in capsys.readouterr().err
    assert main(["run", "--config", str(write_config(tmp_path)), "--output-dir", str(tmp_path)]) == 2
    assert "already holds a skills run" in capsys.readouterr().err


def snapshot(directory: Path) -> dict:
    return {p.relative_to(directory): (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.rglob("*")
            if p.is_file()}


def test_resume_refuses_unsafe_overrides_untouched_and_records_safe_ones(tmp_path, capsys, monkeypatch):
    trainers = []

    def fake_trainer(config, catalog):  # the CLI as it is, with the fast trainer
        trainers.append(FakeTrainer(slots=config.max_parallel_skills, learn_rounds=3))
        return trainers[-1]

    monkeypatch.setattr("jaxrl_hier.skills.trainer.SkillTrainer", fake_trainer)
    out = tmp_path / "run"
    # eval_episodes=0: the fake trainer's experts are not networks, so no composed agent at the end
    assert main(["run", "--config", str(write_config(tmp_path)), "--output-dir", str(out), "max_rounds=4",
                 "min_skill_timesteps=0", "eval_episodes=0", "--no-progress"]) == 1  # stopped by max_rounds
    stopped = load_state(out)
    done, running = {r.name for r in stopped.by_status("completed")}, {r.name for r in stopped.by_status("running")}
    assert done and running
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "heartbeat": 0}))
    before = snapshot(out)
    for overrides, message in [(["seed=1"], "'seed' cannot be changed on resume"),
                               (["max_retries=2", "updates_per_round=5"], "'updates_per_round' cannot be changed"),
                               (["max_round=9"], "Did you mean 'max_rounds'"),
                               (["max_rounds=-1"], "'max_rounds' must be >= 0"),
                               (["max_wall_s=-5"], "'max_wall_s' must be >= 0")]:
        assert main(["resume", str(out), *overrides]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert "cannot be changed" not in message or "resume accepts max_rounds, max_wall_s, max_retries, stale_lock_s" in err
        assert snapshot(out) == before  # the stale lock too: nothing was taken over or rewritten
    assert main(["resume", str(out), "--no-progress", "max_rounds=0", "max_retries=2", "llm_timeout_s=5"]) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert (recorded["max_rounds"], recorded["max_retries"], recorded["llm_timeout_s"]) == (0, 2, 5.0)
    assert recorded["seed"] == 0 and recorded["updates_per_round"] == 10
    state = load_state(out)
    assert [r.status for r in state.skills] == ["completed"] * 4 and state.round > 4
    assert not done & set(trainers[-1].starts) and running <= set(trainers[-1].restored)
    assert not (out / LOCK_FILE).exists()


def _wait_for(predicate, proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            if predicate():
                return True
        except (OSError, ValueError, KeyError):
            pass  # the state file is being replaced: look again
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_four_techtree_skills_learn_to_threshold_through_sigkill_and_resume(tmp_path):
    config = write_config(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "jaxrl_hier.skills"]
    # No greedy evaluation beside the rounds (a program per round shape; test_multi_device.py runs it,
    # and its schedule test_scheduler.py's): this test is about the kill and the resume.
    proc = subprocess.Popen(cmd + ["run", "--config", str(config), "--output-dir", str(out), "--no-progress",
                                   "greedy_eval_every=0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def mid_way():  # a skill completed, another has trained past its first checkpoint
        s = load_state(out)
        return s.by_status("completed") and any(r.started_round < (s.checkpoint_round or -1)
                                                for r in s.by_status("running"))

    try:
        reached = _wait_for(mid_way, proc, timeout=420)
    finally:  # killed before its output is read: communicate() would wait for the whole run
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert reached, proc.stdout.read()[-3000:]
    killed = load_state(out)
    done_before = {r.name: r for r in killed.by_status("completed")}
    rows_before = {n: len((out / "skills" / r.dirname / "metrics.jsonl").read_text().splitlines())
                   for n, r in done_before.items()}
    assert (out / "scheduler.lock").exists()  # left behind by the kill; resume must take it over
    lock = (out / "scheduler.lock").read_bytes()
    assert main(["resume", str(out), "ppo.lr=0.01"]) == 2  # refused before the lock or any file is touched
    assert (out / "scheduler.lock").read_bytes() == lock and load_state(out).to_json() == killed.to_json()
    # The killed run judged with its running skills as far as they got (their experts from the latest
    # checkpoint): read-only, so the lock and state stay as the kill left them.
    running = {r.name for r in killed.by_status("running")}
    assert main(["eval", str(out), "--include-running", "--episodes", "4", "--max-steps", "20"]) == 0
    partial = json.loads((out / "eval" / "achievements.json").read_text())
    assert set(partial["running"]) == running and set(partial["plan"]) <= running | set(done_before)
    assert set(partial["sampled"]["skills"]) == running | set(done_before)
    assert (out / "scheduler.lock").read_bytes() == lock and load_state(out).to_json() == killed.to_json()

    res = subprocess.run(cmd + ["resume", str(out), "--no-progress", "stale_lock_s=600"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    state = load_state(out)
    assert [r.status for r in state.skills] == ["completed"] * 4, res.stdout
    assert all(r.success_rate >= 0.8 for r in state.skills)
    for name, before in done_before.items():  # completed before the kill: never trained again
        after = state.record(name)
        assert (after.attempts, after.total_steps) == (before.attempts, before.total_steps)
        assert len((out / "skills" / after.dirname / "metrics.jsonl").read_text().splitlines()) == rows_before[name]
    spec = json.loads((out / "skills" / state.record("make_wood_pickaxe").dirname / "spec.json").read_text())
    assert spec["plan"] == ["collect_wood", "place_table"]
    assert (out / "skills" / state.record("make_wood_pickaxe").dirname / "expert").is_dir()
    # The run ended with the composed agent played from fresh worlds, routed towards the deepest
    # completed skill (target "all"): every skill's expert in the chain, no restarts, no anchors.
    report = json.loads((out / "eval" / "achievements.json").read_text())
    assert report["plan"] == ["collect_wood", "place_table", "make_wood_pickaxe"] and report["fresh_worlds"]
    assert report["episodes"] == 64 and report["max_steps"] == 100  # TechTree's own episode length
    for mode in ("greedy", "sampled"):
        rates = report[mode]["achievements"]
        # the chain unlocks what each of its skills was trained for, in order (each >= the next)
        assert rates["collect_wood"] >= rates["place_table"] >= rates["make_wood_pickaxe"]
        assert report[mode]["skills"]["make_wood_pickaxe"] == rates["make_wood_pickaxe"]
        assert report[mode]["score_percent_of_max"] == pytest.approx(100 * report[mode]["mean_return"] / 8)
    assert report["sampled"]["achievements"]["make_wood_pickaxe"] >= 0.5, report["sampled"]
    assert (out / "eval" / "achievements.png").stat().st_size > 0 and (out / "eval" / "episode.gif").stat().st_size > 0
    status = subprocess.run(cmd + ["status", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert status.returncode == 0 and "make_wood_pickaxe" in status.stdout and "completed" in status.stdout
    assert "fresh greedy" in status.stdout and "composed agent towards make_wood_pickaxe" in status.stdout
    # `skills eval` towards another target, with other settings
    # (the sizes of the killed run's evaluation above, whose two-skill plan compiled the same program)
    assert main(["eval", str(out), "--episodes", "4", "--target", "place_table", "--max-steps", "20"]) == 0
    again = json.loads((out / "eval" / "achievements.json").read_text())
    assert again["plan"] == ["collect_wood", "place_table"] and again["episodes"] == 4 and again["max_steps"] == 20
    assert main(["eval", str(out), "--episodes", "0"]) == 2
    assert main(["eval", str(out), "--target", "fly"]) == 2
