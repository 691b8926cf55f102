"""The composed agent (skills.composed) on a hand-made chain: the right expert acts at each step,
control passes on when a condition turns true (and back when one stops holding), and the report
counts what the episodes unlocked. A tiny env, so nothing here compiles for long."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete
from jaxrl_hier.skills.composed import ComposedAgent, build_composition, choose_target, summarize
from jaxrl_hier.skills.env import SkillEnv
from jaxrl_hier.skills.moe import MoEPolicy
from jaxrl_hier.skills.quantities import env_quantities
from jaxrl_hier.skills.spec import Condition, Skill, SkillError, SkillLibrary

LEVELS = 3
NUM_ACTIONS = LEVELS + 2  # action k < LEVELS climbs from level k; LEVELS: drop the token; LEVELS + 1: pick it up


@struct.dataclass
class LadderState:
    level: jax.Array  # int32: rungs climbed
    token: jax.Array  # bool: holding the token (the first rung needs it, and picking it up is skill 0)
    best: jax.Array  # int32: the highest level reached (achievements are never lost)
    t: jax.Array


class Ladder(Environment):
    """Climb rung k with action k, only from level k; rung 0 also needs the token (action LEVELS + 1
    picks it up). Action LEVELS drops the token: the token skill's condition stops holding."""

    name = "Ladder"
    achievement_names = ("token", *(f"rung_{k}" for k in range(LEVELS)))
    achievement_rewards = (1.0,) * (LEVELS + 1)

    @property
    def default_params(self):
        return {"max_steps": 12}

    def reset(self, key, params):
        s = LadderState(jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.int32(0))
        return self._obs(s), s

    def step(self, key, state, action, params):
        climb = (action == state.level) & (state.level < LEVELS) & ((state.level > 0) | state.token)
        token = jnp.where(action == LEVELS + 1, True, jnp.where(action == LEVELS, False, state.token))
        level = state.level + climb.astype(jnp.int32)
        s = LadderState(level, token, jnp.maximum(state.best, level), state.t + 1)
        reward = climb.astype(jnp.float32) + (token & ~state.token & (state.best == 0)).astype(jnp.float32)
        return self._obs(s), s, reward, jnp.bool_(False), s.t >= params["max_steps"], {}

    def _obs(self, s):
        return jnp.stack([s.level.astype(jnp.float32), s.token.astype(jnp.float32)])

    def achievements(self, s):
        return jnp.concatenate([s.token[None], jnp.arange(LEVELS) < s.best])

    def render(self, s, params):
        return jnp.zeros((2, 2, 3), jnp.uint8) + s.level.astype(jnp.uint8)

    def observation_space(self, params):
        return Box(0.0, float(LEVELS), (2,), jnp.float32)

    def action_space(self, params):
        return Discrete(NUM_ACTIONS)


def library() -> SkillLibrary:
    token = Skill("token", (), (Condition("achievement.token", "==", 1.0),))
    rungs = [Skill(f"rung_{k}", ("token",) if k == 0 else (f"rung_{k - 1}",),
                   (Condition(f"achievement.rung_{k}", "==", 1.0),)) for k in range(LEVELS)]
    return SkillLibrary((token, *rungs))


def constant_expert(policy: MoEPolicy, action: int) -> dict:
    """An expert whose logits favour `action` whatever the observation (zero weights, a last bias)."""
    expert = policy.expert_zeros(2)
    expert["actor"][-1]["bias"][action] = 10.0
    return expert


@pytest.fixture(scope="module")
def setup():
    base = Ladder()
    env = SkillEnv(base, env_quantities(base), max_experts=4, max_conditions=1)
    policy = MoEPolicy(NUM_ACTIONS, 4, 1, "tanh", 4, "mask")
    # The token skill picks the token up; rung k's expert climbs rung k.
    experts = {"token": constant_expert(policy, LEVELS + 1),
               **{f"rung_{k}": constant_expert(policy, k) for k in range(LEVELS)}}
    # One agent for every test: its compiled programs are shared (one per plan length and mode).
    return base, env, experts, ComposedAgent(env, base.default_params, "tanh", "mask")


