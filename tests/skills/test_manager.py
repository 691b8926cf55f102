"""The learned manager (skills.manager): option semantics on a hand-made TechTree world, the
semi-MDP return over an option, a tiny manager stage that learns to prefer the rewarding skill,
and the scheduler's manager stage after the skills, through a kill in each of its windows, with
`skills eval` playing the managed agent; a branch of a run trains its stages again to the same
numbers. Bad manager configs and branches exit 2 before anything compiles or is written."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fake_skills_trainer import Crash, ExpertTrainer, RecordingPlanner, config

from jaxrl_hier.algorithms.gae import gae
from jaxrl_hier.config import save_config
from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.skills import branch as branch_module
from jaxrl_hier.skills import state as state_module
from jaxrl_hier.skills.cli import main as skills_main
from jaxrl_hier.skills.cli import status_table
from jaxrl_hier.skills.composed import evaluate_run, read_report, summarize
from jaxrl_hier.skills.config import CONFIG_FILE, saved_config
from jaxrl_hier.skills.library import techtree_library
from jaxrl_hier.skills.manager import (GENERALIST_DIR, MANAGER_DIR, ManagedAgent, ManagerEnv, ManagerParams,
                                       ManagerTrainer, build_options, load_manager, option_bank_names)
from jaxrl_hier.skills.scheduler import Scheduler
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary
from jaxrl_hier.skills.state import LOCK_FILE, load_state
from jaxrl_hier.skills.trainer import skill_env_and_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the benchmark scripts below

PPO = {"num_envs": 8, "num_steps": 4, "num_minibatches": 2, "update_epochs": 1, "hidden_size": 8, "num_layers": 1}
STAGE = dict(target="make_wood_pickaxe", max_experts=4, updates_per_round=2, eval_episodes=0, ppo=PPO,
             manager={"timesteps": 192, "option_steps": 4})


def library_with_idle() -> SkillLibrary:
    """TechTree's library and a root skill no early episode can pass (stone needs a pickaxe)."""
    return SkillLibrary((*techtree_library().skills,
                         Skill("hold_stone", (), (Condition("inventory.stone", ">=", 1.0),))))


def fixed_expert(policy, obs_dim: int, preferred: dict) -> dict:
    """An expert whose action logits ignore the observation: `preferred` action -> logit, -5 elsewhere."""
    actor = jax.tree.map(np.zeros_like, policy.expert_zeros(obs_dim)["actor"])
    logits = np.full(actor[-1]["bias"].shape, -5.0, np.float32)
    for action, value in preferred.items():
        logits[action] = value
    actor[-1]["bias"] = logits
    return {"actor": actor}


def hand_made_world(env, state):
    """A tree right of the player, grass elsewhere."""
    grid = jnp.zeros_like(state.base.grid).at[3, 4].set(1)
    return state.replace(base=state.base.replace(grid=grid, pos=jnp.array([3, 3], jnp.int32)))


def test_an_option_runs_until_its_condition_or_its_cap_and_masks_follow():
    cfg = config(**STAGE)
    lib = library_with_idle()
    skill_env, base_params, _ = skill_env_and_policy(cfg, lib)
    names = ["collect_wood", "place_table", "hold_stone"]
    options = build_options(skill_env, lib, names, option_bank_names(lib, names))
    env = ManagerEnv(skill_env, len(skill_env.base.action_names))
    params = ManagerParams(base_params, options, np.int32(3))
    acts = skill_env.base.action_names
    a = lambda option, action: names.index(option) * env.num_actions + acts.index(action)  # noqa: E731
    # reset and observation jitted: op by op, their many small operations each compiled alone
    obs, state = jax.jit(env.reset)(jax.random.key(0), params)
    state = hand_made_world(env, state)
    obs = jax.jit(env._observe)(None, state.base, state.option, params)
    # between options: every option whose skill does not hold may start; routing: place_table's
    # option acts through collect_wood's expert (bank row 0) while there is no wood
    assert obs["action_mask"].tolist() == [True, True, True] and not obs["running"]
    assert obs["rows"].tolist() == [0, 0, 2]
    step = jax.jit(env.step)
    obs, state, *_ = step(jax.random.key(1), state, a("collect_wood", "noop"), params)
    assert int(state.option) == 0 and int(state.steps) == 1
    assert obs["action_mask"].tolist() == [True, False, False] and obs["running"]  # the running option alone
    obs, state, reward, *_ = step(jax.random.key(2), state, a("collect_wood", "do"), params)
    # wood held: the option ends; collect_wood may no longer start, and place_table now routes to its own expert
    assert float(reward) == 1.0 and int(state.option) == -1 and int(state.steps) == 0
    assert obs["action_mask"].tolist() == [False, True, True] and obs["rows"].tolist() == [0, 1, 2]
    for i in range(3):  # hold_stone cannot pass here: its cap (3 steps) ends it
        assert obs["action_mask"].tolist() == ([False, True, True] if i == 0 else [False, False, True])
        obs, state, *_ = step(jax.random.key(3 + i), state, a("hold_stone", "noop"), params)
    assert int(state.option) == -1 and obs["action_mask"].tolist() == [False, True, True]


def test_restarts_keep_the_first_state_where_the_anchor_held_and_start_episodes_there():
    """With restarts the manager's env keeps the state where `restart_from`'s conditions first held
    in a fresh-world episode; a restart starts there between options, and a restarted episode keeps
    the anchor it came from rather than taking a new one."""
    cfg = config(**STAGE)
    lib = techtree_library()
    skill_env, base_params, _ = skill_env_and_policy(cfg, lib)
    names = ["collect_wood", "place_table"]
    options = build_options(skill_env, lib, names, option_bank_names(lib, names))
    with pytest.raises(SkillError, match="restart_prob"):
        ManagerEnv(skill_env, len(skill_env.base.action_names), restart_prob=1.0)
    env = ManagerEnv(skill_env, len(skill_env.base.action_names), restart_prob=0.999999)
    anchor = jax.tree.map(lambda x: x[0], skill_env.conditions([lib["collect_wood"]]))
    params = ManagerParams(base_params, options, np.int32(3), None, anchor)
    acts = skill_env.base.action_names
    a = lambda option, action: names.index(option) * env.num_actions + acts.index(action)  # noqa: E731
    reset, step, restart = jax.jit(env.reset), jax.jit(env.step), jax.jit(env.restart)
    _, state = reset(jax.random.key(0), params)
    state = hand_made_world(env, state)
    assert not bool(state.passed) and not bool(restart(jax.random.key(1), state, params)[2])  # no anchor yet
    _, state, *_ = step(jax.random.key(1), state, a("place_table", "noop"), params)  # place_table routes to wood
    _, state, *_ = step(jax.random.key(2), state, a("place_table", "do"), params)  # wood: anchor kept
    assert bool(state.has_anchor) and bool(state.passed) and int(state.anchor.timestep) == 2
    assert int(state.option) == 1  # place_table's option runs on
    for i in range(3):  # later steps of the episode do not move the anchor
        _, state, *_ = step(jax.random.key(3 + i), state, a("place_table", "noop"), params)
    assert int(state.anchor.timestep) == 2 and int(state.base.timestep) == 5
    obs, again, valid, want = restart(jax.random.key(6), state, params)
    assert bool(valid) and bool(want) and bool(again.restarted) and int(again.option) == -1
    assert int(again.base.timestep) == 2 and int(again.base.inventory[0]) == 1 and not obs["running"]
    assert obs["action_mask"].tolist() == [False, True]  # wood held: only place_table may start
    # a restarted episode that loses its wood and gets it back keeps the anchor it started from
    lost = again.replace(base=again.base.replace(inventory=again.base.inventory.at[0].set(0)), passed=jnp.bool_(False))
    lost = lost.replace(anchor=lost.anchor.replace(timestep=jnp.int32(7)))
    _, s, *_ = step(jax.random.key(7), lost, a("collect_wood", "do"), params)
    assert int(s.base.inventory[0]) == 1 and int(s.anchor.timestep) == 7
    # a fresh world has no anchor: a restart there is not valid
    assert not bool(restart(jax.random.key(8), reset(jax.random.key(9), params)[1], params)[2])


