"""Vectorised environments: N envs stepped with vmap, episode statistics, and reset schemes.

    vec = make_vec_env(env, params, num_envs=256, reset_mode="pool")
    obs, vstate = vec.reset(key)
    obs, vstate, reward, terminated, truncated, info = vec.step(key, vstate, action)

`obs` is already the first observation of the next episode for envs that finished; `info` holds
`final_obs` (the observation that ended the episode, for the truncation bootstrap),
`returned_episode`, `episode_return`, `episode_length`, `achievements` (bool[N, A]) of the
episodes that finished on this step, `env` (the env's own `info` of this step, per env), and
`reset_slot` (which fresh world each env received, -1 for none: used to check that no world is
handed out twice).

Reset schemes (`reset_mode`):

- "auto": every step computes a reset for every env and keeps it where the episode ended. Exact
  and simple, but a Craftax reset builds nine floors, so this is the slow baseline.
- "optimistic": every step generates M = N // reset_ratio fresh worlds and hands them, one each,
  to the first M envs that finished (by env index). If more than M finish, the rest get a full
  reset in a rarely taken branch, never a copy of a world already handed out (the bug of
  Craftax_Baselines#11 / Stoa#5). Cost: M resets every step, whatever the done rate.
- "pool": a pool of `pool_size` fresh worlds, refilled in one batch only when it holds fewer
  worlds than envs finished on this step. Finished envs take distinct pool slots in order, and
  each slot counts down its uses. Cost follows the actual done rate (amortised, one reset per
  finished episode plus at most one batch of leftovers per refill); by default each world is used
  once, so world diversity is the same as with "auto". At most `max_resets_per_step` envs (default
  N // reset_ratio) take pool worlds in one step; more take the full-reset branch. With
  `world_uses` U > 1 each pool world starts up to U episodes (never two on one step), so a refill
  comes U times less often: for envs whose episodes end within a few steps (a skill's first wood),
  where generating worlds is most of a step's cost; the episodes a world starts differ in their
  step keys only.
- "none": never reset (finished envs keep stepping their final state). Only a throughput bound for
  benchmarks, not for training.

An env that defines `restart` (see `Environment.restart`; the skills env does, to start a deep
skill's episodes where its own expert takes control) is asked first, in every mode but "none":
finished envs that want a restart start from their own restart state or, without one, from a
random other env's (within the vmapped group of envs); only the others take fresh worlds.

Branches are `lax.cond`s. Under `vmap` a cond with a batched predicate runs both branches, so the
trainer passes its vmapped axis names as `sync_axes`: the predicate is then reduced (any) over
those axes and stays a scalar, and the refill runs for every instance when any needs it. Along
`share_axes` (a subset of them) a refill that runs anyway is not wasted: every instance tops its
pool up, not only the short ones, so the next refill comes no sooner than it would for one
instance alone. Without that, K instances refill K times as often, each time all K of them (K
skills in one program ran slower than one after another). Only axes whose instances always sit
together belong there (the seed axis: every device holds every seed), so results still do not
depend on how env shards are grouped on devices.

Fresh worlds come from `reset_many`: the vec env's, the trainers' evaluations' and every agent's
evaluation's. On XLA:CPU it generates them 8 to a row of a [n / 8, 8] double vmap:
with jax 0.10.2 on a 2-core AMD EPYC, one flat vmapped batch of more than 8 Craftax-Classic resets
in a program of its own gave world i + 8 the terrain noise of world i (of 128 worlds from 128 keys, 8
matched the world their key makes alone); the double vmap gives every key its own world, and cost
4x less a world there (`benchmarks/ppo/world_gen.py` checks and times both, alone and under a
trainer's seed vmap, where the flat batch was right and the two cost the same). Other backends take
one flat batch (not checked there yet: the same script does).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.parallel import max_over_axes

RESET_MODES = ("auto", "optimistic", "pool", "none")


# Worlds vmapped together on XLA:CPU (see the module docstring): flat vmapped batches of more
# Craftax-Classic resets came out wrong there.
CPU_RESET_BLOCK = 8


def default_reset_block() -> int:
    """`reset_many`'s block on this backend: 8 on XLA:CPU, 0 (one vmap of them all) elsewhere."""
    return CPU_RESET_BLOCK if jax.default_backend() == "cpu" else 0


