"""Train several skills at once: one PPO program whose seed axis holds one skill per slot.

`algorithms.ppo` already vmaps whole runs over a leading seed axis, each with its own env params
and extra (non-trainable) network variables. Here each slot of that axis is a skill: its env params
carry the skill's conditions (`skills.env`), its extra variables the frozen experts of its
dependencies (`skills.moe`). So the skills running at once train in one compiled program, and on
several devices each slot's envs are split over the `data` mesh as in a plain PPO run. A slot is
(re)started by initialising fresh state for it and swapping it in; the other slots go on untouched.
Python only acts between rounds of `updates_per_round` updates.

Idle slots cost nothing: a round takes only the active slots out of the runner, with their frozen
expert banks cut to the longest plan among them (rounded up to a power of two; all `max_experts`
rows with `bank_shapes: max`), trains that, and puts it back. So there is one compiled program per
(number of active slots, bank rows): a handful of shapes in a run, each compiled once. The stored
runner keeps the full shape (`max_parallel_skills` slots, `max_experts` bank rows), so checkpoints
do not depend on which slots were active.

After each round every active skill is also evaluated greedily (argmax actions, of the frozen
experts too): `num_envs` fresh episodes per slot, each given the round's rollout length
(`num_steps * updates_per_round` steps); an episode still running then counts as a failure.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.algorithms.ppo import ROLLOUT_AXES, make_train
from jaxrl_hier.checkpointing.checkpoints import Checkpointer, CheckpointError
from jaxrl_hier.envs.vec import reset_many
from jaxrl_hier.runs import is_primary, sync_processes
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.env import SkillEnv
from jaxrl_hier.skills.moe import MoEPolicy
from jaxrl_hier.skills.quantities import env_quantities
from jaxrl_hier.skills.spec import SkillLibrary


class RoundResult(NamedTuple):
    """One slot's round. Rates count the episodes in which the skill's own expert took control (every
    dependency held; see `SkillEnv`), so frozen dependencies' failures do not count against it."""

    success_rate: float | None  # successes / reached episodes in the round (None: none reached)
    episodes: int  # episodes that reached the skill's own expert
    steps: int  # env steps this slot took in the round
    episode_return: float | None
    episode_length: float | None
    greedy_success_rate: float | None = None  # the same rate, greedy evaluation after the round
    greedy_episodes: int = 0
    chain_success_rate: float | None = None  # successes / fresh-world episodes: the whole chain, dependencies
    # included (episodes restarted from an anchor, see `SkillEnv`, are left out)
    fresh_success_rate: float | None = None  # successes / fresh-world episodes that reached the skill's expert
    fresh_episodes: int = 0  # fresh-world episodes that reached the skill's expert


IDLE = RoundResult(None, 0, 0, None, None)


def quantities_for(env: Any, library: SkillLibrary) -> dict:
    """The env's named quantities plus one per Python-predicate skill of the library."""
    out = dict(env_quantities(env))
    for skill in library.predicate_skills():
        out[skill.predicate_quantity] = skill.predicate
    return out