def test_every_skill_holding_lets_every_option_start():
    cfg = config(**STAGE)
    lib = techtree_library()
    skill_env, base_params, _ = skill_env_and_policy(cfg, lib)
    options = build_options(skill_env, lib, ["collect_wood"], ["collect_wood"])
    env = ManagerEnv(skill_env, len(skill_env.base.action_names))
    params = ManagerParams(base_params, options, np.int32(3))
    _, state = jax.jit(env.reset)(jax.random.key(0), params)
    inventory = state.base.inventory.at[0].set(2)  # wood held: the only option's skill holds
    obs = jax.jit(env._observe)(None, state.base.replace(inventory=inventory), jnp.int32(-1), params)
    assert obs["action_mask"].tolist() == [True]


def test_a_primitive_choice_takes_its_base_action_for_one_step():
    """With `primitives` the manager's choices are the skills, then every base action: a base action
    acts itself (no expert), ends after one step, and its log-probability is the manager's."""
    cfg = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True}})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    names = ["collect_wood", "place_table"]
    bank_names = option_bank_names(lib, names)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {s: fixed_expert(policy, obs_dim, {0: 5.0}) for s in bank_names}  # the experts would noop
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names)
    env, acts = trainer.env, skill_env.base.action_names
    assert trainer.env.action_space(trainer.params).n == (2 + len(acts)) * len(acts)
    # reset and observation jitted: op by op, their many small operations each compiled alone
    obs, state = jax.jit(env.reset)(jax.random.key(0), trainer.params)
    state = hand_made_world(env, state)  # the observation stays the reset's: the manager below ignores it
    obs = jax.jit(env._observe)(obs["obs"], state.base, state.option, trainer.params)
    assert obs["action_mask"].tolist() == [True] * (2 + len(acts)) and obs["rows"].shape == (2 + len(acts),)
    do = 2 + acts.index("do")  # the manager's own "do" next to the tree
    batch = jax.tree.map(lambda x: x[None], obs)
    params = jax.jit(trainer.policy.init)(jax.random.key(1), batch)["params"]
    last = params["actor"][-1]
    last["kernel"], last["bias"] = jnp.zeros_like(last["kernel"]), jnp.full_like(last["bias"], -50.0).at[do].set(50.0)
    agent = ManagedAgent(trainer)
    managed = agent.managed(trainer, params, skill_env.conditions([lib["collect_wood"]]))

    @jax.jit  # one program: op by op, the policy's many small operations each compiled alone
    def act(managed, batch, key):
        pi, _ = trainer.policy.apply(managed.variables, batch)
        action, label = agent.actions(managed, batch, key, False)
        return action, label, pi.log_prob(action), jax.nn.log_softmax(pi.logits)

    action, label, log_prob, manager_log_probs = act(managed, batch, jax.random.key(2))
    assert int(action[0]) == do * len(acts) + acts.index("do")  # not the experts' noop
    assert agent.labels[int(label[0])] == "manager (base action)"
    assert float(log_prob[0]) == pytest.approx(float(manager_log_probs[0, do]))
    obs, state, reward, *_ = jax.jit(env.step)(jax.random.key(3), state, action[0], trainer.params)
    assert float(reward) == 1.0 and int(state.option) == -1 and not obs["running"]  # one step, then a decision
    assert obs["action_mask"].tolist() == [False, True] + [True] * len(acts)  # wood held


def test_feature_inputs_say_which_library_skills_do_not_hold_yet_and_widen_the_network():
    """`manager.features`: one input per named skill, set while its conditions do not hold, whether
    or not the manager may choose that skill; the networks read them after the choices."""
    features = ["collect_wood", "make_wood_pickaxe"]
    cfg = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True, "features": features}})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {"collect_wood": fixed_expert(policy, obs_dim, {skill_env.base.action_names.index("do"): 5.0})}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood"])
    assert trainer.features == features
    obs, state = jax.jit(trainer.env.reset)(jax.random.key(0), trainer.params)
    state = hand_made_world(trainer.env, state)
    obs = jax.jit(trainer.env._observe)(obs["obs"], state.base, state.option, trainer.params)
    assert obs["features"].tolist() == [True, True]
    obs, state, reward, *_ = jax.jit(trainer.env.step)(jax.random.key(1), state, jnp.int32(
        skill_env.base.action_names.index("do")), trainer.params)  # option 0 (collect_wood), its expert's "do"
    assert float(reward) == 1.0 and obs["features"].tolist() == [False, True]
    variables = jax.jit(trainer.policy.init)(jax.random.key(2), jax.tree.map(lambda x: x[None], obs))
    choices = 1 + len(skill_env.base.action_names)
    assert variables["params"]["actor"][0]["kernel"].shape[0] == obs_dim + choices + 1 + len(features)
    # "all" reads every skill of the library
    cfg_all = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True, "features": "all"}})
    assert ManagerTrainer(cfg_all, skill_env, base_params, lib, experts, ["collect_wood"]).features == list(lib.names)


def test_a_closed_manager_takes_base_actions_only_and_sees_the_open_choices():
    """The generalist stage: with the skills closed no skill may be chosen and no expert runs, while
    the network's inputs (`choices`) are what the open manager would see, so the manager stage that
    starts from the generalist's parameters sees the same inputs."""
    cfg = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True}})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    names = ["collect_wood", "place_table"]
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {s: fixed_expert(policy, obs_dim, {0: 5.0}) for s in option_bank_names(lib, names)}
    closed = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names, closed=True)
    acts = skill_env.base.action_names
    obs, _ = jax.jit(closed.env.reset)(jax.random.key(0), closed.params)
    assert obs["action_mask"].tolist() == [False, False] + [True] * len(acts)
    assert obs["choices"].tolist() == [True] * (2 + len(acts))
    batch = jax.tree.map(lambda x: x[None].repeat(64, 0), obs)

    @jax.jit
    def sample(variables, key):
        pi, _ = closed.policy.apply(variables, batch)
        return pi.sample(seed=key)

    variables = jax.jit(closed.policy.init)(jax.random.key(1), batch)
    action = sample(variables, jax.random.key(2))
    choice, base = action // len(acts), action % len(acts)
    assert bool((choice >= 2).all()) and bool((base == choice - 2).all()) and len(set(base.tolist())) > 1
    # the manager starts from the generalist's parameters (and a fresh optimiser)
    start = jax.tree.map(lambda x: np.asarray(x) + 1.0, variables["params"])
    opened = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names, start=start)
    runner = jax.jit(opened.init)(jax.random.key(3))
    for a, b in zip(jax.tree.leaves(runner.train_state.params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(a)[0], b)
    with pytest.raises(SkillError, match="needs its base actions"):
        ManagerEnv(skill_env, len(acts), primitives=False, closed=True)
    # a generalist sure of one base action leaves the untrained skills almost no probability; a
    # skill prior of 0.3 gives them about that share of the first choices, and changes nothing else
    sure = jax.tree.map(np.asarray, variables["params"])
    sure["actor"][-1]["bias"] = np.where(np.arange(2 + len(acts)) == 2, 8.0, 0.0).astype(np.float32)
    shares = {}
    for prior in (0.0, 0.3):
        cfg_p = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True, "generalist_timesteps": 64,
                                                "skill_prior": prior}})
        trainer = ManagerTrainer(cfg_p, skill_env, base_params, lib, experts, names, start=sure)
        runner = jax.jit(trainer.init)(jax.random.key(3))
        params = jax.tree.map(lambda x: x[0], runner.train_state.params)
        first = jax.tree.map(lambda x: x[0, 0], runner.obs)
        probs = jax.nn.softmax(trainer.policy.apply({"params": params, **variables_of(runner)}, first)[0].logits)
        shares[prior] = float(probs[:, :2].sum(-1).mean())
        kept = [np.array_equal(np.asarray(a)[0], b) for a, b in zip(jax.tree.leaves(runner.train_state.params),
                                                                     jax.tree.leaves(sure))]
        assert sum(kept) == len(kept) - (prior > 0)  # the prior touches the actor's last bias alone
    assert shares[0.0] < 0.01 and shares[0.3] == pytest.approx(0.3, abs=0.02)