def reset_many(env: Any, params: Any, keys: jax.Array, block: int | None = None) -> tuple[Any, Any]:
    """(obs, state) of one fresh world per key (`keys` [n]), each the world `env.reset(key, params)`
    makes alone. `block`: worlds vmapped together in the inner of two vmaps ([n // block, block],
    the remainder apart); None: `default_reset_block()`."""
    if block is None:
        block = default_reset_block()
    reset = jax.vmap(env.reset, in_axes=(0, None))
    n = keys.shape[0]
    if not block or n <= block:
        return reset(keys, params)
    whole = n - n % block
    worlds = jax.vmap(reset, in_axes=(0, None))(keys[:whole].reshape(whole // block, block, *keys.shape[1:]), params)
    worlds = jax.tree.map(lambda x: x.reshape(whole, *x.shape[2:]), worlds)
    if whole == n:
        return worlds
    rest = reset(keys[whole:], params)
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), worlds, rest)


class VecState(struct.PyTreeNode):
    env_state: Any  # [N, ...]
    episode_return: jax.Array  # [N] running return of the current episode
    episode_length: jax.Array  # [N]
    pool_state: Any  # [K, ...] fresh worlds ("pool" and "optimistic"); K = 0 otherwise
    pool_obs: Any  # [K, ...]
    pool_left: jax.Array  # int32[K]: episodes the slot's world may still start (0: empty)


