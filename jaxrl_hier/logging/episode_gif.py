"""Render one evaluation episode of a trained policy to a GIF with the env's own renderer."""

from __future__ import annotations

import io
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def rollout_frames(trainer, runner, key: jax.Array, max_steps: int) -> np.ndarray:
    """Frames [T, H, W, 3] of one episode of seed 0's policy (sampled actions), cut at its end."""
    env, env_params = trainer.env, trainer.env_params
    params = jax.tree.map(lambda x: x[0], runner.train_state.params)
    extra = jax.tree.map(lambda x: x[0], runner.extra_variables)

    def episode(key):
        key, k_reset = jax.random.split(key)
        obs, state = env.reset(k_reset, env_params)

        def step(carry, _):
            obs, state, key, alive = carry
            key, k_act, k_step = jax.random.split(key, 3)
            frame = env.render(state, env_params)
            pi, _ = trainer.apply(params, extra, jax.tree.map(lambda x: x[None], obs))
            action = pi.sample(seed=k_act)[0]
            obs, state, _, terminated, truncated, _ = env.step(k_step, state, action, env_params)
            return (obs, state, key, alive & ~(terminated | truncated)), (frame, alive)

        _, (frames, alive) = jax.lax.scan(step, (obs, state, key, jnp.bool_(True)), None, max_steps)
        return frames, alive

    frames, alive = jax.jit(episode)(key)
    frames, alive = np.asarray(frames), np.asarray(alive)
    return frames[alive]


def write_episode_gif(trainer, runner, path: str | Path, max_steps: int = 400, seed: int = 0) -> Path:
    import imageio.v2 as imageio

    from jaxrl_hier.io import atomic_write_bytes

    frames = rollout_frames(trainer, runner, jax.random.PRNGKey(seed), max_steps)
    frames = frames.astype(np.uint8)
    buf = io.BytesIO()
    imageio.mimsave(buf, list(frames), format="GIF", duration=0.08, loop=0)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