def test_a_manager_started_from_the_generalist_compiles_its_chunk_once():
    """The scheduler starts the manager stage from the generalist's saved (host) parameters; they are
    laid out as PPO.init lays out the rest, so the second chunk reuses the first chunk's program."""
    cfg = config(**{**STAGE, "manager": {**STAGE["manager"], "primitives": True, "generalist_timesteps": 64}})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    names = ["collect_wood"]
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {s: fixed_expert(policy, obs_dim, {0: 5.0}) for s in option_bank_names(lib, names)}
    fresh = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names)
    start = fresh.params_like()["manager"]
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names, start=start)
    runner = trainer.init(jax.random.key(0))  # not jitted, as the scheduler calls it
    for _ in range(2):
        runner, _, _ = trainer.train(runner)
    assert trainer.ppo._compiled[cfg.updates_per_round]._cache_size() == 1


def test_generalist_training_restarts_finished_episodes_from_anchors():
    """In the generalist stage's own program, finished episodes start again from the state where the
    anchor first held (here: step 3 of an 8-step episode)."""
    cfg = config(**{**STAGE, "env_params": {"max_steps": 8},
                    "manager": {**STAGE["manager"], "primitives": True, "generalist_timesteps": 64,
                                "restart_prob": 0.999999, "restart_from": "past_step_3"}})
    lib = SkillLibrary((*techtree_library().skills, Skill("past_step_3", (), (Condition("timestep", ">=", 3.0),))))
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    names = ["collect_wood"]
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {s: fixed_expert(policy, obs_dim, {0: 5.0}) for s in option_bank_names(lib, names)}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names, closed=True)
    runner, _, _ = trainer.train(trainer.init(jax.random.key(0)))  # 2 updates of 4 steps: each env ends once
    envs = jax.tree.map(lambda x: np.asarray(x[0]), runner.env_state.env_state)
    assert envs.restarted.all() and envs.has_anchor.all()
    assert (envs.anchor.timestep == 3).all() and (envs.base.timestep == 3).all()  # ended at 8, back at 3


def variables_of(runner) -> dict:
    """The frozen collections (the expert bank) of a one-seed runner."""
    return jax.tree.map(lambda x: x[0], runner.extra_variables)


def test_forced_steps_carry_no_gradient_and_a_decision_gets_the_option_return_discounted_over_its_length():
    """Inside an option the mask holds one option: log-prob and entropy 0, no policy gradient.
    With GAE's lambda = 1 the decision's target is the option's rewards discounted step by step
    plus gamma^k times the value where the next decision falls: the semi-MDP return."""
    cfg = config(**STAGE)
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    names = ["collect_wood", "place_table"]
    bank_names = option_bank_names(lib, names)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    experts = {s: fixed_expert(policy, obs_dim, {0: 0.0}) for s in bank_names}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, names)
    obs = jax.tree.map(lambda x: x[None], trainer.env.reset(jax.random.key(1), trainer.params)[0])
    variables = trainer.policy.init(jax.random.key(0), obs)
    forced = {**obs, "action_mask": jnp.array([[False, True]]), "choices": jnp.array([[False, True]]),
              "running": jnp.array([True])}

    def logp(params, o):
        pi, _ = trainer.policy.apply({**variables, "params": params}, o)
        return pi.log_prob(jnp.array([1 * trainer.env.num_actions + 3]))[0], pi.entropy()[0]

    lp, ent = logp(variables["params"], forced)
    grad = jax.grad(lambda p: logp(p, forced)[0])(variables["params"])
    assert float(lp) == 0.0 and float(ent) == 0.0
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grad["actor"]))
    free_grad = jax.grad(lambda p: logp(p, obs)[0])(variables["params"])
    assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(free_grad["actor"]))

    gamma, k = 0.9, 4  # one option of 4 steps, then the next decision with value 2.0
    rewards = jnp.array([0.0, 1.0, 0.0, 0.5])
    values = jnp.array([0.3, -7.0, 11.0, 0.2])  # what the critic says inside the option does not matter at lambda 1
    zeros = jnp.zeros(k, bool)
    adv, targets = gae(rewards, values, zeros, zeros, jnp.zeros(k), jnp.float32(2.0), gamma, 1.0)
    smdp = sum(gamma ** i * float(r) for i, r in enumerate(rewards)) + gamma ** k * 2.0
    assert float(targets[0]) == pytest.approx(smdp, rel=1e-6)


