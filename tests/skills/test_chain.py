"""Chain fine-tuning (skills.chain): the chain's progress reward and routing, and the scheduler's
phase after the skills, through a kill in each of its windows, with the composed agent playing the
tuned experts. The skills themselves come from the fake trainer (real-shaped experts), so only the
chain's PPO program compiles, at a tiny size."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fake_skills_trainer import Crash, ExpertTrainer, RecordingPlanner, config

from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.skills.cli import final_agent_trained, status_table
from jaxrl_hier.skills import state as state_module
from jaxrl_hier.skills.chain import CHAIN_DIR, ChainEnv, ChainParams, chain_target, load_chain
from jaxrl_hier.skills.composed import build_composition, evaluate_run
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.state import SchedulerState, SkillRecord, load_state
from jaxrl_hier.skills.trainer import skill_env_and_policy

TINY = dict(target="make_wood_pickaxe", max_experts=4, updates_per_round=2, chain_timesteps=192, chain_lr=1e-3,
            eval_episodes=0, ppo={"num_envs": 8, "num_steps": 4, "num_minibatches": 2, "update_epochs": 1,
                                  "hidden_size": 8, "num_layers": 1})


def run_chain(out, resume=False, **kw):
    cfg = config(**{**TINY, **kw})
    lib = techtree_library()
    return Scheduler(cfg, out, ExpertTrainer(cfg), RecordingPlanner(lib), lib).run(resume=resume), cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain_reference")
    state, cfg = run_chain(out)
    return out, state, cfg


def tuned(out, plan):
    cfg = config(**TINY)
    env, base_params, policy = skill_env_and_policy(cfg, techtree_library())
    like = policy.expert_zeros(int(np.prod(env.base.observation_space(base_params).shape)))["actor"]
    return load_chain(out, plan, like)


def test_the_chain_trains_with_its_own_lr_and_update_epochs():
    """The chain's PPO: the skills' settings, one seed, at chain_lr, with chain_update_epochs
    (0: the ppo section's epochs) and a budget of chain_timesteps."""
    base = config(**TINY).chain_ppo_config()
    assert (base.num_seeds, base.lr, base.update_epochs, base.total_timesteps) == (1, 1e-3, 1, 192)
    assert (base.num_envs, base.num_steps, base.hidden_size) == (8, 4, 8)
    tuned = config(**{**TINY, "chain_update_epochs": 3}).chain_ppo_config()
    assert tuned.update_epochs == 3 and tuned.lr == 1e-3
    assert config(**TINY).ppo_config().update_epochs == 1  # the skills' own PPO is untouched


def test_progress_reward_routing_and_end_at_the_target():
    cfg = config(**TINY)
    lib = techtree_library()
    env, base_params, policy = skill_env_and_policy(cfg, lib)
    experts = {s: policy.init_expert(jax.random.key(i), 1) for i, s in enumerate(["collect_wood", "place_table"])}
    comp, plan = build_composition(env, lib, experts, "place_table")
    chain = ChainEnv(env)
    params = ChainParams(base_params, comp.plan, comp.needs)
    obs, state = chain.reset(jax.random.key(0), params)
    # A hand-made world: a tree to the right of the player, grass elsewhere.
    grid = jnp.zeros_like(state.base.grid).at[3, 4].set(1)
    state = state.replace(base=state.base.replace(grid=grid, pos=jnp.array([3, 3], jnp.int32)))
    names = env.base.action_names
    rewards, acting, dones = [], [], []
    step = jax.jit(chain.step)
    for action in ("noop", "do", "place_table"):
        obs, state, r, term, trunc, _ = step(jax.random.key(1), state, names.index(action), params)
        rewards.append(float(r)), acting.append(int(obs["expert"])), dones.append(bool(term))
    # wood: +1 and place_table acts; the table: +1, the target holds, the episode ends (collect_wood
    # stops holding when the table spends the wood, but a skill pays once per episode)
    assert rewards == [0.0, 1.0, 1.0] and acting[:2] == [0, 1] and dones == [False, False, True]
    assert plan == ["collect_wood", "place_table"]


def test_the_exit_code_says_whether_the_final_agent_is_trained():
    def state(target_status, chain, manager=None):
        return SchedulerState(target="make_wood_pickaxe", chain=chain, manager=manager or {}, skills=[
            SkillRecord(0, "collect_wood", {}, status="completed"),
            SkillRecord(1, "make_wood_pickaxe", {}, status=target_status)])

    tuned = {"status": "done", "target": "make_wood_pickaxe"}
    assert final_agent_trained(state("completed", {})) and final_agent_trained(state("failed", tuned))
    assert not final_agent_trained(state("failed", {}))
    assert not final_agent_trained(state("failed", {**tuned, "status": "running"}))  # a phase cut short
    assert not final_agent_trained(state("failed", {**tuned, "target": "collect_wood"}))  # tuned towards less
    # the managed agent is the final agent once its stage is done, whatever became of the target skill
    assert final_agent_trained(state("failed", {}, {"status": "done", "steps": 64}))
    assert not final_agent_trained(state("failed", {}, {"status": "running", "steps": 32}))
    assert not final_agent_trained(state("failed", {}, {"status": "skipped", "reason": "none"}))


def test_chain_target_needs_experts_for_the_whole_chain():
    lib = techtree_library()
    have = ["collect_wood", "place_table", "make_wood_pickaxe", "collect_three_wood"]
    assert chain_target(lib, have, "all") == "make_wood_pickaxe"
    assert chain_target(lib, have, "place_table") == "place_table"
    assert chain_target(lib, have, "collect_diamond") == "make_wood_pickaxe"  # the deepest on its way
    assert chain_target(lib, ["collect_wood", "make_wood_pickaxe"], "make_wood_pickaxe") == "collect_wood"


def test_the_phase_runs_after_the_skills_and_eval_plays_its_experts(reference):
    out, state, cfg = reference
    assert [r.status for r in state.skills] == ["completed"] * 3
    chain = state.chain
    assert chain["status"] == "done" and chain["target"] == "make_wood_pickaxe"
    assert chain["plan"] == ["collect_wood", "place_table", "make_wood_pickaxe"]
    per_chunk = 2 * 8 * 4
    assert chain["steps"] == 192 and chain["chunk"] == 192 // per_chunk == 3
    rows = read_jsonl(out / CHAIN_DIR / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3] and [r["env_steps"] for r in rows] == [64, 128, 192]
    # the experts changed from the skills' own (every one of them trained on its own steps)
    before = ExpertTrainer(cfg).load_expert(out / "skills" / state.record("place_table").dirname)["actor"]
    after = tuned(out, chain["plan"])["place_table"]["actor"]
    assert not np.allclose(before[0]["kernel"], after[0]["kernel"])
    report = evaluate_run(out, cfg, techtree_library(), episodes=2, max_steps=5, gif_steps=0)
    assert report["chain"]["steps"] == 192 and report["plan"] == chain["plan"]
    own = evaluate_run(out, cfg, techtree_library(), episodes=2, max_steps=5, gif_steps=0, use_chain=False)
    assert own["chain"] is None and (out / "eval_before_chain" / "achievements.json").is_file()
    assert "chain fine-tuning towards make_wood_pickaxe" in status_table(state, report)


# The phase's two windows: a chunk's checkpoint saved, the state still naming the chunk before; the
# tuned experts saved, the state not yet saying done. (The state file's own window is the scheduler's.)
@pytest.mark.parametrize("point", ["chain.checkpoint_saved:2", "chain.result_saved:1"])
def test_a_kill_in_the_phase_then_resume_gives_the_uninterrupted_result(tmp_path, monkeypatch, reference, point):
    ref_out, ref_state, _ = reference
    name, _, nth = point.partition(":")
    seen = {"n": 0}

    def crash(at):
        if at == name:
            seen["n"] += 1
            if seen["n"] == int(nth):
                raise Crash(at)

    monkeypatch.setattr(state_module, "crash_hook", crash)
    with pytest.raises(Crash):
        run_chain(tmp_path)
    assert load_state(tmp_path).chain.get("status") == "running"  # killed inside the phase
    monkeypatch.setattr(state_module, "crash_hook", lambda at: None)
    state, _ = run_chain(tmp_path, resume=True)
    assert state.chain == ref_state.chain
    rows = [r["update"] for r in read_jsonl(tmp_path / CHAIN_DIR / "metrics.jsonl")]
    assert rows == [1, 2, 3]  # the redone chunk's row once
    got, want = tuned(tmp_path, state.chain["plan"]), tuned(ref_out, state.chain["plan"])
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)  # the same numbers as the run that was never killed


def test_resume_with_a_larger_chain_budget_goes_on_from_the_last_chunk(tmp_path, reference):
    ref_out, ref_state, _ = reference
    out = tmp_path / "run"
    shutil.copytree(ref_out, out)
    state, _ = run_chain(out, resume=True, chain_timesteps=256)
    assert state.chain["status"] == "done" and state.chain["steps"] == 256 and state.chain["chunk"] == 4
    assert [r["update"] for r in read_jsonl(out / CHAIN_DIR / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [r.total_steps for r in state.skills] == [r.total_steps for r in ref_state.skills]  # skills untouched
    got, before = tuned(out, state.chain["plan"]), tuned(ref_out, state.chain["plan"])
    assert not np.allclose(got["collect_wood"]["actor"][0]["kernel"], before["collect_wood"]["actor"][0]["kernel"])
