"""Generalised advantage estimation that keeps termination and truncation apart.

A terminated episode has no future: its bootstrap value is 0. A truncated episode (a time
limit) does have one: it bootstraps from the value of its *last* observation, which the
vectorised env hands back as ``info["final_obs"]`` because the obs it returns already belongs
to the next episode. Either way the advantage recursion stops at the episode boundary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    final_values: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets for a rollout of T steps (time on the leading axis).

    Args:
      rewards, values, terminated, truncated: [T, ...] per step; ``values[t] = V(s_t)``.
      final_values: [T, ...] ``V(final_obs_t)``; only read where ``truncated[t]``.
      last_value: [...] ``V(s_T)``, the value of the observation after the last step.
    Returns:
      (advantages, targets), both [T, ...], with ``targets = advantages + values``.
    """
    terminated = terminated.astype(values.dtype)
    truncated = truncated.astype(values.dtype)
    done = jnp.maximum(terminated, truncated)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    # Where the episode ended, the next value is not V(s_{t+1}) (a fresh episode) but 0 on
    # termination or V(final_obs) on truncation.
    bootstrap = jnp.where(done > 0, (1.0 - terminated) * final_values, next_values)
    deltas = rewards + gamma * bootstrap - values

    def backward(carry, x):
        delta, d = x
        adv = delta + gamma * gae_lambda * (1.0 - d) * carry
        return adv, adv

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, done), reverse=True)
    return advantages, advantages + values
