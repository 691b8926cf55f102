"""What the composed agent (`skills.composed`), chain fine-tuning (`skills.chain`) and the learned
manager (`skills.manager`) share: which completed skill an agent is routed towards, the routed
experts as one `Composition`, the base env's episode length, and `play_episodes`, which plays any
policy from fresh worlds for whole episodes. It sits below those three modules, so none of them
imports another to reach it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.envs.vec import reset_many
from jaxrl_hier.skills.env import Conditions
from jaxrl_hier.skills.moe import stack_experts
from jaxrl_hier.skills.spec import SkillError, SkillLibrary


@struct.dataclass
class Composition:
    """The routed experts (plan order) and the conditions the report watches."""

    plan: Conditions  # [P, C]: success conditions of the routed skills, dependencies first, the target last
    needs: jax.Array  # bool[P + 1, P]: which routed skill directly requires which (`skills.env.route`)
    bank: Any  # actor experts stacked on a leading [P] axis (`skills.moe` layers)
    watch: Conditions  # [W, C]: success conditions of every completed skill


class EpisodeStats(struct.PyTreeNode):
    achievements: jax.Array  # bool[N, A]: the base env's achievements when the episode ended
    episode_return: jax.Array  # float32[N]
    length: jax.Array  # int32[N]
    held: jax.Array  # bool[N, W]: each watched skill's conditions held at some step
    first: jax.Array  # int32[N, W]: the step at which they first held (-1: never)
    acting: jax.Array  # int32[N, L]: the steps each of the agent's labels acted (the composed agent's
    # plan positions; the manager's option and expert, or its own base action)


def choose_target(library: SkillLibrary, completed: Sequence[str], target: str) -> str:
    """The skill the composed agent is routed towards: `target` if completed; for a target not
    completed yet, the completed skill with the longest dependency chain that leads to it; for
    "all", or a target not proposed yet, the deepest completed skill."""
    if not completed:
        raise SkillError("no skill of this run has completed yet: there is no composed agent to evaluate.")
    if target in completed:
        return target
    # "all", or a target not proposed yet in this run (the planner proposes as dependencies complete)
    towards = completed if target not in library else [s for s in completed if s in library.closure(target)]
    if not towards:
        raise SkillError(f"none of the skills that '{target}' needs has completed yet.")
    # longest chain first; among equals the later-completed one (completed is in completion order)
    return max(reversed(towards), key=lambda s: len(library.closure(s)))


def build_composition(env, library: SkillLibrary, experts: dict[str, Any], target: str) -> tuple[Composition, list[str]]:
    """The composition routed towards `target` (a completed skill) over the completed skills in
    `experts`; returns it with the plan's skill names."""
    plan = [*library.closure(target), target]
    missing = [s for s in plan if s not in experts]
    if missing:
        raise SkillError(f"'{target}' needs {', '.join(missing)}, which have not completed.")
    watched = list(experts)
    # The target is routed like its dependencies; the last row of `needs` (what the plan serves)
    # requires the target only, so once the target holds nothing is left to do, and `actions`
    # keeps the target's expert acting.
    needs = env.needs(library, plan, target)
    needs[-1] = np.arange(len(plan)) == len(plan) - 1
    comp = Composition(plan=env.conditions([library[s] for s in plan]), needs=needs,
                       bank=stack_experts([experts[s]["actor"] for s in plan]),
                       watch=env.conditions([library[s] for s in watched]))
    return jax.tree.map(jnp.asarray, comp), plan


def episode_limit(env_params: Any) -> int:
    """The base env's episode length: TechTree's `max_steps`, Craftax's `max_timesteps`."""
    for name in ("max_steps", "max_timesteps", "max_steps_in_episode"):
        if hasattr(env_params, name):
            return int(getattr(env_params, name))
    raise SkillError("this env's params name no episode length; pass --max-steps.")



def mode_keys(key: jax.Array) -> list[tuple[str, jax.Array]]:
    """(mode, key) for the greedy and the sampled evaluation from `key`: every agent judged from one
    key (`skills eval --seed`, flat PPO in benchmarks/skills/skills_vs_ppo.py) plays the same fresh
    worlds in each mode."""
    return [(mode, jax.random.fold_in(key, i)) for i, mode in enumerate(("greedy", "sampled"))]


def play_both_modes(evaluate: Callable[[jax.Array, bool], Any], key: jax.Array) -> dict[str, Any]:
    """{"greedy": evaluate(k0, True), "sampled": evaluate(k1, False)} with the keys of `mode_keys(key)`:
    one agent's figures in both modes from the fresh worlds every agent judged from `key` plays."""
    return {mode: evaluate(mode_key, mode == "greedy") for mode, mode_key in mode_keys(key)}


def play_episodes(base, base_params: Any, act, watch, key: jax.Array, episodes: int, max_steps: int,
                  num_labels: int = 1) -> EpisodeStats:
    """`episodes` fresh worlds of `base` played by `act(obs [N, ...], state, key) -> (actions [N],
    labels [N])`, each for one whole episode (at most `max_steps` steps; the loop stops once every
    episode has ended). `watch(state) -> bool[N, W]` is tracked as "held at some step", and each
    label in [0, num_labels) (what acted: a plan position, an option) counted per step. Traceable
    (jit it)."""
    k_reset, key = jax.random.split(key)
    obs, state = reset_many(base, base_params, jax.random.split(k_reset, episodes))
    held = watch(state)
    stats = EpisodeStats(jax.vmap(base.achievements)(state), jnp.zeros(episodes), jnp.zeros(episodes, jnp.int32),
                         held, jnp.where(held, 0, -1), jnp.zeros((episodes, num_labels), jnp.int32))

    def cond(carry):
        t, _, _, alive, _, _ = carry
        return (t < max_steps) & alive.any()

    def body(carry):
        t, obs, state, alive, stats, key = carry
        key, k_act, k_step = jax.random.split(key, 3)
        action, label = act(obs, state, k_act)
        obs, state, reward, terminated, truncated, _ = jax.vmap(base.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, episodes), state, action, base_params)
        # Only the first episode counts: a finished env keeps stepping, masked out.
        held = stats.held | (alive[:, None] & watch(state))
        stats = EpisodeStats(jnp.where(alive[:, None], jax.vmap(base.achievements)(state), stats.achievements),
                             stats.episode_return + jnp.where(alive, reward, 0.0),
                             stats.length + alive.astype(jnp.int32), held,
                             jnp.where(held & ~stats.held, t + 1, stats.first),
                             stats.acting + (alive[:, None] & (label[:, None] == jnp.arange(num_labels))))
        return t + 1, obs, state, alive & ~(terminated | truncated), stats, key

    carry = (jnp.int32(0), obs, state, jnp.ones(episodes, bool), stats, key)
    return jax.lax.while_loop(cond, body, carry)[4]