class SkillTrainer:
    """Slots of concurrently trained skills on top of `algorithms.ppo`."""

    def __init__(self, config: SkillsConfig, catalog: SkillLibrary):
        self.config = config
        self.env, self.base_params, self.policy = skill_env_and_policy(config, catalog)
        base, base_params = self.env.base, self.base_params
        ppo_config = config.skill_ppo_config()
        self.ppo = make_train(ppo_config, env=self.env, env_params=self.env.default_params, network=self.policy)
        self.slots = config.max_parallel_skills
        self.steps_per_update = ppo_config.num_envs * ppo_config.num_steps
        self.runner = None
        self._ckpt: Checkpointer | None = None
        self._obs_dim = int(np.prod(base.observation_space(base_params).shape))
        self.eval_steps = ppo_config.num_steps * config.updates_per_round
        # Named like PPO's seed axis, so the policy's row-count branch stays a branch here too.
        self._eval = jax.jit(jax.vmap(self._greedy_eval, in_axes=(0, 0, 0, 0, None), axis_name="seed"),
                             static_argnums=4)
        # Jitted once here: a jax.jit made inside a method call is a new function each time, and
        # compiles again on every skill start (minutes on a loaded 2-core CPU).
        self._select = jax.jit(_select, static_argnums=2)
        self._merge = jax.jit(_merge)
        self._swap = jax.jit(_swap_in)
        # Every slot's fresh state in one program, compiled once: stacking the slots' env params and
        # frozen-expert banks, splitting the key and the PPO init (a skill start was dozens
        # of tiny eager ops, one of which hung with XLA:CPU in jaxlib 0.10.2; see `_fresh`).
        self._init_slots = jax.jit(self._init_stacked)
        # Host zeros from the expert's shapes (no dispatch): the padding rows of a bank and the restore
        # target of a saved expert, where the eager orthogonal init used to run each time.
        self._zero_expert = self.policy.expert_zeros(self._obs_dim)

    @property
    def quantity_names(self) -> tuple[str, ...]:
        return self.env.quantity_names

    # ------------------------------------------------------------------ slot state
    def _slot_inputs(self, library: SkillLibrary | None, name: str | None, experts: dict[str, Any]):
        """Env params and extra variables of one slot (`name` None: an idle slot)."""
        if name is None:
            params = self.env.default_params
            plan: tuple[str, ...] = ()
        else:
            params = self.env.params_for(self.base_params, library, name)
            plan = library.closure(name)
        # Host arrays only (numpy): no JAX op runs here; `_init_stacked` stacks the slots on device.
        rows = [experts[d]["actor"] for d in plan]
        rows += [self._zero_expert["actor"]] * (self.config.max_experts - len(plan))
        bank = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *rows)
        extra = {"experts": {"actor": bank, "plan_len": np.int32(len(plan))}}
        return params, extra

    def _init_stacked(self, key: jax.Array, env_params: list, extras: list):
        """Jitted (`_init_slots`): the per-slot inputs stacked on a slot axis, then one fresh runner
        state per slot. The same ops as the eager stacking it replaces, so the same numbers."""
        env_params = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *env_params)
        extra = jax.tree.map(lambda *xs: jnp.stack(xs), *extras)
        keys = jax.random.split(key, self.slots)
        return jax.vmap(self.ppo._init_one)(keys, extra, env_params)

    def _fresh(self, inputs: list[tuple[Any, Any]], key: jax.Array):
        # Built on one device, then laid out: with XLA:CPU (jaxlib 0.10) and 4 simulated devices, this
        # init compiled with sharded outputs (skill env + MoE policy) hung on its first run; the cause is
        # not pinned down. It runs once per started skill, small next to a round of training.
        fresh = self._init_slots(key, [p for p, _ in inputs], [e for _, e in inputs])
        return jax.device_put(fresh, self.ppo.shardings(fresh))

    def init(self, key: jax.Array) -> None:
        """All slots idle."""
        self.runner = self._fresh([self._slot_inputs(None, None, {})] * self.slots, key)

    def start(self, slots: dict[int, str], library: SkillLibrary, experts: dict[str, Any], key: jax.Array) -> None:
        """(Re)start skills in the given slots with fresh parameters; other slots continue."""
        if not slots:
            return
        inputs = [self._slot_inputs(library, slots.get(i), experts) if i in slots else self._slot_inputs(None, None, {})
                  for i in range(self.slots)]
        fresh = self._fresh(inputs, key)
        take = np.array([i in slots for i in range(self.slots)])
        self.runner = jax.device_put(self._swap(self.runner, fresh, take), self.ppo.shardings(self.runner))

    def set_restart_prob(self, slot: int, prob: float) -> None:
        """Set one slot's restart probability (env params are data: nothing recompiles). The
        scheduler sets 0 for a skill's fresh-world phase; checkpoints keep it."""
        skill = self.runner.env_params.skill
        probs = np.array(skill.restart_prob)  # a host copy: no eager device op (see `_init_slots`)
        probs[slot] = prob
        skill = skill.replace(restart_prob=probs)
        runner = self.runner.replace(env_params=self.runner.env_params.replace(skill=skill))
        self.runner = jax.device_put(runner, self.ppo.shardings(self.runner))

    def restart_prob(self, slot: int) -> float:
        return float(np.asarray(self.runner.env_params.skill.restart_prob)[slot])

    def active_slots(self) -> list[int]:
        """Slots that hold a skill (read from the runner, so it holds after a restore too)."""
        return [int(i) for i in np.flatnonzero(~self.env.is_idle(self.runner.env_params.skill.success))]

    def train_round(self, active: list[int] | None = None, greedy_eval: bool = True) -> list[RoundResult]:
        """`updates_per_round` PPO updates of the `active` slots (default: every slot holding a skill)
        in one compiled program, then (if `greedy_eval`) a greedy evaluation of each; idle slots take
        no compute. The evaluation draws from its own key, so skipping it changes no training number."""
        active = sorted(self.active_slots() if active is None else active)
        if not active:
            return [IDLE] * self.slots
        idx = jnp.asarray(active, jnp.int32)
        plan_len = np.asarray(self.runner.extra_variables["experts"]["plan_len"])
        rows = bank_rows(int(plan_len[active].max()), self.config.max_experts, self.config.bank_shapes)
        sub = self._select(self.runner, idx, rows)
        sub, metrics = self.ppo.update(jax.device_put(sub, self.ppo.shardings(sub)), self.config.updates_per_round)
        if greedy_eval:
            greedy_success, greedy_episodes = self._eval(sub.train_state.params, sub.extra_variables, sub.env_params,
                                                         jax.vmap(lambda k: jax.random.fold_in(k, 1))(sub.key),
                                                         self.eval_steps)
        else:
            greedy_success = greedy_episodes = np.zeros(len(active), np.int32)
        self.runner = jax.device_put(self._merge(self.runner, sub, idx), self.ppo.shardings(self.runner))
        host = jax.tree.map(np.asarray, metrics)
        greedy_success, greedy_episodes = np.asarray(greedy_success), np.asarray(greedy_episodes)
        episodes = host["episodes"]  # [updates, active slots]
        out = [IDLE] * self.slots
        for j, slot in enumerate(active):
            n = float(episodes[:, j].sum())

            def total(x: np.ndarray) -> float:
                return float(np.nansum(x * episodes[:, j]))

            def mean(x: np.ndarray) -> float | None:
                return total(x) / n if n else None

            successes, reached, restarted, chain, fresh_reached = (total(host["achievements"][:, j, i])
                                                                   for i in range(5))
            fresh = n - restarted  # episodes that began in a fresh world: the chain's rate counts only these
            reached_greedy = int(greedy_episodes[j])
            out[slot] = RoundResult(successes / reached if reached else None, int(round(reached)),
                                    self.config.updates_per_round * self.steps_per_update,
                                    mean(host["episode_return"][:, j]), mean(host["episode_length"][:, j]),
                                    float(greedy_success[j]) / reached_greedy if reached_greedy else None,
                                    reached_greedy, chain / fresh if fresh > 0.5 else None,
                                    chain / fresh_reached if fresh_reached > 0.5 else None, int(round(fresh_reached)))
        return out

    def _greedy_eval(self, params: Any, extra: Any, env_params: Any, key: jax.Array, horizon: int):
        """One slot: (successes, reached episodes) among `num_envs` fresh episodes run greedily for at
        most `horizon` steps."""
        n = self.config.ppo_config().num_envs
        k_reset, k_steps = jax.random.split(key)
        obs, state = reset_many(self.env, env_params, jax.random.split(k_reset, n))

        def step(carry, k):
            obs, state, ended, success, reached = carry
            pi, _ = self.ppo.apply(params, extra, obs)
            action = jnp.argmax(pi.logits, axis=-1)
            obs, state, _, terminated, truncated, _ = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k, n), state, action, env_params)
            # Only the first episode counts: an env that ended keeps stepping in the scan.
            success = success | (~ended & state.success)
            reached = reached | (~ended & state.reached)
            return (obs, state, ended | terminated | truncated, success, reached), None

        no = jnp.zeros(n, bool)
        init = (obs, state, no, no, state.reached)
        (_, _, _, success, reached), _ = jax.lax.scan(step, init, jax.random.split(k_steps, horizon))
        return success.sum(), reached.sum().astype(jnp.int32)

    def expert(self, slot: int) -> dict:
        """The trainable expert of `slot`, on the host."""
        return jax.tree.map(lambda x: np.asarray(x[slot]), self.runner.train_state.params)

    # ------------------------------------------------------------------ persistence
    def _checkpointer(self, directory: Path) -> Checkpointer:
        if self._ckpt is None or self._ckpt.directory != Path(directory).absolute():
            # Synchronous: the scheduler writes its state file only after the checkpoint is final.
            self._ckpt = Checkpointer(directory, keep=2, asynchronous=False)
        return self._ckpt

    def _expect(self) -> dict:
        c = self.config.ppo_config()
        return {"env": self.config.env, "slots": self.slots, "num_envs": c.num_envs, "hidden_size": c.hidden_size,
                "num_layers": c.num_layers, "max_experts": self.config.max_experts,
                "max_conditions": self.config.max_conditions, "quantities": len(self.quantity_names)}

    def save_checkpoint(self, directory: Path, step: int, meta: dict) -> None:
        ckpt = self._checkpointer(directory)
        ckpt.save(step, self.runner, {**meta, **self._expect()})
        ckpt.wait()

    def restore_checkpoint(self, directory: Path, step: int) -> None:
        self.runner, _ = self._checkpointer(directory).restore(step, self.runner, self._expect())

    def save_expert(self, directory: Path, expert: Any, meta: dict) -> None:
        save_expert(directory, expert, meta)

    def load_expert(self, directory: Path) -> Any:
        return load_expert(directory, self._zero_expert)


