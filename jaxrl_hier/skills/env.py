"""The skill environment: a base env whose reward, episode end and expert choice come from a skill.

For a skill S with dependency plan (d_1, ..., d_L) (its dependency closure, in topological order):
- reward 1 on the step S's success conditions first hold; that step terminates the episode;
- the observation is `{"obs": base_obs, "expert": j}` where j is the plan position of the first
  dependency that is still needed and whose success conditions do not hold (its frozen expert
  acts), or L when none is (S's own, trainable expert acts): the dependency-gated mixture of
  experts of Flow-RL (`route`). Conditions are read live, so a material a craft spent (a skill
  that holds while the inventory has one wood) hands control back to the skill that gathers it;
  but only while a skill that directly requires it is still to be done: once the crafts that
  need wood are done, wood no longer gates the rest of the chain.
- per-episode flags, `achievements = (success, reached, restarted, chain_success, fresh_reached)`: `reached` is
  set once S's own expert has had control (every dependency held). A skill is judged on the
  episodes it reached: its frozen dependencies fail on some episodes, and counting those against S
  would cap S's success rate at the product of its dependencies' rates (the deeper the skill, the
  lower), however well S itself has learned. Logged beside it: the chain's rate (successes over
  the episodes that began in a fresh world, `chain_success` over not `restarted`) and, with
  restarts, S's rate from the states fresh chains hand it (`chain_success` over `fresh_reached`),
  which restarts from a few shared anchors cannot inflate.
- restarts (`restart_prob` > 0): a deep skill's episode spends most of its steps in its frozen
  dependencies (make_iron_pickaxe's seven took ~250 of ~285 steps on TechTree), so its own expert
  gets little practice per env step. The state where S's own expert first took control in a
  fresh-world episode is kept as the episode's anchor; when the episode ends, with probability
  `restart_prob` the env starts its next episode from that anchor (its time step included, so the
  time left is the same as when it was first reached) instead of a fresh world, and the anchor is
  kept for the next end; otherwise the env takes a fresh world and the anchor is dropped. An env
  without an anchor of its own restarts from a random other env's (`envs.vec`): the deeper the
  skill, the rarer a chain that reaches it, and one found serves every env. A share
  1 - restart_prob of episodes starts fresh and supplies new anchors; the greedy evaluation
  (`skills.trainer`) starts from fresh worlds only. Root skills (no dependencies) never restart.

- attempt cap (`max_attempt_steps` > 0): the episode is truncated once that many steps have passed
  since S's own expert first took control. Without it a stuck attempt runs to the base env's time
  limit (on TechTree ~200 of 300 steps), so a deep skill whose chain hands over in a fresh world
  got one attempt per ~280 env steps; with it, a failed attempt costs the cap, and the rate a skill
  is judged on is its success within the cap. The composed agent has no cap (skills.composed).

A skill is data (`SkillParams`: quantity indices, operators, thresholds), so one compiled program
serves any skill, and the skills trained at once differ only in the arrays vmapped over them.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.skills.quantities import QuantityFn, quantity_vector
from jaxrl_hier.skills.spec import OPS, Skill, SkillError, SkillLibrary


@struct.dataclass
class Conditions:
    """A conjunction of `quantity[index] op value` rows; rows with valid=False are ignored."""

    index: jax.Array  # int32[..., C]
    op: jax.Array  # int32[..., C], position in spec.OPS
    value: jax.Array  # float32[..., C]
    valid: jax.Array  # bool[..., C]


@struct.dataclass
class SkillParams:
    success: Conditions  # [C]
    plan: Conditions  # [E, C]: the success conditions of each dependency, in plan order
    plan_len: jax.Array  # int32: number of dependencies (the trainable expert's position)
    # bool[E + 1, E]: row k < E: plan entry k directly requires entry j; row E: the skill itself does
    needs: jax.Array
    # float32: this skill's restart probability (data, so the scheduler can end a skill's restarts,
    # for the fresh-world phase, without a recompile); only read when the env keeps anchors
    restart_prob: jax.Array = 0.0


@struct.dataclass
class SkillEnvParams:
    base: Any
    skill: SkillParams


@struct.dataclass
class SkillEnvState:
    base: Any
    success: jax.Array  # bool: the skill's conditions hold in this state
    reached: jax.Array  # bool: the skill's own expert has had control in this episode
    restarted: jax.Array  # bool: this episode began from an anchor, not from a fresh world
    attempt_steps: jax.Array  # int32: steps taken since the skill's own expert first took control
    # With restarts only (else None): the base state and observation where the skill's own expert
    # first took control in the latest fresh-world episode, and whether there is one.
    anchor: Any = None
    anchor_obs: Any = None
    has_anchor: Any = None


def capture_anchor(capture: jax.Array, base_state: Any, base_obs: Any, state: Any) -> dict:
    """The anchor fields of `state` (`anchor`, `anchor_obs`, `has_anchor`) with (`base_state`,
    `base_obs`) kept where `capture`: restarts from a state reached in a fresh-world episode, here
    and in the manager's env (skills.manager)."""
    keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(capture, x, y), a, b)  # noqa: E731
    return {"anchor": keep(base_state, state.anchor), "anchor_obs": keep(base_obs, state.anchor_obs),
            "has_anchor": state.has_anchor | capture}