def test_each_expert_acts_until_its_condition_holds_then_hands_over(setup):
    base, env, experts, agent = setup
    comp, plan = build_composition(env, library(), experts, "rung_2")
    assert plan == ["token", "rung_0", "rung_1", "rung_2"]
    frames, acting, unlocked = agent.episode_frames(comp, jax.random.key(0), 12, greedy=True)
    # token, rung 0, 1, 2 in turn (one step each: every expert's action succeeds), then the
    # target's expert keeps acting until the episode's 12 steps are up.
    assert acting.tolist() == [0, 1, 2, 3] + [3] * 8
    assert unlocked[-1].all() and not unlocked[0].any()
    stats = agent.evaluate(comp, jax.random.key(1), 5, 12, greedy=True)
    assert stats.achievements.all() and (stats.length == 12).all()
    np.testing.assert_allclose(stats.episode_return, 4.0)
    assert stats.acting.tolist() == [[1, 1, 1, 9]] * 5  # the steps each plan position acted
    report = summarize(stats, base.achievement_names, base.achievement_rewards, list(experts), plan)
    assert report["achievements"] == {n: 1.0 for n in base.achievement_names}
    assert report["score_percent_of_max"] == pytest.approx(100.0) and report["skills"]["rung_2"] == 1.0
    assert report["acting"] == pytest.approx({"rung_2": 0.75, "token": 1 / 12, "rung_0": 1 / 12, "rung_1": 1 / 12})
    assert list(report["acting"])[0] == "rung_2"  # largest share first


def test_a_condition_that_stops_holding_takes_control_back(setup):
    """With the token skill gated on *holding* the token (an inventory-like condition), an expert
    that drops it hands control back to the token skill, which picks it up again."""
    base, env, experts, agent = setup
    holding = Skill("token", (), (Condition("achievement.token", "==", 1.0),))
    lib = SkillLibrary((holding, Skill("rung_0", ("token",), (Condition("achievement.rung_0", "==", 1.0),))))
    dropper = {**experts, "rung_0": constant_expert(MoEPolicy(NUM_ACTIONS, 4, 1, "tanh", 4, "mask"), LEVELS)}
    comp, plan = build_composition(env, lib, {k: dropper[k] for k in ("token", "rung_0")}, "rung_0")
    _, acting, unlocked = agent.episode_frames(comp, jax.random.key(0), 6, greedy=True)
    # The token achievement is a flag of *holding* it here (achievements() reads s.token), so it
    # flickers: rung_0's expert drops the token, the token skill takes over and picks it up again.
    assert acting.tolist() == [0, 1, 0, 1, 0, 1]
    assert not unlocked[:, 1].any()  # rung 0 is never climbed: its expert only drops the token


def test_sampled_actions_and_a_broken_expert_are_counted(setup):
    base, env, experts, agent = setup
    broken = {**experts, "rung_1": constant_expert(MoEPolicy(NUM_ACTIONS, 4, 1, "tanh", 4, "mask"), 0)}
    comp, _ = build_composition(env, library(), broken, "rung_2")
    stats = agent.evaluate(comp, jax.random.key(2), 8, 12, greedy=True)
    # rung_1's expert never climbs rung 1: the chain stops there in every episode
    np.testing.assert_array_equal(stats.achievements.mean(0), [1.0, 1.0, 0.0, 0.0])
    sampled = agent.evaluate(comp, jax.random.key(2), 64, 12, greedy=False)
    assert sampled.achievements[:, 1].mean() > 0.9  # logits of 10 against 0: nearly always the same action


def test_target_choice(setup):
    lib = library()
    assert choose_target(lib, ["token", "rung_0"], "all") == "rung_0"
    assert choose_target(lib, ["token", "rung_0"], "rung_2") == "rung_0"  # the deepest completed on the way
    assert choose_target(lib, ["token", "rung_0", "rung_1"], "rung_1") == "rung_1"
    # a target the run has not proposed yet (the planner proposes as dependencies complete)
    assert choose_target(SkillLibrary(lib.skills[:2]), ["token", "rung_0"], "rung_2") == "rung_0"
    with pytest.raises(SkillError, match="no skill of this run has completed"):
        choose_target(lib, [], "rung_2")