def skill_env_and_policy(config: SkillsConfig, catalog: SkillLibrary) -> tuple[SkillEnv, Any, MoEPolicy]:
    """The skill env over the config's base env (its params, `env_params` applied) and the
    mixture-of-experts policy of the config's network: what training and the composed agent share."""
    base, base_params = config.make_env()
    env = SkillEnv(base, quantities_for(base, catalog), config.max_experts, config.max_conditions,
                   config.restart_prob, config.max_attempt_steps)
    ppo = config.ppo_config()
    policy = MoEPolicy(base.action_space(base_params).n, ppo.hidden_size, ppo.num_layers, ppo.activation,
                       config.max_experts, config.moe_dispatch, sync_axes=ROLLOUT_AXES)
    return env, base_params, policy


def bank_rows(plan_len: int, max_experts: int, shapes: str = "fit") -> int:
    """Frozen bank rows for plans up to `plan_len` long: 0 (no routing at all), else the next power of
    two (`shapes` "fit": a few bank shapes rather than one per plan length) or all `max_experts`
    rows ("max": one shape, for machines where a compile costs more than the unused rows)."""
    if plan_len == 0:
        return 0
    return max_experts if shapes == "max" else min(max_experts, 1 << (plan_len - 1).bit_length())


def _select(runner: Any, idx: jax.Array, rows: int) -> Any:
    """The slots `idx` of the runner, their frozen expert banks cut to `rows` rows."""
    sub = jax.tree.map(lambda x: x[idx], runner)
    experts = sub.extra_variables["experts"]
    experts = {**experts, "actor": jax.tree.map(lambda w: w[:, :rows], experts["actor"])}
    return sub.replace(extra_variables={**sub.extra_variables, "experts": experts})


