"""Craftax adapter: Craftax's single `done` split into terminated and truncated.

Craftax ends an episode on death (or lava, or beating the final boss) and on its time limit
(`params.max_timesteps`, 10,000 steps). Only the time limit is a truncation. We tell them apart
by asking Craftax's own `is_terminal` about the same state with its step counter zeroed: if
it is still terminal, something other than the time limit ended the episode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete

CRAFTAX_NAMES = ("Craftax-Symbolic-v1", "Craftax-Classic-Symbolic-v1", "Craftax-Pixels-v1", "Craftax-Classic-Pixels-v1")


class CraftaxEnv(Environment):
    """One of the four Craftax variants, without auto-reset."""

    def __init__(self, name: str):
        from craftax.craftax_env import make_craftax_env_from_name

        self.name = name
        self.classic = "Classic" in name
        self._env = make_craftax_env_from_name(name, auto_reset=False)
        if self.classic:
            from craftax.craftax_classic.constants import Achievement

            rewards = [1.0] * len(Achievement)  # Classic: +1 the first time each is unlocked
        else:
            from craftax.craftax.constants import ACHIEVEMENT_REWARD_MAP, Achievement

            rewards = [float(r) for r in ACHIEVEMENT_REWARD_MAP]  # 1, 3, 5 or 8 by the achievement's tier
        self.achievement_names = tuple(a.name.lower() for a in Achievement)
        self.achievement_rewards = tuple(rewards)
        self._renderer = None

    @property
    def default_params(self):
        return self._env.default_params

    def reset(self, key, params):
        return self._env.reset_env(key, params)

    def step(self, key, state, action, params):
        obs, state, reward, done, info = self._env.step_env(key, state, action, params)
        other_end = self._env.is_terminal(state.replace(timestep=jnp.zeros_like(state.timestep)), params)
        terminated = done & other_end
        truncated = done & ~other_end
        return obs, state, reward.astype(jnp.float32), terminated, truncated, {}

    def observation_space(self, params):
        space = self._env.observation_space(params)
        return Box(space.low, space.high, tuple(space.shape), jnp.float32)

    def action_space(self, params):
        return Discrete(int(self._env.action_space(params).n))

    def achievements(self, state):
        return state.achievements.astype(bool)

    def render(self, state, params):
        """An RGB frame of the player's view, drawn with Craftax's own pixel renderer."""
        if self._renderer is None:
            if self.classic:
                from craftax.craftax_classic.constants import BLOCK_PIXEL_SIZE_IMG
                from craftax.craftax_classic.renderer import make_craftax_pixel_renderer
            else:
                from craftax.craftax.constants import BLOCK_PIXEL_SIZE_IMG
                from craftax.craftax.renderer import make_craftax_pixel_renderer
            # Craftax builds its texture tables with numpy: keep that out of any trace.
            with jax.ensure_compile_time_eval():
                self._renderer = make_craftax_pixel_renderer(BLOCK_PIXEL_SIZE_IMG)
        frame = self._renderer(state)
        return jnp.clip(frame, 0, 255).astype(jnp.uint8)