def conditions_hold(q: jax.Array, cond: Conditions) -> jax.Array:
    """bool[...]: every valid row of `cond` holds for the quantity vector `q`."""
    x = q[cond.index]
    v = cond.value
    results = jnp.stack([x >= v, x <= v, x == v, x > v, x < v, x != v], axis=-1)  # order of spec.OPS
    row = jnp.take_along_axis(results, cond.op[..., None], axis=-1)[..., 0]
    return jnp.all(row | ~cond.valid, axis=-1)


def route(q: jax.Array, plan: Conditions, plan_len: jax.Array, needs: jax.Array) -> jax.Array:
    """int32: the plan position that acts for the quantity vector `q`: the first of the first
    `plan_len` skills of `plan` ([E, C] rows, dependencies before the skills that need them) that is
    still needed and whose conditions do not hold, or `plan_len` when there is none (the served
    skill's own expert). Used for training here and for the composed agent (skills.composed).

    `needs` (bool[E + 1, E]; row E is the served skill) says which skill directly requires which. An
    entry is still needed while some skill that directly requires it is still to be done (needed
    itself and not holding; the served skill always is): a craft's materials are gathered again
    after an earlier craft spent them, but not once every craft that uses them is done."""
    n = plan.index.shape[0]
    holds = conditions_hold(q, plan)
    active = jnp.arange(n) < plan_len
    to_do = jnp.zeros(n + 1, bool).at[n].set(True)
    for j in reversed(range(n)):  # users come after what they require: their to_do is final here
        needed = active[j] & jnp.any(needs[:, j] & to_do)
        to_do = to_do.at[j].set(needed & ~holds[j])
    unmet = to_do[:n]
    return jnp.where(unmet.any(), jnp.argmax(unmet), plan_len).astype(jnp.int32)


def route_to_target(q: jax.Array, plan: Conditions, needs: jax.Array) -> jax.Array:
    """`route` over a whole plan whose last entry is the target it serves: once every entry holds, the
    target's own expert (the last) keeps acting. The composed agent (skills.composed) and chain
    fine-tuning (skills.chain) route this way."""
    last = plan.index.shape[0] - 1
    return jnp.minimum(route(q, plan, last + 1, needs), last)


