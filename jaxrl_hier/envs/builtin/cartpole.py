"""CartPole (Barto, Sutton & Anderson 1983) in pure JAX, with a time limit that truncates.

Same dynamics and thresholds as gym's CartPole-v1. Reaching `max_steps` is a truncation, not a
termination, so it exercises the learner's bootstrap from the last observation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold: float = 12 * 2 * jnp.pi / 360
    x_threshold: float = 2.4
    max_steps: int = 500


@struct.dataclass
class CartPoleState:
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


class CartPole(Environment):
    name = "CartPole-v1"

    @property
    def default_params(self) -> CartPoleParams:
        return CartPoleParams()

    def _obs(self, s: CartPoleState) -> jax.Array:
        return jnp.stack([s.x, s.x_dot, s.theta, s.theta_dot]).astype(jnp.float32)

    def reset(self, key, params):
        x, x_dot, theta, theta_dot = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
        state = CartPoleState(x, x_dot, theta, theta_dot, jnp.int32(0))
        return self._obs(state), state

    def step(self, key, state, action, params):
        p = params
        force = jnp.where(action == 1, p.force_mag, -p.force_mag)
        cos, sin = jnp.cos(state.theta), jnp.sin(state.theta)
        total_mass = p.masscart + p.masspole
        pml = p.masspole * p.length
        temp = (force + pml * state.theta_dot**2 * sin) / total_mass
        theta_acc = (p.gravity * sin - cos * temp) / (p.length * (4.0 / 3.0 - p.masspole * cos**2 / total_mass))
        x_acc = temp - pml * theta_acc * cos / total_mass
        new = CartPoleState(
            x=state.x + p.tau * state.x_dot,
            x_dot=state.x_dot + p.tau * x_acc,
            theta=state.theta + p.tau * state.theta_dot,
            theta_dot=state.theta_dot + p.tau * theta_acc,
            time=state.time + 1,
        )
        terminated = (jnp.abs(new.x) > p.x_threshold) | (jnp.abs(new.theta) > p.theta_threshold)
        truncated = (new.time >= p.max_steps) & ~terminated
        return self._obs(new), new, jnp.float32(1.0), terminated, truncated, {}

    def observation_space(self, params):
        high = jnp.array([params.x_threshold * 2, jnp.inf, params.theta_threshold * 2, jnp.inf], jnp.float32)
        return Box(-high, high, (4,), jnp.float32)

    def action_space(self, params):
        return Discrete(2)