def _where(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per-env select over pytrees whose leaves have the env axis first."""
    return jax.tree.map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)


@dataclasses.dataclass(frozen=True)
class VecEnv:
    env: Any
    params: Any
    num_envs: int
    reset_mode: str = "pool"
    reset_ratio: int = 16
    pool_size: int = 0  # 0: 2 * max_resets_per_step
    max_resets_per_step: int = 0  # 0: num_envs // reset_ratio (at least 1)
    sync_axes: tuple[str, ...] = ()
    share_axes: tuple[str, ...] = ()  # subset of sync_axes along which refills top every pool up
    world_uses: int = 1  # "pool": episodes each fresh world starts

    # ------------------------------------------------------------------ sizes and spaces
    @property
    def resets_per_step(self) -> int:
        return min(self.num_envs, self.max_resets_per_step or max(1, self.num_envs // self.reset_ratio))

    @property
    def pool_capacity(self) -> int:
        if self.reset_mode == "optimistic":
            return self.resets_per_step
        if self.reset_mode == "pool":
            return self.pool_size or 2 * self.resets_per_step
        return 0

    @property
    def observation_space(self):
        return self.env.observation_space(self.params)

    @property
    def action_space(self):
        return self.env.action_space(self.params)

    @property
    def achievement_names(self) -> tuple[str, ...]:
        return tuple(getattr(self.env, "achievement_names", ()))

    # ------------------------------------------------------------------ helpers
    def _reset_many(self, key: jax.Array, n: int):
        return reset_many(self.env, self.params, jax.random.split(key, n))

    def any_over_axes(self, pred: jax.Array, axes: tuple[str, ...] | None = None) -> jax.Array:
        """`pred` reduced over the caller's vmapped axes (default: `sync_axes`, so that lax.cond
        stays a real branch)."""
        return max_over_axes(pred.astype(jnp.int32), self.sync_axes if axes is None else axes) > 0

    # ------------------------------------------------------------------ API
    def reset(self, key: jax.Array) -> tuple[Any, VecState]:
        k_env, k_pool = jax.random.split(key)
        obs, state = self._reset_many(k_env, self.num_envs)
        k = self.pool_capacity
        if k:
            pool_obs, pool_state = self._reset_many(k_pool, k)
            left = jnp.full(k, self.world_uses if self.reset_mode == "pool" else 0, jnp.int32)
        else:
            pool_obs, pool_state, left = None, None, jnp.zeros(0, jnp.int32)
        zeros = jnp.zeros(self.num_envs, jnp.float32)
        return obs, VecState(state, zeros, jnp.zeros(self.num_envs, jnp.int32), pool_state, pool_obs, left)

    def step(self, key: jax.Array, vstate: VecState, action: jax.Array):
        k_step, k_reset = jax.random.split(key)
        keys = jax.random.split(k_step, self.num_envs)
        obs, state, reward, terminated, truncated, env_info = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
            keys, vstate.env_state, action, self.params
        )
        done = terminated | truncated
        ep_return = vstate.episode_return + reward
        ep_length = vstate.episode_length + 1
        achievements = jax.vmap(self.env.achievements)(state) & done[:, None]
        info = {
            "final_obs": obs,
            "returned_episode": done,
            "episode_return": jnp.where(done, ep_return, 0.0),
            "episode_length": jnp.where(done, ep_length, 0),
            "achievements": achievements,
            "env": env_info,  # the env's own info, per env (unused parts cost nothing under jit)
        }
        vstate = vstate.replace(env_state=state, episode_return=jnp.where(done, 0.0, ep_return),
                                episode_length=jnp.where(done, 0, ep_length))
        obs, vstate, slot = self._apply_resets(k_reset, vstate, obs, done)
        info["reset_slot"] = slot
        return obs, vstate, reward, terminated, truncated, info

    # ------------------------------------------------------------------ reset schemes
    def _apply_resets(self, key, vstate: VecState, obs, done):
        no_slot = jnp.full(self.num_envs, -1, jnp.int32)
        if self.reset_mode == "none":
            return obs, vstate, no_slot
        if self.reset_mode == "auto":
            obs, vstate, done = self._restart(key, vstate, obs, done)
            reset_obs, reset_state = self._reset_many(key, self.num_envs)
            return (_where(done, reset_obs, obs), vstate.replace(env_state=_where(done, reset_state, vstate.env_state)),
                    no_slot)
        obs, vstate, done = self._restart(key, vstate, obs, done)
        k_pool, k_fallback = jax.random.split(key)
        if self.reset_mode == "optimistic":
            # M fresh worlds every step, whatever the done rate.
            pool_obs, pool_state = self._reset_many(k_pool, self.pool_capacity)
            vstate = vstate.replace(pool_obs=pool_obs, pool_state=pool_state,
                                    pool_left=jnp.ones(self.pool_capacity, jnp.int32))
        else:
            vstate = self._refill_if_short(k_pool, vstate, done.sum())
        obs, vstate, slot, served = self._take_from_pool(vstate, obs, done)
        return (*self._fallback(k_fallback, vstate, obs, done & ~served), slot)

    def _restart(self, key, vstate: VecState, obs, done):
        """(obs, vstate, done left for fresh worlds) after the env's own `restart`, if it has one."""
        if getattr(self.env, "restart", None) is None:  # envs outside our base class have none
            return obs, vstate, done
        k_env, k_pick = jax.random.split(jax.random.fold_in(key, 1))  # apart from the fresh worlds' key
        keys = jax.random.split(k_env, self.num_envs)
        r_obs, r_state, valid, want = jax.vmap(self.env.restart, in_axes=(0, 0, None))(
            keys, vstate.env_state, self.params)
        # An env that wants a restart but has no state of its own borrows a random other env's, so a
        # state that is rare to reach serves every env, not only the one that reached it: a uniform
        # pick among the envs that have one, one integer per env (a Gumbel pick over every pair of
        # envs would draw num_envs^2 numbers a step).
        holders = jnp.nonzero(valid, size=self.num_envs, fill_value=0)[0]  # the envs with a state, first
        pick = jax.random.randint(k_pick, valid.shape, 0, jnp.maximum(valid.sum(), 1))
        source = jnp.where(valid, jnp.arange(self.num_envs), holders[pick])
        r_obs, r_state = jax.tree.map(lambda x: x[source], (r_obs, r_state))
        take = done & want & valid.any()
        return _where(take, r_obs, obs), vstate.replace(env_state=_where(take, r_state, vstate.env_state)), done & ~take

    def _refill_if_short(self, key, vstate: VecState, need: jax.Array) -> VecState:
        """Fill the empty slots of the pool with fresh worlds, only when it cannot serve `need`."""

        short = (vstate.pool_left > 0).sum() < jnp.minimum(need, self.resets_per_step)
        # Instances that take fresh worlds: the short ones, and their peers along share_axes.
        take = self.any_over_axes(short, self.share_axes)

        def refill(v: VecState) -> VecState:
            # The branch may run because another vmapped instance is short (sync_axes); only the
            # instances that `take` keep the fresh worlds, so results do not depend on how envs
            # are grouped (share_axes never spans env groups).
            fresh_obs, fresh_state = self._reset_many(key, self.pool_capacity)
            keep = (v.pool_left > 0) | ~take
            return v.replace(pool_obs=_where(keep, v.pool_obs, fresh_obs),
                             pool_state=_where(keep, v.pool_state, fresh_state),
                             pool_left=jnp.where(keep, v.pool_left, self.world_uses))

        return jax.lax.cond(self.any_over_axes(short), refill, lambda v: v, vstate)

    def _take_from_pool(self, vstate: VecState, obs, done):
        """Hand distinct pool worlds to (up to `resets_per_step`) finished envs, in env order.

        Only R = resets_per_step rows are gathered and scattered, so a step's memory traffic does
        not grow with N; the i-th finished env takes the i-th slot with uses left, so no two envs
        share one on a step.
        """
        r, n, k = self.resets_per_step, self.num_envs, self.pool_capacity
        envs = jnp.nonzero(done, size=r, fill_value=n)[0]  # first R finished envs (n = none)
        slots = jnp.nonzero(vstate.pool_left > 0, size=r, fill_value=k)[0]  # first R worlds with uses left
        pair = (envs < n) & (slots < k)
        envs = jnp.where(pair, envs, n)  # out-of-range indices are dropped by the scatters
        slots_read = jnp.where(pair, slots, 0)
        put = lambda dst, src: dst.at[envs].set(src[slots_read], mode="drop")  # noqa: E731
        state = jax.tree.map(put, vstate.env_state, vstate.pool_state)
        obs = jax.tree.map(put, obs, vstate.pool_obs)
        left = vstate.pool_left.at[jnp.where(pair, slots, k)].add(-1, mode="drop")
        slot = jnp.full(n, -1, jnp.int32).at[envs].set(slots.astype(jnp.int32), mode="drop")
        served = jnp.zeros(n, bool).at[envs].set(True, mode="drop")
        return obs, vstate.replace(env_state=state, pool_left=left), slot, served

    def _fallback(self, key, vstate: VecState, obs, pending):
        """Full resets for finished envs the pool could not serve (rare; a real branch)."""

        def reset_pending(args):
            o, v = args
            fresh_obs, fresh_state = self._reset_many(key, self.num_envs)
            return _where(pending, fresh_obs, o), v.replace(env_state=_where(pending, fresh_state, v.env_state))

        return jax.lax.cond(self.any_over_axes(pending.any()), reset_pending, lambda a: a, (obs, vstate))