def test_a_tiny_manager_learns_to_prefer_the_rewarding_skill():
    """Two options from the first step of a TechTree episode: collect_wood, whose expert walks and
    hits (wood: +1), and hold_stone, whose expert stands still (nothing, until its cap). The
    manager starts indifferent and learns to choose collect_wood."""
    lib = library_with_idle()
    cfg = config(target="collect_wood", max_experts=4, updates_per_round=4,
                 manager={"timesteps": 20480, "option_steps": 8, "lr": 3e-3, "skills": ["collect_wood", "hold_stone"]},
                 ppo={**PPO, "num_envs": 32, "num_steps": 8, "update_epochs": 2, "hidden_size": 16})
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    acts = skill_env.base.action_names
    walk_and_hit = {acts.index(a): 0.0 for a in ("up", "down", "left", "right", "do")}
    experts = {"collect_wood": fixed_expert(policy, obs_dim, walk_and_hit),
               "hold_stone": fixed_expert(policy, obs_dim, {acts.index("noop"): 5.0})}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood", "hold_stone"])
    first = jax.vmap(lambda k: trainer.env.reset(k, trainer.params)[0])(jax.random.split(jax.random.key(5), 64))

    def p_wood(runner) -> float:
        params = jax.tree.map(lambda x: x[0], runner.train_state.params)
        extra = jax.tree.map(lambda x: x[0], runner.extra_variables)
        return float(jax.nn.softmax(trainer.ppo.apply(params, extra, first)[0].logits)[:, 0].mean())

    runner = trainer.init(jax.random.key(0))
    assert p_wood(runner) == pytest.approx(0.5, abs=0.01)
    for _ in range(cfg.manager.timesteps // trainer.steps_per_chunk):
        runner, _, _ = trainer.train(runner)
    assert p_wood(runner) > 0.9
    # played from fresh worlds (sampled: the walking expert's greedy action is one direction only), it
    # collects wood in most episodes
    agent = ManagedAgent(trainer)
    managed = agent.managed(trainer, trainer.result(runner)["manager"], skill_env.conditions([lib["collect_wood"]]))
    stats = agent.evaluate(managed, jax.random.key(1), 16, 60, False)
    assert stats.held[:, 0].mean() >= 0.75
    # every played step is counted once, under the option whose expert acted: each option routes to
    # its own expert here (no dependencies), and the manager has no base actions of its own
    np.testing.assert_array_equal(stats.acting.sum(axis=1), stats.length)
    acting = summarize(stats, skill_env.base.achievement_names, skill_env.base.achievement_rewards, [],
                       agent.labels)["acting"]
    assert set(acting) <= {"collect_wood (collect_wood)", "hold_stone (hold_stone)"}
    assert acting["collect_wood (collect_wood)"] > 0


def test_tuned_experts_price_the_acting_experts_action_and_their_kl_to_their_frozen_selves():
    """With `tune_experts` an action's log-prob is the manager's of its choice plus, where a skill
    acts, its expert's of the base action; the penalty is `expert_kl` times that expert's KL to its
    frozen self: 0 as the stage starts (the tuned bank is a copy), positive once it has moved."""
    lib = library_with_idle()
    cfg = config(target="collect_wood", max_experts=4, ppo=PPO,
                 manager={"timesteps": 64, "option_steps": 4, "skills": ["collect_wood", "hold_stone"],
                          "primitives": True, "tune_experts": True, "expert_kl": 0.5})
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    acts = skill_env.base.action_names
    experts = {"collect_wood": fixed_expert(policy, obs_dim, {acts.index("do"): 1.0}),
               "hold_stone": fixed_expert(policy, obs_dim, {acts.index("noop"): 2.0})}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood", "hold_stone"])
    runner = trainer.init(jax.random.key(0))
    params = jax.tree.map(lambda x: x[0], runner.train_state.params)
    extra = jax.tree.map(lambda x: x[0], runner.extra_variables)
    for a, b in zip(jax.tree.leaves(params["experts"]), jax.tree.leaves(extra["experts"]["actor"])):
        np.testing.assert_array_equal(a, b)
    obs = jax.vmap(lambda k: trainer.env.reset(k, trainer.params)[0])(jax.random.split(jax.random.key(1), 3))
    A = trainer.env.num_actions
    # choices: skill 0 with base action "do", skill 1 with "up", the manager's own base action "left"
    action = jnp.array([0 * A + acts.index("do"), 1 * A + acts.index("up"), (2 + acts.index("left")) * A
                        + acts.index("left")])

    def priced(params):
        pi, _ = trainer.ppo.apply(params, extra, obs)
        return pi.manager.log_prob(action // A), *pi.log_prob_and_penalty(action)

    manager, log_prob, penalty = priced(params)
    expert = jnp.stack([jax.nn.log_softmax(jnp.array([1.0 if i == acts.index("do") else -5.0 for i in range(A)]))[
        acts.index("do")], jax.nn.log_softmax(jnp.array([2.0 if i == acts.index("noop") else -5.0
                                                         for i in range(A)]))[acts.index("up")], 0.0])
    np.testing.assert_allclose(log_prob, manager + expert, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(penalty, 0.0, atol=1e-6)
    moved = {**params, "experts": [*params["experts"][:-1], {**params["experts"][-1],
                                                              "bias": params["experts"][-1]["bias"].at[0, 0].add(3.0)}]}
    _, _, penalty = priced(moved)
    p = jax.nn.softmax(moved["experts"][-1]["bias"][0])
    kl = (p * (jnp.log(p) - jax.nn.log_softmax(params["experts"][-1]["bias"][0]))).sum()
    np.testing.assert_allclose(penalty, [0.5 * kl, 0.0, 0.0], rtol=1e-4, atol=1e-6)


def test_a_kickstarted_generalist_pays_its_teachers_kl_where_the_target_is_pending_and_the_weight_falls_to_0():
    """`manager.kickstart`: the generalist stage's penalty is the weight times the KL from the routed
    expert of the target's option (here collect_wood, whose expert prefers "do") to the generalist's
    base-action policy, on the steps where the target does not hold yet, 0 where it holds; the
    weight starts at `kickstart` and falls linearly to 0 over the generalist's env steps."""
    manager = {**STAGE["manager"], "skills": ["collect_wood"], "primitives": True, "generalist_timesteps": 256,
               "kickstart": 0.5}
    cfg = config(**{**STAGE, "target": "collect_wood", "manager": manager})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    acts = skill_env.base.action_names
    teacher_logits = np.array([3.0 if a == "do" else -5.0 for a in acts], np.float32)
    experts = {"collect_wood": fixed_expert(policy, obs_dim, {acts.index("do"): 3.0})}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood"], closed=True)
    runner = trainer.init(jax.random.key(0))
    assert trainer.kickstart_weight(runner) == 0.5
    obs = jax.vmap(lambda k: trainer.env.reset(k, trainer.params)[0])(jax.random.split(jax.random.key(1), 2))
    obs = {**obs, "teaching": obs["teaching"].at[1].set(False)}  # the second step: the target holds
    params = jax.tree.map(lambda x: x[0], runner.train_state.params)
    extra = {**variables_of(runner), "kickstart": {"weight": jnp.float32(0.5)}}
    action = jnp.array([(1 + acts.index("noop")) * len(acts) + acts.index("noop")] * 2)
    pi, _ = trainer.ppo.apply(params, extra, obs)
    log_prob, penalty = pi.log_prob_and_penalty(action)
    student = jax.nn.log_softmax(pi.logits[:, 1:], axis=-1)
    teacher = jax.nn.log_softmax(teacher_logits)
    kl = (jnp.exp(teacher) * (teacher - student[0])).sum()
    np.testing.assert_allclose(penalty, [0.5 * kl, 0.0], rtol=1e-5)
    np.testing.assert_allclose(log_prob, pi.manager.log_prob(action // len(acts)), rtol=1e-6)
    # the rollout stores the teacher's logits with each step (`loss_inputs`), and the loss reads those
    stored = trainer.policy.loss_inputs(extra, obs)
    np.testing.assert_allclose(stored["teacher_logits"][0], teacher_logits, rtol=1e-6)
    pi, _ = trainer.ppo.apply(params, extra, stored)
    np.testing.assert_allclose(pi.log_prob_and_penalty(action)[1], [0.5 * kl, 0.0], rtol=1e-5)
    pi, _ = trainer.ppo.apply(params, extra, {**stored, "teacher_logits": jnp.zeros_like(stored["teacher_logits"])})
    uniform = jnp.full(len(acts), -np.log(len(acts)))
    np.testing.assert_allclose(pi.log_prob_and_penalty(action)[1][0],
                               0.5 * (jnp.exp(uniform) * (uniform - student[0])).sum(), rtol=1e-5)
    # at weight 0 the teacher's expert runs on no row (its logits 0) and the penalty is 0
    unpriced = trainer.policy.loss_inputs({**extra, "kickstart": {"weight": jnp.float32(0.0)}}, obs)
    assert not np.asarray(unpriced["teacher_logits"]).any()
    # the weight the chunks train with: 0.5, 0.375, 0.25 (256 env steps, 64 a chunk), then 0.125
    weights = []
    for _ in range(3):
        runner, _, _ = trainer.train(runner)
        weights.append(float(runner.extra_variables["kickstart"]["weight"][0]))
    assert weights == [0.5, 0.375, 0.25] and trainer.kickstart_weight(runner) == 0.125
    # `kickstart_timesteps`: the weight falls to 0 over its env steps (128 of the 256), then stays there
    short = config(**{**STAGE, "target": "collect_wood", "manager": {**manager, "kickstart_timesteps": 128}})
    short = ManagerTrainer(short, skill_env, base_params, lib, experts, ["collect_wood"], closed=True)
    assert short.kickstart_weight(runner) == 0.0  # 192 env steps done
    assert short.kickstart_weight(runner.replace(update=runner.update // 3)) == 0.25  # 64 done
    assert trainer.ppo._compiled[cfg.updates_per_round]._cache_size() == 1  # a new weight compiles nothing
    # the manager stage after it has no teacher
    assert ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood"]).kickstart == 0.0
    # a target whose skill failed: the deepest option towards it teaches, as the composed agent routes
    failed = config(**{**STAGE, "target": "place_table", "manager": manager})
    assert ManagerTrainer(failed, skill_env, base_params, lib, experts, ["collect_wood"], closed=True).teacher \
        == "collect_wood"
    # `kickstart_from: attempted`: the failed target's kept expert teaches though it is no option; it
    # joins the bank after the options' experts, and its chain routes as the composed agent's would
    attempted = config(**{**STAGE, "target": "place_table", "manager": {**manager, "kickstart_from": "attempted"}})
    kept_logits = np.array([3.0 if a == "noop" else -5.0 for a in acts], np.float32)
    kept = {**experts, "place_table": fixed_expert(policy, obs_dim, {acts.index("noop"): 3.0})}
    taught = ManagerTrainer(attempted, skill_env, base_params, lib, kept, ["collect_wood"], closed=True)
    assert taught.teacher == "place_table" and taught.bank_names == ["collect_wood", "place_table"]
    assert taught.env.num_choices(taught.params) == trainer.env.num_choices(trainer.params)  # the same outputs
    obs = jax.vmap(lambda k: taught.env.reset(k, taught.params)[0])(jax.random.split(jax.random.key(1), 2))
    assert obs["teacher_row"].tolist() == [0, 0] and obs["teaching"].all()  # no wood yet: its dependency
    obs = {**obs, "teacher_row": jnp.array([0, 1])}  # the second: wood in hand, the table's own expert
    runner = taught.init(jax.random.key(0))
    pi, _ = taught.ppo.apply(jax.tree.map(lambda x: x[0], runner.train_state.params),
                             {**variables_of(runner), "kickstart": {"weight": jnp.float32(0.5)}}, obs)
    student = jax.nn.log_softmax(pi.logits[:, 1:], axis=-1)
    kls = [(jnp.exp(t) * (t - s)).sum() for t, s in zip(map(jax.nn.log_softmax, (teacher_logits, kept_logits)), student)]
    np.testing.assert_allclose(pi.log_prob_and_penalty(action)[1], 0.5 * jnp.stack(kls), rtol=1e-5)


def test_kickstart_when_silences_the_teacher_where_its_conditions_fail():
    """`manager.kickstart_when`: the teacher teaches where its target is still to do and every one of
    these conditions holds (here `timestep >= 1`: not in a fresh world, from its first step on)."""
    manager = {**STAGE["manager"], "skills": ["collect_wood"], "primitives": True, "generalist_timesteps": 256,
               "kickstart": 0.5, "kickstart_when": ["timestep >= 1"]}
    cfg = config(**{**STAGE, "target": "collect_wood", "manager": manager})
    lib = techtree_library()
    skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
    obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
    acts = skill_env.base.action_names
    experts = {"collect_wood": fixed_expert(policy, obs_dim, {acts.index("do"): 3.0})}
    trainer = ManagerTrainer(cfg, skill_env, base_params, lib, experts, ["collect_wood"], closed=True)
    keys = jax.random.split(jax.random.key(1), 4)
    params = jax.tree.map(jnp.asarray, trainer.params)
    obs, state = jax.vmap(lambda k: trainer.env.reset(k, params))(keys)
    assert not obs["teaching"].any()  # timestep 0
    noop = jnp.full(4, (1 + acts.index("noop")) * len(acts) + acts.index("noop"))
    obs, *_ = jax.vmap(trainer.env.step, in_axes=(0, 0, 0, None))(keys, state, noop, params)
    assert obs["teaching"].all()  # no wood yet, and one step taken
    untimed = ManagerTrainer(config(**{**STAGE, "target": "collect_wood", "manager": {**manager, "kickstart_when": []}}),
                             skill_env, base_params, lib, experts, ["collect_wood"], closed=True)
    assert untimed.params.teach_when is None
    assert jax.vmap(lambda k: untimed.env.reset(k, untimed.params)[0])(keys)["teaching"].all()


def test_a_failed_targets_kept_expert_teaches_the_generalist_of_a_run(tmp_path):
    """In a run whose target's skill fails, `kickstart_from: attempted` makes its last attempt's expert
    the teacher (recorded in the state and shown by `skills status`); the manager's options stay the
    completed skills."""
    cfg = config(**{**STAGE, "max_retries": 0,
                    "manager": {**GENERALIST, "generalist_timesteps": 64, "kickstart": 0.5, "kickstart_from": "attempted"}})
    lib = techtree_library()
    state = Scheduler(cfg, tmp_path, ExpertTrainer(cfg, never=("make_wood_pickaxe",)), RecordingPlanner(lib), lib).run()
    assert {r.name: r.status for r in state.skills}["make_wood_pickaxe"] == "failed"
    assert state.generalist["teacher"] == "make_wood_pickaxe" and state.generalist["status"] == "done"
    assert state.manager["skills"] == ["collect_wood", "place_table"] and state.manager["status"] == "done"
    assert "taught by make_wood_pickaxe's chain" in status_table(state)


def test_tuned_experts_learn_from_the_base_reward_where_the_manager_calls_them():
    """One option whose expert starts near uniform; tuned on the base reward (wood pays), the managed
    agent collects wood within 10 steps of a fresh world more often than with the expert as it was,
    and a heavy KL weight keeps the tuned expert's actions near its frozen self's."""
    lib = library_with_idle()

    def tuned(expert_kl):
        cfg = config(target="collect_wood", max_experts=4, updates_per_round=4,
                     ppo={**PPO, "num_envs": 32, "num_steps": 8, "update_epochs": 2, "hidden_size": 16},
                     manager={"timesteps": 10240, "option_steps": 8, "lr": 3e-3, "skills": ["hold_stone"],
                              "tune_experts": True, "expert_kl": expert_kl})
        skill_env, base_params, policy = skill_env_and_policy(cfg, lib)
        obs_dim = int(np.prod(skill_env.base.observation_space(base_params).shape))
        expert = {"actor": policy.init_expert(jax.random.key(3), obs_dim)["actor"]}
        trainer = ManagerTrainer(cfg, skill_env, base_params, lib, {"hold_stone": expert}, ["hold_stone"])
        runner = trainer.init(jax.random.key(0))
        for _ in range(cfg.manager.timesteps // trainer.steps_per_chunk):
            runner, metrics, _ = trainer.train(runner)
        return trainer, trainer.result(runner)["manager"], metrics

    def wood(trainer, params) -> float:
        agent = ManagedAgent(trainer)
        managed = agent.managed(trainer, params, trainer.env.skill_env.conditions([lib["collect_wood"]]))
        return float(agent.evaluate(managed, jax.random.key(1), 256, 10, False).held[:, 0].mean())

    trainer, params, metrics = tuned(0.0)
    frozen = {**params, "experts": jax.tree.map(np.asarray, trainer.policy.bank)}
    assert wood(trainer, params) > wood(trainer, frozen) + 0.08  # 0.37 against 0.22 when written
    assert metrics["penalty"] == 0.0

    first = jax.vmap(lambda k: trainer.env.reset(k, trainer.params)[0])(jax.random.split(jax.random.key(7), 256))
    extra = jax.tree.map(lambda x: x[0], trainer.init(jax.random.key(0)).extra_variables)

    def kl(params) -> float:  # the tuned expert's mean KL to its frozen self over fresh states
        pi, _ = trainer.ppo.apply(params, extra, first)
        return float(pi.kl(jnp.zeros(256, jnp.int32)).mean())  # choice 0, the skill, on every row

    assert kl(tuned(10.0)[1]) < 0.1 * kl(params)  # 0.0006 against 0.76 when written


# ---------------------------------------------------------------------------- the stage in a run
def run_managed(out, resume=False, **kw):
    cfg = config(**{**STAGE, **kw})
    lib = techtree_library()
    return Scheduler(cfg, out, ExpertTrainer(cfg), RecordingPlanner(lib), lib).run(resume=resume), cfg


def manager_params(out, cfg, dirname=MANAGER_DIR):
    lib = techtree_library()
    state = load_state(out)
    env, base_params, policy = skill_env_and_policy(cfg, lib)
    trainer = ExpertTrainer(cfg)
    experts = {r.name: trainer.load_expert(out / "skills" / r.dirname) for r in state.by_status("completed")}
    manager = ManagerTrainer(cfg, env, base_params, lib, experts, state.manager["skills"])
    like = manager.generalist_like() if dirname == GENERALIST_DIR else manager.params_like()
    return load_manager(out, like, dirname)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("manager_reference")
    state, cfg = run_managed(out)
    return out, state, cfg


def test_the_manager_stage_runs_after_the_skills_and_eval_plays_it(reference):
    out, state, cfg = reference
    assert [r.status for r in state.skills] == ["completed"] * 3
    assert state.manager["status"] == "done" and state.manager["skills"] == ["collect_wood", "place_table",
                                                                            "make_wood_pickaxe"]
    assert state.manager["steps"] == 192 and state.manager["chunk"] == 3
    rows = read_jsonl(out / MANAGER_DIR / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3] and [r["env_steps"] for r in rows] == [64, 128, 192]
    report = evaluate_run(out, cfg, techtree_library(), episodes=2, max_steps=5, gif_steps=3)
    assert report["manager"] == {"skills": state.manager["skills"], "steps": 192, "primitives": False}
    assert report["target"] is None
    assert read_report(out)["manager"]["steps"] == 192 and (out / "eval" / "episode.gif").is_file()
    assert sum(report["sampled"]["acting"].values()) == pytest.approx(1.0)
    composed = evaluate_run(out, cfg, techtree_library(), episodes=2, max_steps=5, gif_steps=0, use_manager=False)
    assert composed["manager"] is None and (out / "eval_composed" / "achievements.json").is_file()
    assert "manager over 3 skills" in status_table(state, report)


@pytest.mark.parametrize("point", ["manager.checkpoint_saved:2", "manager.result_saved:1"])
def test_a_kill_in_the_manager_stage_then_resume_gives_the_uninterrupted_result(tmp_path, monkeypatch, reference,
                                                                                point):
    ref_out, ref_state, cfg = reference
    name, _, nth = point.partition(":")
    seen = {"n": 0}

    def crash(at):
        if at == name:
            seen["n"] += 1
            if seen["n"] == int(nth):
                raise Crash(at)

    monkeypatch.setattr(state_module, "crash_hook", crash)
    with pytest.raises(Crash):
        run_managed(tmp_path)
    assert load_state(tmp_path).manager.get("status") == "running"
    monkeypatch.setattr(state_module, "crash_hook", lambda at: None)
    state, _ = run_managed(tmp_path, resume=True)
    assert state.manager == ref_state.manager
    assert [r["update"] for r in read_jsonl(tmp_path / MANAGER_DIR / "metrics.jsonl")] == [1, 2, 3]
    for a, b in zip(jax.tree.leaves(manager_params(tmp_path, cfg)), jax.tree.leaves(manager_params(ref_out, cfg))):
        np.testing.assert_array_equal(a, b)  # the same numbers as the run that was never killed


GENERALIST = {**STAGE["manager"], "primitives": True, "generalist_timesteps": 128, "anneal_lr": True}


def test_an_annealed_manager_anneals_over_its_own_steps_and_the_generalist_keeps_a_constant_rate():
    cfg = config(**{**STAGE, "manager": GENERALIST})
    manager, generalist = cfg.manager_ppo_config(), cfg.manager_ppo_config(closed=True)
    assert manager.anneal_lr and manager.total_timesteps == 192 and manager.lr == generalist.lr
    assert not generalist.anneal_lr
    assert not config(**STAGE).manager_ppo_config().anneal_lr  # constant unless asked


def test_tuned_experts_start_from_the_skills_after_the_generalist_and_a_kill_resumes_to_the_same_numbers(
        tmp_path, monkeypatch):
    tuned = {**GENERALIST, "tune_experts": True}
    state, cfg = run_managed(tmp_path / "ref", manager=tuned)
    assert state.manager["status"] == "done" and state.generalist["status"] == "done"
    params = manager_params(tmp_path / "ref", cfg)["manager"]
    generalist = manager_params(tmp_path / "ref", cfg, GENERALIST_DIR)["manager"]
    assert "experts" in params and "experts" not in generalist
    lib = techtree_library()
    env, base_params, _ = skill_env_and_policy(cfg, lib)
    trainer = ExpertTrainer(cfg)
    experts = {r.name: trainer.load_expert(tmp_path / "ref" / "skills" / r.dirname) for r in state.skills}
    frozen = ManagerTrainer(cfg, env, base_params, lib, experts, state.manager["skills"]).policy.bank
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params["experts"]), jax.tree.leaves(frozen)))
    report = evaluate_run(tmp_path / "ref", cfg, lib, episodes=2, max_steps=5, gif_steps=0)
    assert sum(report["sampled"]["acting"].values()) == pytest.approx(1.0)

    def crash(at):
        if at == "manager.checkpoint_saved" and load_state(tmp_path / "killed").manager["chunk"] == 1:
            raise Crash(at)

    monkeypatch.setattr(state_module, "crash_hook", crash)
    with pytest.raises(Crash):
        run_managed(tmp_path / "killed", manager=tuned)
    monkeypatch.setattr(state_module, "crash_hook", lambda at: None)
    run_managed(tmp_path / "killed", resume=True, manager=tuned)
    for a, b in zip(jax.tree.leaves(manager_params(tmp_path / "killed", cfg)), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def generalist_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("generalist_reference")
    state, cfg = run_managed(out, manager=GENERALIST)
    return out, state, cfg


def test_the_generalist_stage_runs_before_the_manager_which_starts_from_it(generalist_reference):
    out, state, cfg = generalist_reference
    assert state.generalist == {"status": "done", "steps": 128, "chunk": 2}
    assert state.manager["status"] == "done" and state.manager["steps"] == 192
    rows = read_jsonl(out / GENERALIST_DIR / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [64, 128]
    # the generalist's parameters are saved apart from the manager's, and the manager moved on from them
    generalist, manager = manager_params(out, cfg, GENERALIST_DIR), manager_params(out, cfg)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(generalist), jax.tree.leaves(manager)))
    assert "generalist (the manager with its skills closed): done, 128 env steps" in status_table(state)


def test_a_kill_between_the_generalist_and_the_manager_then_resume_gives_the_uninterrupted_result(
        tmp_path, monkeypatch, generalist_reference):
    ref_out, ref_state, cfg = generalist_reference

    def crash(at):
        if at == "generalist.result_saved":
            raise Crash(at)

    monkeypatch.setattr(state_module, "crash_hook", crash)
    with pytest.raises(Crash):
        run_managed(tmp_path, manager=GENERALIST)
    killed = load_state(tmp_path)
    assert killed.generalist["status"] == "running" and killed.manager["steps"] == 0
    monkeypatch.setattr(state_module, "crash_hook", lambda at: None)
    state, _ = run_managed(tmp_path, resume=True, manager=GENERALIST)
    assert state.generalist == ref_state.generalist and state.manager == ref_state.manager
    for a, b in zip(jax.tree.leaves(manager_params(tmp_path, cfg)), jax.tree.leaves(manager_params(ref_out, cfg))):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------- branches
def source_run(reference, tmp_path) -> Path:
    """A copy of a finished run with the config.yaml `run` would have written (the fixtures ran the
    scheduler directly)."""
    out, _, cfg = reference
    src = tmp_path / "src"
    shutil.copytree(out, src)
    save_config(cfg, src / CONFIG_FILE)
    return src


def test_a_branch_trains_the_dropped_stages_again_to_the_sources_numbers(generalist_reference, tmp_path, capsys):
    ref_out, ref_state, cfg = generalist_reference
    src = source_run(generalist_reference, tmp_path)
    assert skills_main(["branch", str(src), str(tmp_path / "both")]) == 0
    assert "resume " + str(tmp_path / "both") in capsys.readouterr().out
    assert skills_main(["branch", str(src), str(tmp_path / "kept"), "--keep-generalist", "manager.skill_prior=0.25"]) == 0
    both, kept = load_state(tmp_path / "both"), load_state(tmp_path / "kept")
    assert both.manager == {} and both.generalist == {} and both.skills == ref_state.skills
    assert not (tmp_path / "both" / MANAGER_DIR).exists() and not (tmp_path / "both" / GENERALIST_DIR).exists()
    assert kept.manager == {} and kept.generalist == ref_state.generalist and (tmp_path / "kept" / GENERALIST_DIR).is_dir()
    assert saved_config(tmp_path / "kept").manager.skill_prior == 0.25
    assert saved_config(src) == cfg and load_state(src).manager == ref_state.manager  # the source as it was
    assert not (src / LOCK_FILE).exists()  # its lock, held for the copy, released

    state, _ = run_managed(tmp_path / "both", resume=True, manager=GENERALIST)
    assert state.generalist == ref_state.generalist and state.manager == ref_state.manager
    for a, b in zip(jax.tree.leaves(manager_params(tmp_path / "both", cfg)), jax.tree.leaves(manager_params(ref_out, cfg))):
        np.testing.assert_array_equal(a, b)  # the same skills and seeds: the same numbers
    state, prior_cfg = run_managed(tmp_path / "kept", resume=True, manager={**GENERALIST, "skill_prior": 0.25})
    assert state.manager["status"] == "done"
    assert read_jsonl(tmp_path / "kept" / GENERALIST_DIR / "metrics.jsonl") == read_jsonl(ref_out / GENERALIST_DIR /
                                                                                           "metrics.jsonl")
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(manager_params(tmp_path / "kept", prior_cfg)),
                                                         jax.tree.leaves(manager_params(ref_out, cfg))))


@pytest.mark.parametrize("args, message", [
    (["seed=3"], "'seed' cannot be changed by a branch"),
    (["manager.kickstrt=1"], "unknown config key 'manager.kickstrt'. Did you mean 'manager.kickstart'?"),
    (["--keep-generalist", "manager.features=[collect_wood]"], "only the manager stage's own keys"),
    (["manager.skill_prior=2"], "skill_prior"),
    (["manager.kickstart=0.5"], "'kickstart' needs 'generalist_timesteps'"),
])
def test_a_bad_branch_exits_2_with_one_line_and_writes_nothing(reference, tmp_path, capsys, args, message):
    src = source_run(reference, tmp_path)  # a manager without a generalist stage
    assert skills_main(["branch", str(src), str(tmp_path / "dst"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "dst").exists()


def test_a_branch_is_refused_for_a_missing_generalist_a_used_destination_or_a_live_source(reference, tmp_path,
                                                                                        capsys):
    src = source_run(reference, tmp_path)
    cases = [(["--keep-generalist"], "has no finished generalist stage"), ([], "already exists and is not empty")]
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "notes.txt").write_text("mine")
    for args, message in cases:
        assert skills_main(["branch", str(src), str(tmp_path / "dst"), *args]) == 2
        assert message in capsys.readouterr().err
    (src / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()}))
    assert skills_main(["branch", str(src), str(tmp_path / "other")]) == 2
    assert "is in use by pid" in capsys.readouterr().err and not (tmp_path / "other").exists()
    assert os.listdir(tmp_path / "dst") == ["notes.txt"]
    assert skills_main(["branch", str(tmp_path / "nothing"), str(tmp_path / "other")]) == 2
    assert "config.yaml is missing" in capsys.readouterr().err


def test_a_kill_while_branching_leaves_no_destination_and_the_source_free(reference, tmp_path, monkeypatch):
    src = source_run(reference, tmp_path)
    _, _, cfg = reference

    def killed(*args, **kwargs):
        raise Crash("branch.copied")

    monkeypatch.setattr(branch_module, "save_config", killed)  # after the copy, before the rename
    with pytest.raises(Crash):
        branch_module.branch_run(src, tmp_path / "dst", cfg)
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no destination, no temporary directory left
    assert not (src / LOCK_FILE).exists()
    monkeypatch.undo()
    branch_module.branch_run(src, tmp_path / "dst", cfg)
    assert load_state(tmp_path / "dst").manager == {}


def test_manager_speed_times_the_generalist_and_the_manager_of_a_finished_run(generalist_reference, reference,
                                                                             tmp_path, capsys):
    from benchmarks.skills import manager_speed

    out, state, cfg = generalist_reference
    run = tmp_path / "run"
    shutil.copytree(out, run)
    # as `skills run` writes it, with a teacher: the generalist is timed while it teaches and past it
    save_config(dataclasses.replace(cfg, manager=dataclasses.replace(cfg.manager, kickstart=1.0)), run / "config.yaml")
    assert manager_speed.main([str(run), "--out", str(tmp_path / "speed"), "--chunks", "1"]) == 0
    result = json.loads((tmp_path / "speed" / "manager_speed.json").read_text())
    assert result["skills"] == state.manager["skills"]
    assert all(result[s]["steps"] == 64 and result[s]["steps_per_s"] > 0
               for s in ("generalist", "generalist_past_teacher", "manager", "flat_ppo"))
    assert "| generalist, teacher's weight 0 |" in (tmp_path / "speed" / "manager_speed.md").read_text()
    assert "| manager |" in (tmp_path / "speed" / "manager_speed.md").read_text()
    assert "| flat PPO |" in (tmp_path / "speed" / "manager_speed.md").read_text()
    # A run without a generalist stage (TechTree's config) times its manager alone.
    alone = tmp_path / "alone"
    shutil.copytree(reference[0], alone)
    save_config(reference[2], alone / "config.yaml")
    assert manager_speed.main([str(alone), "--out", str(tmp_path / "alone_speed"), "--chunks", "1"]) == 0
    result = json.loads((tmp_path / "alone_speed" / "manager_speed.json").read_text())
    assert "generalist" not in result and result["manager"]["steps"] == 64
    # A run whose manager stage has not finished is refused with the fix, before anything is built or written.
    unfinished = tmp_path / "unfinished"
    shutil.copytree(alone, unfinished)
    state_module.save_state(unfinished, dataclasses.replace(reference[1], manager={**reference[1].manager,
                                                                                 "status": "running"}))
    assert manager_speed.main([str(unfinished), "--out", str(tmp_path / "none")]) == 2
    assert "skills resume" in capsys.readouterr().err and not (tmp_path / "none").exists()


def test_forced_option_plays_the_manager_with_an_option_forced_where_a_condition_holds(reference, tmp_path, capsys):
    from benchmarks.skills import forced_option

    out, state, cfg = reference
    run = tmp_path / "run"
    shutil.copytree(out, run)
    save_config(cfg, run / "config.yaml")  # as `skills run` writes it
    args = [str(run), "--option", "collect_wood", "--when", "inventory.wood <= 0", "--episodes", "4",
            "--out", str(tmp_path / "forced")]
    assert forced_option.main(args) == 0
    result = json.loads((tmp_path / "forced" / "forced_option.json").read_text())
    label = "collect_wood (collect_wood)"
    for mode in ("greedy", "sampled"):
        # no wood at the start: every episode's first decision is collect_wood's, whose expert then acts
        assert result["forced"][mode]["acting"].get(label, 0.0) > 0.0
        assert result["as_trained"][mode]["episodes"] == result["forced"][mode]["episodes"] == 4
    # an option the manager does not have, or a condition on an unknown quantity: one line, exit 2
    assert forced_option.main([*args[:2], "collect_stone", *args[3:]]) == 2
    assert "'collect_stone' is not an option" in capsys.readouterr().err
    assert forced_option.main([*args[:4], "inventory.woood <= 0", *args[5:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inventory.woood" in err[0]


def test_skills_speed_refuses_dependencies_a_run_did_not_complete(reference, tmp_path, capsys):
    from benchmarks.skills import skills_speed

    out, _, _ = reference  # collect_wood, place_table and make_wood_pickaxe completed; collect_stone never ran
    assert skills_speed.main(["--config", str(ROOT / "configs/skills_techtree.yaml"), "--out", str(tmp_path / "o"),
                              "--skills", "make_stone_pickaxe", "--experts-from", str(out)]) == 2
    err = capsys.readouterr().err
    assert "collect_stone did not complete there" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("section, message", [
    ("manager: {timesteps: 100, skills: [collect_wood, make_wood_pikaxe]}",
     "manager.skills names 'make_wood_pikaxe', not in the skill library. Did you mean 'make_wood_pickaxe'?"),
    ("manager: {timesteps: 100, skills: []}", "'skills' is empty"),
    ("manager: {timesteps: 100, generalist_timesteps: 100}", "'generalist_timesteps' needs 'primitives: true'"),
    ("manager: {timesteps: 100, primitives: true, skill_prior: 0.2}", "'skill_prior' needs 'generalist_timesteps'"),
    ("manager: {timesteps: 100, features: [collect_wood, colect_stone]}", "manager.features names 'colect_stone'"),
    ("manager: {timesteps: 100, features: [all, collect_wood]}", "'features' mixes \"all\" with names"),
    ("skill_budgets: {collect_wod: 1000}", "skill_budgets names 'collect_wod'"),
    ("manager: {timesteps: 100, restart_prob: 0.5, restart_from: colect_wood}",
     "manager.restart_from names 'colect_wood'"),
    ("manager: {timesteps: 100, restart_prob: 1.0}", "'restart_prob' must lie in [0, 1)"),
    ("manager: {timesteps: 100, tune_experts: true, greedy_experts: true}", "set 'greedy_experts: false'"),
    ("manager: {timesteps: 100, tune_experts: true, expert_kl: -1}", "'expert_kl' must be >= 0"),
    ("manager: {timesteps: 100, primitives: true, kickstart: 0.5}", "'kickstart' needs 'generalist_timesteps'"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, kickstart_timesteps: 200}",
     "'kickstart_timesteps' must lie in [0, generalist_timesteps]"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart_timesteps: 50}",
     "'kickstart' is 0 (no teacher)"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart_from: attempted}",
     "'kickstart_from: attempted' picks the teacher, but 'kickstart' is 0"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, kickstart_from: failed}",
     "'kickstart_from' must be one of completed, attempted"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, skills: [place_table]}",
     "the target 'collect_wood' is not in manager.skills"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart_when: ['timestep >= 1']}",
     "'kickstart_when' says where the teacher teaches, but 'kickstart' is 0"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, kickstart_when: ['drink => 3']}",
     "'kickstart_when': condition 'drink => 3' is not '<quantity> <op> <number>'"),
    ("manager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, kickstart_when: ['drink >= 3']}",
     "'manager.kickstart_when': unknown quantity 'drink' in condition 'drink >= 3'"),
    ("max_conditions: 1\nmanager: {timesteps: 100, primitives: true, generalist_timesteps: 100, kickstart: 0.5, "
     "kickstart_when: ['timestep >= 1', 'timestep <= 9']}", "'manager.kickstart_when' has 2 conditions but max_conditions is 1"),
])
def test_a_bad_manager_config_exits_2_with_one_line(tmp_path, capsys, section, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"env: TechTree-v0\ntarget: collect_wood\n{section}\n")
    assert skills_main(["run", "--config", str(path), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "run").exists()


def test_a_run_whose_skills_all_failed_records_the_manager_as_skipped(tmp_path):
    cfg = config(**STAGE, max_retries=0)
    lib = techtree_library()
    trainer = ExpertTrainer(cfg, never=("collect_wood",))
    state = Scheduler(cfg, tmp_path, trainer, RecordingPlanner(lib), lib).run()
    assert state.manager == {"status": "skipped", "reason": "none of its skills has completed"}
    assert load_state(tmp_path).manager["status"] == "skipped"
    assert "manager: skipped, none of its skills has completed" in status_table(state)
    assert Scheduler(cfg, tmp_path, trainer, RecordingPlanner(lib), lib).run(resume=True).manager["status"] == "skipped"
