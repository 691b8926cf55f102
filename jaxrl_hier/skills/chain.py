"""Chain fine-tuning: the composed agent's experts trained together, from fresh worlds.

Each skill is trained on the episodes its own expert controls, with its dependencies frozen
(`skills.trainer`). The composed agent (`skills.composed`) then meets every expert on the states
the experts before it really hand over, and nothing in a skill's training makes it care about the
skills after it: on TechTree the experts that place tables (every one that holds wood, not only
`place_table`) wall stone and iron off for later experts, and the diamond's expert, trained on a
few hundred anchors, met fresh maps at every hand-over (docs/skills.md, the diagnosis).

This phase trains the whole chain as one policy. The actor is the bank of the chain's experts (the
target's closure, then the target), routed exactly as the composed agent routes them
(`skills.env.route`); every expert is trainable and learns on the steps it acts. The reward is the
chain's progress: +1 on the step a skill of the chain first holds in the episode (its success
conditions, read live), so a step that delays or blocks a later skill costs the expert that took
it. Episodes start in fresh worlds (no restarts, no attempt cap) and end when the target holds or
at the base env's end. The critic is new (the skills' critics predict their own skill's reward):
one MLP over the observation and the one-hot of the acting expert.

It is PPO (`algorithms.ppo`) over a `ChainEnv` with a `ChainPolicy`; the scheduler runs it after
the skills (`chain_timesteps` in the config) in chunks of `updates_per_round` updates, checkpointed
after each (`skills.scheduler`), and saves the tuned experts under `RUN/chain/`, which the
composed agent then plays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import distrax
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.networks.actor_critic import ACTIVATIONS
from jaxrl_hier.skills.composition import build_composition, choose_target
from jaxrl_hier.skills.env import Conditions, conditions_hold, route_to_target
from jaxrl_hier.skills.moe import init_mlp, mixture_apply_gather, mixture_for, mlp_apply
from jaxrl_hier.skills.ppo_stage import PPOStage
from jaxrl_hier.skills.spec import SkillError, SkillLibrary
from jaxrl_hier.skills.trainer import load_expert, save_expert

CHAIN_DIR = "chain"


@struct.dataclass
class ChainParams:
    base: Any
    plan: Conditions  # [P, C]: the chain's success conditions, dependencies first, the target last
    needs: jax.Array  # bool[P + 1, P] (`skills.env.route`)


@struct.dataclass
class ChainState:
    base: Any
    held: jax.Array  # bool[P]: each chain skill has held at some step of this episode


class ChainEnv(Environment):
    """The base env with the chain's routing in the observation and its progress as the reward."""

    def __init__(self, skill_env):
        self.skill_env, self.base = skill_env, skill_env.base
        self.name = f"Chain({self.base.name})"
        self.achievement_names = tuple(getattr(self.base, "achievement_names", ()))

    def _look(self, base_state: Any, params: ChainParams) -> tuple[jax.Array, jax.Array]:
        """(acting plan position, bool[P] conditions holding now)."""
        q = self.skill_env.quantities(base_state)
        return route_to_target(q, params.plan, params.needs), conditions_hold(q, params.plan)

    def reset(self, key: jax.Array, params: ChainParams):
        base_obs, base_state = self.base.reset(key, params.base)
        acting, holds = self._look(base_state, params)
        return {"obs": base_obs, "expert": acting}, ChainState(base_state, holds)

    def step(self, key: jax.Array, state: ChainState, action: jax.Array, params: ChainParams):
        base_obs, base_state, _, terminated, truncated, info = self.base.step(key, state.base, action, params.base)
        acting, holds = self._look(base_state, params)
        reward = (holds & ~state.held).sum().astype(jnp.float32)
        held = state.held | holds
        done = terminated | held[-1]  # the target holds: the chain's work is done
        return {"obs": base_obs, "expert": acting}, ChainState(base_state, held), reward, done, truncated & ~done, info

    def observation_space(self, params: ChainParams):
        return self.base.observation_space(params.base)

    def action_space(self, params: ChainParams):
        return self.base.action_space(params.base)

    def achievements(self, state: ChainState) -> jax.Array:
        return self.base.achievements(state.base)