def make_vec_env(env, params, num_envs: int, reset_mode: str = "pool", reset_ratio: int = 16, *,
                 pool_size: int = 0, max_resets_per_step: int = 0, sync_axes: tuple[str, ...] = (),
                 share_axes: tuple[str, ...] = (), world_uses: int = 1) -> VecEnv:
    """N copies of `env` stepped together; see the module docstring for the reset schemes."""
    if reset_mode not in RESET_MODES:
        raise ConfigError(f"unknown reset_mode '{reset_mode}': use one of {', '.join(RESET_MODES)}.")
    if world_uses < 1 or (world_uses > 1 and reset_mode != "pool"):
        raise ConfigError(f"world_uses must be 1, or more with reset_mode 'pool' (got {world_uses} with "
                          f"'{reset_mode}').")
    if num_envs < 1 or reset_ratio < 1 or pool_size < 0 or max_resets_per_step < 0:
        raise ConfigError("num_envs and reset_ratio must be positive; pool_size and max_resets_per_step >= 0.")
    if not set(share_axes) <= set(sync_axes):
        raise ConfigError(f"share_axes {tuple(share_axes)} must be a subset of sync_axes {tuple(sync_axes)}.")
    return VecEnv(env, params, num_envs, reset_mode, reset_ratio, pool_size, max_resets_per_step, tuple(sync_axes),
                  tuple(share_axes), int(world_uses))
