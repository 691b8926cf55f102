"""MemoryCue-v0: remember a cue shown once, answer it after a delay. Needs memory to solve.

Each episode draws a cue c in 0..num_cues-1. The observation (num_cues + 1 floats) shows c
one-hot only at the first step; for the next `delay` steps it is all zeros, and at the last step
its final entry is 1 ("answer now"). The action at the last step is the answer: reward 1 if it
equals c, else 0, and the episode terminates. Actions before it are ignored.

So an episode lasts delay + 1 steps and its return is 1 for a right answer: the mean return is
the success rate. A policy without memory sees the same observation at the answer step whatever
the cue, so it cannot beat chance (1 / num_cues); a recurrent policy can reach 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete


@struct.dataclass
class MemoryCueParams:
    num_cues: int = struct.field(pytree_node=False, default=3)  # fixes the obs and action shapes
    delay: int = 4  # blank steps between the cue and the answer step

    def __post_init__(self):
        if self.num_cues < 2:
            raise ConfigError(f"num_cues must be at least 2, got {self.num_cues}.")
        if isinstance(self.delay, int) and self.delay < 0:  # a traced delay is checked where it was built
            raise ConfigError(f"delay must be >= 0, got {self.delay}.")


@struct.dataclass
class MemoryCueState:
    cue: jax.Array
    time: jax.Array


class MemoryCue(Environment):
    name = "MemoryCue-v0"

    @property
    def default_params(self) -> MemoryCueParams:
        return MemoryCueParams()

    def _obs(self, state: MemoryCueState, params: MemoryCueParams) -> jax.Array:
        cue = jax.nn.one_hot(state.cue, params.num_cues) * (state.time == 0)
        answer_now = (state.time == params.delay).astype(jnp.float32)[None]
        return jnp.concatenate([cue, answer_now]).astype(jnp.float32)

    def reset(self, key, params):
        state = MemoryCueState(jax.random.randint(key, (), 0, params.num_cues), jnp.int32(0))
        return self._obs(state, params), state

    def step(self, key, state, action, params):
        answer = state.time == params.delay
        reward = (answer & (action == state.cue)).astype(jnp.float32)
        new = state.replace(time=state.time + 1)
        return self._obs(new, params), new, reward, answer, jnp.bool_(False), {}

    def observation_space(self, params):
        return Box(0.0, 1.0, (params.num_cues + 1,), jnp.float32)

    def action_space(self, params):
        return Discrete(params.num_cues)