class SkillEnv(Environment):
    """Wraps `base` for skill training; see the module docstring."""

    achievement_names = ("success", "reached", "restarted", "chain_success", "fresh_reached")

    def __init__(self, base: Environment, quantities: dict[str, QuantityFn], max_experts: int, max_conditions: int,
                 restart_prob: float = 0.0, max_attempt_steps: int = 0):
        if not 0.0 <= restart_prob < 1.0:
            raise SkillError(f"restart_prob must lie in [0, 1), got {restart_prob}.")
        if max_attempt_steps < 0:
            raise SkillError(f"max_attempt_steps must be >= 0 (0: no cap), got {max_attempt_steps}.")
        self.max_attempt_steps = int(max_attempt_steps)
        self.base = base
        self.restart_prob = float(restart_prob)
        # VecEnv asks `restart` before handing out fresh worlds (see Environment.restart).
        self.restart = self._restart if restart_prob > 0 else None
        self.name = f"Skill({base.name})"
        self.quantity_names = tuple(quantities)
        self._fns = tuple(quantities.values())
        self.max_experts = max_experts
        self.max_conditions = max_conditions

    # ------------------------------------------------------------------ building skill params (host)
    def conditions(self, skills: Sequence[Skill | None], rows: int | None = None) -> Conditions:
        """Numpy condition arrays for `skills` (None = no skill: a padding row that never holds)."""
        n, c = (rows or len(skills)), self.max_conditions
        index, op = np.zeros((n, c), np.int32), np.zeros((n, c), np.int32)
        value, valid = np.zeros((n, c), np.float32), np.zeros((n, c), bool)
        for i, skill in enumerate(skills):
            if skill is None:
                continue
            conds = skill.conditions()
            if len(conds) > c:
                raise SkillError(f"skill '{skill.name}' has {len(conds)} conditions but max_conditions is {c}; "
                                 "raise max_conditions in the config.")
            for j, cond in enumerate(conds):
                if cond.quantity not in self.quantity_names:
                    raise SkillError(f"skill '{skill.name}': unknown quantity '{cond.quantity}'.")
                index[i, j] = self.quantity_names.index(cond.quantity)
                op[i, j], value[i, j], valid[i, j] = OPS.index(cond.op), cond.value, True
        return Conditions(index, op, value, valid)

    @staticmethod
    def needs(library: SkillLibrary, plan: Sequence[str], served: str, rows: int | None = None) -> np.ndarray:
        """bool[rows + 1, rows] for `route`: row k (< len(plan)) marks the plan entries that plan
        entry k directly requires, row `rows` those that `served` (the skill the plan leads to) does."""
        rows = len(plan) if rows is None else rows
        out = np.zeros((rows + 1, rows), bool)
        for k, user in [*enumerate(plan), (rows, served)]:
            for dep in library[user].requires:
                out[k, plan.index(dep)] = True
        return out

    def skill_params(self, library: SkillLibrary, name: str) -> SkillParams:
        plan = library.closure(name)
        if len(plan) > self.max_experts:
            raise SkillError(f"skill '{name}' depends on {len(plan)} skills but max_experts is {self.max_experts}; "
                             "raise max_experts in the config.")
        success = jax.tree.map(lambda x: x[0], self.conditions([library[name]]))
        deps = self.conditions([library[d] for d in plan], rows=self.max_experts)
        return SkillParams(success, deps, np.int32(len(plan)), self.needs(library, plan, name, self.max_experts),
                           np.float32(self.restart_prob))

    def params_for(self, base_params: Any, library: SkillLibrary, name: str) -> SkillEnvParams:
        return SkillEnvParams(base_params, self.skill_params(library, name))

    @property
    def default_params(self) -> SkillEnvParams:
        # No skill (idle slots): a condition that never holds (q < -inf), so episodes run to the base
        # env's own end. One that held at once would reset every env on every step, and resets are
        # the most expensive thing a Craftax step can do. (The trainer leaves idle slots out of its
        # compiled rounds altogether; `is_idle` recognises them.)
        none = jax.tree.map(lambda x: x[0].copy(), self.conditions([None]))
        none.op[0], none.value[0], none.valid[0] = OPS.index("<"), -np.inf, True
        plan = self.conditions([], rows=self.max_experts)
        needs = np.zeros((self.max_experts + 1, self.max_experts), bool)
        return SkillEnvParams(self.base.default_params, SkillParams(none, plan, np.int32(0), needs, np.float32(0.0)))

    @staticmethod
    def is_idle(success: Conditions) -> np.ndarray:
        """bool[...]: these success conditions are the idle marker of `default_params` (host arrays)."""
        op, value, valid = (np.asarray(x)[..., 0] for x in (success.op, success.value, success.valid))
        return valid & (op == OPS.index("<")) & (value == -np.inf)

    # ------------------------------------------------------------------ env protocol
    def quantities(self, base_state: Any) -> jax.Array:
        """float32[Q]: the named quantities (`quantity_names`) of one base env state."""
        return quantity_vector(self._fns, base_state)

    def _observe(self, base_obs: Any, state: Any, params: SkillEnvParams) -> tuple[dict, jax.Array, jax.Array]:
        """(observation, success, own): `own` is True when every dependency holds (S's expert acts)."""
        q = self.quantities(state)
        expert = route(q, params.skill.plan, params.skill.plan_len, params.skill.needs)
        success = conditions_hold(q, params.skill.success)
        return {"obs": base_obs, "expert": expert}, success, success | (expert == params.skill.plan_len)

    def reset(self, key: jax.Array, params: SkillEnvParams):
        base_obs, state = self.base.reset(key, params.base)
        obs, success, own = self._observe(base_obs, state, params)
        anchor = (state, base_obs, jnp.bool_(False)) if self.restart is not None else (None, None, None)
        return obs, SkillEnvState(state, success, own, jnp.bool_(False), jnp.int32(0), *anchor)

    def step(self, key: jax.Array, state: SkillEnvState, action: jax.Array, params: SkillEnvParams):
        base_obs, base_state, _, terminated, truncated, info = self.base.step(key, state.base, action, params.base)
        obs, success, own = self._observe(base_obs, base_state, params)
        reward = success.astype(jnp.float32)
        attempt_steps = state.attempt_steps + state.reached.astype(jnp.int32)  # this step was the attempt's
        new = SkillEnvState(base_state, success, state.reached | own, state.restarted, attempt_steps,
                            state.anchor, state.anchor_obs, state.has_anchor)
        if self.max_attempt_steps:
            truncated = truncated | (attempt_steps >= self.max_attempt_steps)
        if self.restart is not None:
            # The first step of a fresh-world episode on which S's own expert takes control.
            capture = own & ~state.reached & ~success & (params.skill.plan_len > 0)
            new = new.replace(**capture_anchor(capture, base_state, base_obs, state))
        return obs, new, reward, terminated | success, truncated & ~success, info

    def _restart(self, key: jax.Array, final: SkillEnvState, params: SkillEnvParams):
        """(obs, state, valid, want): the next episode from `final`'s anchor (valid if it has one),
        wanted with probability `restart_prob` (see the module docstring)."""
        want = (jax.random.uniform(key) < params.skill.restart_prob) & (params.skill.plan_len > 0)
        obs, success, own = self._observe(final.anchor_obs, final.anchor, params)
        state = SkillEnvState(final.anchor, success, own, jnp.bool_(True), jnp.int32(0), final.anchor,
                              final.anchor_obs, final.has_anchor)
        return obs, state, final.has_anchor, want

    def observation_space(self, params: SkillEnvParams):
        return self.base.observation_space(params.base)

    def action_space(self, params: SkillEnvParams):
        return self.base.action_space(params.base)

    def achievements(self, state: SkillEnvState) -> jax.Array:
        fresh = ~state.restarted
        return jnp.stack([state.success, state.reached, state.restarted, state.success & fresh, state.reached & fresh])