class ChainPolicy:
    """Every expert of the chain trainable (the actor bank, [P] leading axis), one new critic over
    the observation and the acting expert. Duck-types a Flax module for `algorithms.ppo`; `init`
    returns the given bank, so training starts from the skills' experts."""

    def __init__(self, bank: Any, hidden_size: int, num_layers: int, activation: str, dispatch: str = "gather"):
        self.bank = bank
        self.num_experts = int(jax.tree.leaves(bank)[0].shape[0])
        self.hidden_size, self.num_layers, self.activation, self.dispatch = hidden_size, num_layers, activation, dispatch

    def _mixture(self, bank: Any, x: jax.Array, idx: jax.Array, act: Any) -> jax.Array:
        """Every row through its routed expert. Under `gather`, the batched block form in blocks of an
        eighth of the rows: every expert trains here, and the batched form's gradient costs less
        than the block loop's (`skills.moe.mixture_apply_gather`). On a 2-core Intel Xeon with
        AVX-512 (jax 0.10.2, 2026-11-30), a TechTree chain chunk of 8 experts took 1.02 s this way
        against 1.14 s with the loop, and 1.12-1.15 s with blocks of a sixteenth or a quarter (since
        the gradient is written out, `skills.moe.expert_matmul`, 0.90-0.92 s; in one ad-hoc series an
        eighth 0.83 s against 0.94 and 1.04 s for a sixteenth and a quarter); with
        eight 256-wide experts the batched gradient was 11% slower than the loop's in
        `benchmarks/skills/moe.py` (docs/results.md)."""
        if self.dispatch == "gather":
            return mixture_apply_gather(bank, x, idx, act, block_size=max(1, x.shape[0] // 8), batched=True)
        return mixture_for(self.dispatch)(bank, x, idx, act)

    def init(self, key: jax.Array, obs: dict) -> dict:
        din = int(np.prod(obs["obs"].shape[1:])) + self.num_experts
        critic = init_mlp(key, [din] + [self.hidden_size] * self.num_layers + [1], 1.0)
        return {"params": {"actor": jax.tree.map(jnp.asarray, self.bank), "critic": critic}}

    def apply(self, variables: dict, obs: dict):
        act = ACTIVATIONS[self.activation]
        params = variables["params"]
        x = obs["obs"].reshape(obs["obs"].shape[0], -1).astype(jnp.float32)
        logits = self._mixture(params["actor"], x, obs["expert"], act)
        critic_in = jnp.concatenate([x, jax.nn.one_hot(obs["expert"], self.num_experts, dtype=x.dtype)], axis=-1)
        return distrax.Categorical(logits=logits), mlp_apply(params["critic"], critic_in, act)[:, 0]


def failed_experts(run_dir: Path, state: Any, load: Any) -> dict:
    """skill -> the last attempt's expert of each failed skill of a run (kept in its directory when it
    failed): the chain phase may start from it. `load(directory)` reads one expert."""
    out = {}
    for r in state.by_status("failed"):
        directory = Path(run_dir) / "skills" / r.dirname
        if (directory / "expert").is_dir():
            out[r.name] = load(directory)
    return out


def chain_target(library: SkillLibrary, available: list[str], target: str) -> str:
    """The skill the chain is tuned towards: `target` when it and its whole closure have experts;
    for "all" (or a target without one), the skill with the longest closure that has."""
    ok = [s for s in available if s in library and all(d in available for d in library.closure(s))]
    if not ok:
        raise SkillError("no skill has experts for itself and all its dependencies: there is no chain to tune.")
    try:  # the composed agent's choice among the skills whose chain is whole
        return choose_target(library, ok, target)
    except SkillError:  # none of them on the way to `target`: the deepest of them
        return choose_target(library, ok, "all")


class ChainTuner(PPOStage):
    """PPO over the chain towards `target`; `experts` maps skill -> expert (`skills.moe` trees)."""

    def __init__(self, config: Any, skill_env: Any, base_params: Any, library: SkillLibrary, experts: dict,
                 target: str):
        comp, self.plan = build_composition(skill_env, library, experts, target)
        ppo = config.chain_ppo_config()
        policy = ChainPolicy(comp.bank, ppo.hidden_size, ppo.num_layers, ppo.activation, config.chain_moe_dispatch)
        super().__init__(config, ppo, ChainEnv(skill_env), ChainParams(base_params, comp.plan, comp.needs), policy)

    def experts(self, runner: Any) -> dict:
        """skill -> tuned actor (host arrays), in plan order."""
        bank = jax.tree.map(lambda x: np.asarray(x[0]), runner.train_state.params["actor"])
        return {s: {"actor": jax.tree.map(lambda w: w[i], bank)} for i, s in enumerate(self.plan)}


def save_chain(run_dir: Path, plan: list[str], tuned: dict, meta: dict) -> None:
    """The tuned experts under RUN/chain/expert (one Orbax checkpoint, finalised atomically)."""
    save_expert(Path(run_dir) / CHAIN_DIR, {s: tuned[s] for s in plan}, {**meta, "plan": list(plan)})


def with_chain(run_dir: Path, chain: dict, experts: dict) -> dict:
    """`experts` (skill -> expert) with the chain's tuned experts in place of the skills' own once the
    run's chain fine-tuning (`chain`, the state file's record) is done; the chain's target joins them,
    even one that failed as a skill."""
    if chain.get("status") != "done":
        return dict(experts)
    like = next(iter(experts.values()))["actor"]
    return {**experts, **load_chain(run_dir, chain["plan"], like)}


def load_chain(run_dir: Path, plan: list[str], like_actor: Any) -> dict:
    """skill -> {"actor": tuned actor} for the chain's `plan` (see `save_chain`)."""
    return load_expert(Path(run_dir) / CHAIN_DIR, {s: {"actor": like_actor} for s in plan})


__all__ = ["CHAIN_DIR", "ChainEnv", "ChainParams", "ChainPolicy", "ChainState", "ChainTuner", "chain_target", "failed_experts",
           "load_chain", "save_chain", "with_chain"]
