"""The functional environment protocol every jaxrl_hier env follows (gymnax-style).

    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

No auto-reset at this level: the vectorised wrappers in `jaxrl_hier.envs.vec` decide how and
when to reset. `terminated` (the episode really ended) and `truncated` (a time limit) are kept
apart, because a truncated episode must bootstrap from the value of its last observation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


class Environment:
    """Base class; subclasses implement `reset`, `step`, the spaces and `default_params`."""

    name: str = "env"
    achievement_names: tuple[str, ...] = ()
    # Optional `restart(key, final_state, params) -> (obs, state, valid, want)`: an env that defines
    # it may start an env's next episode from a state of its own choosing instead of a fresh world.
    # `valid`: this env has such a state; `want`: its next episode should take one. `envs.vec` asks
    # it before handing out fresh worlds, and an env that wants one but has none borrows another
    # env's. None: always a fresh world.
    restart: Any = None

    @property
    def default_params(self) -> Any:
        raise NotImplementedError

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        raise NotImplementedError

    def observation_space(self, params: Any):
        raise NotImplementedError

    def action_space(self, params: Any):
        raise NotImplementedError

    def achievements(self, state: Any) -> jax.Array:
        """bool[A] of unlocked achievements (A = len(achievement_names); 0 when none)."""
        return jnp.zeros((0,), bool)

    def render(self, state: Any, params: Any) -> jax.Array:
        raise NotImplementedError(f"{self.name} has no renderer")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