def _merge(runner: Any, sub: Any, idx: jax.Array) -> Any:
    """Put the trained slots back (env params and frozen experts do not change in training)."""
    put = lambda a, b: a.at[idx].set(b)  # noqa: E731
    return runner.replace(**{f: jax.tree.map(put, getattr(runner, f), getattr(sub, f))
                             for f in ("train_state", "env_state", "obs", "key", "update")})


def _swap_in(old: Any, new: Any, take: jax.Array) -> Any:
    def pick(a, b):
        return jnp.where(take.reshape((-1,) + (1,) * (a.ndim - 1)), b, a)

    return jax.tree.map(pick, old, new)


# ---------------------------------------------------------------------------- experts on disk
def save_expert(directory: Path, expert: dict, meta: dict) -> None:
    """Write one skill's expert parameters under `directory/expert` (Orbax finalises atomically).

    A leftover from an attempt that crashed before the state file said "completed" is replaced:
    removed by process 0 alone, and every process waits for that before Orbax's (multi-process) save."""
    path = Path(directory) / "expert"
    if path.exists() and is_primary():
        shutil.rmtree(path)
    sync_processes("jaxrl_hier.skills:save_expert")
    ckpt = Checkpointer(path, keep=1, asynchronous=False)
    try:
        ckpt.save(0, expert, meta)
    finally:
        ckpt.close()


def load_expert(directory: Path, like: dict) -> dict:
    path = Path(directory) / "expert"
    if not path.is_dir():
        raise CheckpointError(f"the expert of a completed skill is missing: {path}. The run directory is damaged; "
                              "set that skill's status to 'pending' in scheduler_state.json to train it again, or "
                              "start a new --output-dir.")
    ckpt = Checkpointer(path, keep=1, asynchronous=False)
    try:
        state, _ = ckpt.restore(0, like, {})
    finally:
        ckpt.close()
    return jax.tree.map(np.asarray, state)


__all__ = ["IDLE", "RoundResult", "bank_rows", "skill_env_and_policy", "SkillTrainer", "save_expert", "load_expert", "quantities_for"]
