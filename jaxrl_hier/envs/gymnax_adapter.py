"""Any gymnax environment as `gymnax:<name>`, on the jaxrl_hier protocol.

gymnax 1.x `step` auto-resets; we call `step_env` (no reset) and its `is_truncated` (the time
limit) ourselves, keeping termination and truncation apart as gymnax 1.x does.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete


def _gymnax():
    try:
        import gymnax
    except ImportError:
        raise ConfigError("gymnax environments need gymnax 1.x: pip install -e \".[gymnax]\"") from None
    return gymnax


def gymnax_names() -> list[str]:
    try:
        return [f"gymnax:{n}" for n in _gymnax().registered_envs]
    except ConfigError:
        return []


class GymnaxEnv(Environment):
    def __init__(self, env_id: str, **kwargs):
        gymnax = _gymnax()
        if env_id not in gymnax.registered_envs:
            from jaxrl_hier.config import closest

            raise ConfigError(f"unknown gymnax environment '{env_id}'.{closest(env_id, gymnax.registered_envs)} "
                              f"Known: {', '.join(gymnax.registered_envs)}.")
        self._env, self._params = gymnax.make(env_id, **kwargs)
        self.name = f"gymnax:{env_id}"

    @property
    def default_params(self):
        return self._params

    def reset(self, key, params):
        return self._env.reset_env(key, params)

    def step(self, key, state, action, params):
        obs, state, reward, terminated, _ = self._env.step_env(key, state, action, params)
        terminated = jnp.asarray(terminated, bool)
        truncated = jnp.asarray(self._env.is_truncated(state, params), bool) & ~terminated
        return obs, state, jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool), jnp.asarray(truncated, bool), {}

    def observation_space(self, params):
        space = self._env.observation_space(params)
        return Box(space.low, space.high, tuple(space.shape), jnp.float32)

    def action_space(self, params):
        space = self._env.action_space(params)
        if not hasattr(space, "n"):
            raise ConfigError(f"{self.name} has a continuous action space; jaxrl_hier's PPO needs discrete actions.")
        return Discrete(int(space.n))
