"""A batch of multi-turn text episodes as one compiled loop over turns (`tasks.text_games_jax` protocol).

`compiled_rollout(env, sample, state_len)` returns `rollout(policy, env_state, obs_ids, obs_mask, key,
greedy) -> (env_state, Turns)`, a pure function to jit: a `lax.scan` over the env's `max_turns`
turns in which the speaking role samples every episode's utterance from the context so far
(`sample(turn, policy, ids, mask, key, greedy) -> GenerateOutput`, e.g. `sample_tokens` with the
speaker's adapter), the environment computes its reply from the token ids, and the reply is appended.

The context is a static [B, state_len] window, left-padded, that every turn shifts left by the env's
`append_len` and fills at the right with the turn's append (itself left-padded, so the last column,
from which sampling continues, is a real token). A reply shorter than `append_len` leaves padding
(mask 0) inside the context; the sampling core numbers positions by the mask's
cumulative sum and attends only where it is 1, so the model reads the same tokens at the same
positions as from the compact left-padded text. state_len must hold the first observation and
max_turns - 1 appends (the last turn's append is never read: every episode has ended).

`Turns` holds per turn (leading axis: turn) exactly what the host loop (`GuidedAgent.rollout`)
records per turn, so the replay buffer, critic and policy steps read either: the state and next
state, the utterance and its log-probs under the sampler, reward, done (1 for rows whose episode had
already ended) and valid (1 where the episode was live when the turn began).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_hier.config import ConfigError


class Turns(NamedTuple):
    state: jax.Array        # [T, B, S]
    state_mask: jax.Array   # [T, B, S]
    action: jax.Array       # [T, B, N]
    action_mask: jax.Array  # [T, B, N]
    logprobs: jax.Array     # [T, B, N]
    reward: jax.Array       # [T, B]
    next_state: jax.Array   # [T, B, S]
    next_mask: jax.Array    # [T, B, S]
    done: jax.Array         # [T, B]
    valid: jax.Array        # [T, B]


def check_state_len(env: Any, state_len: int) -> None:
    need = env.obs_len + (env.max_turns - 1) * env.append_len
    if state_len < need:
        raise ConfigError(f"the compiled turn loop needs states of {need} tokens (first observation {env.obs_len} + "
                          f"{env.max_turns - 1} turns x {env.append_len}), but states are {state_len} long.")


def compiled_rollout(env: Any, sample: Callable[..., Any], state_len: int) -> Callable[..., tuple[Any, Turns]]:
    """The turn loop of `env` (module docstring). `sample(turn, policy, ids, mask, rng, greedy)` returns
    the turn's `GenerateOutput`; `turn` is traced, so a sampler with several roles picks the speaker's
    adapter with `lax.switch` (`switch_roles`)."""
    check_state_len(env, state_len)
    T, S, A = env.max_turns, state_len, env.append_len

    def rollout(policy: Any, env_state: Any, obs_ids: jax.Array, obs_mask: jax.Array, key: jax.Array,
                greedy: bool = False) -> tuple[Any, Turns]:
        b, o = obs_ids.shape
        ids = jnp.concatenate([jnp.full((b, S - o), env.pad, jnp.int32), obs_ids.astype(jnp.int32)], axis=1)
        mask = jnp.concatenate([jnp.zeros((b, S - o), jnp.int32), obs_mask.astype(jnp.int32)], axis=1)

        def turn(carry, t):
            env_state, ids, mask = carry
            out = sample(t, policy, ids, mask, jax.random.fold_in(key, t), greedy)
            valid = ~env_state.done
            env_state, app, app_mask, reward, done = env.step(env_state, out.tokens, out.mask)
            next_ids = jnp.concatenate([ids[:, A:], app], axis=1)
            next_mask = jnp.concatenate([mask[:, A:], app_mask.astype(jnp.int32)], axis=1)
            row = Turns(ids, mask, out.tokens, out.mask, out.logprobs, reward, next_ids, next_mask,
                        jnp.where(valid, done, True).astype(jnp.float32), valid.astype(jnp.float32))
            return (env_state, next_ids, next_mask), row

        (env_state, _, _), turns = jax.lax.scan(turn, (env_state, ids, mask), jnp.arange(T))
        return env_state, turns

    return rollout


def switch_roles(turn_roles: tuple[int, ...], samplers: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    """A `sample(turn, ...)` that calls samplers[turn_roles[turn]] (one role: no switch)."""
    if len(samplers) == 1:
        return lambda turn, *args: samplers[0](*args)
    roles = jnp.asarray(turn_roles, jnp.int32)
    return lambda turn, *args: jax.lax.switch(roles[turn], samplers, *args)


__all__ = ["Turns", "compiled_rollout", "check_state_len", "switch_roles"]
