"""Render one evaluation episode of a trained policy to a GIF with the env's own renderer.

Craftax draws 144x144 frames, too small to watch: `annotate_frames` scales them up (nearest
neighbour, so blocks stay crisp) and draws the achievements unlocked so far in a text strip
under each frame (the line holding a newly unlocked one in yellow). It is a pure function of frames and name lists, so it
is tested without compiling an env.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

STRIP_BG = (24, 24, 24)
TEXT = (235, 235, 235)
NEW = (255, 210, 60)  # achievements unlocked at this very frame


def record_episode(env, params, act, key: jax.Array, max_steps: int):
    """One episode of `env` drawn frame by frame: `act(obs [1, ...], state [1, ...], key) -> (actions [1],
    label [1])` picks each action and names what acted (a label of 0 where nothing needs naming).
    Returns frames [T, H, W, 3], label [T] and the achievements unlocked so far at each frame [T, A]
    (None if the env has none), cut at the episode's end. NotImplementedError: no renderer."""
    has_achievements = hasattr(env, "achievements")

    def episode(key):
        key, k_reset = jax.random.split(key)
        obs, state = env.reset(k_reset, params)

        def step(carry, _):
            obs, state, key, alive = carry
            key, k_act, k_step = jax.random.split(key, 3)
            frame = env.render(state, params)
            unlocked = env.achievements(state) if has_achievements else jnp.zeros((0,), bool)
            action, label = act(*jax.tree.map(lambda x: x[None], (obs, state)), k_act)
            obs, state, _, terminated, truncated, _ = env.step(k_step, state, action[0], params)
            return (obs, state, key, alive & ~(terminated | truncated)), (frame, label[0], unlocked, alive)

        return jax.lax.scan(step, (obs, state, key, jnp.bool_(True)), None, max_steps)[1]

    frames, label, unlocked, alive = (np.asarray(x) for x in jax.jit(episode)(key))
    return frames[alive], label[alive], (unlocked[alive] if has_achievements else None)


def rollout_frames(trainer, runner, key: jax.Array, max_steps: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Frames [T, H, W, 3] of one episode of seed 0's policy (sampled actions), cut at its end, and
    the achievements unlocked so far at each frame [T, num_achievements] (None if the env has none)."""
    # Host copies of seed 0's (replicated) weights: the rollout then runs on this process's own
    # device, so in a multi-process run process 0 can draw it alone.
    params = jax.tree.map(lambda x: np.asarray(x)[0], runner.train_state.params)
    extra = jax.tree.map(lambda x: np.asarray(x)[0], runner.extra_variables)

    def act(obs, state, key):
        pi, _ = trainer.apply(params, extra, obs)
        return pi.sample(seed=key), jnp.zeros((1,), jnp.int32)

    frames, _, unlocked = record_episode(trainer.env, trainer.env_params, act, key, max_steps)
    return frames, unlocked


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 ships a scalable default font
    except TypeError:
        return ImageFont.load_default()


def annotate_frames(frames: np.ndarray, achievements: Sequence[Sequence[str]] | None = None, *, scale: int = 4,
                    font_size: int = 14, captions: Sequence[str] | None = None) -> np.ndarray:
    """Scale frames [T, H, W, 3] up by `scale` (nearest neighbour) and, when `achievements` is
    given (one list per frame of the names unlocked so far), add a text strip under each frame;
    `captions` (one line per frame, e.g. the skill acting) heads each strip.

    Every frame gets a strip of the same height (the tallest needed), so the GIF has one size.
    """
    from PIL import Image, ImageDraw

    frames = np.asarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [T, H, W, 3], got {frames.shape}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    big = frames.repeat(scale, axis=1).repeat(scale, axis=2)
    if achievements is None:
        return big
    if len(achievements) != len(frames) or (captions is not None and len(captions) != len(frames)):
        raise ValueError(f"{len(frames)} frames but {len(achievements)} achievement lists"
                         + ("" if captions is None else f" and {len(captions)} captions"))
    font = _font(font_size)
    width = big.shape[2]
    line_h = font_size + 4
    chars = max(8, int(width / (font_size * 0.6)))  # the default font is about 0.55 em wide
    heads = [[] for _ in frames] if captions is None else [[c] for c in captions]
    first_names = len(heads[0]) + 1 if len(frames) else 1  # lines before the names: the caption, the count
    blocks = [head + _strip_lines(names, chars) for head, names in zip(heads, achievements)]
    height = line_h * max(len(lines) for lines in blocks) + 6
    out = np.empty((len(frames), big.shape[1] + height, width, 3), np.uint8)
    previous: set[str] = set()
    for t, (frame, names, lines) in enumerate(zip(big, achievements, blocks)):
        strip = Image.new("RGB", (width, height), STRIP_BG)
        draw = ImageDraw.Draw(strip)
        new = set(names) - previous
        previous = set(names)
        for i, line in enumerate(lines):
            draw.text((4, 3 + i * line_h), line,
                      fill=NEW if i >= first_names and new & set(_names_in(line)) else TEXT, font=font)
        out[t, : big.shape[1]] = frame
        out[t, big.shape[1]:] = np.asarray(strip)
    return out


def _strip_lines(names: Sequence[str], chars: int) -> list[str]:
    head = f"achievements: {len(names)}"
    body = textwrap.wrap(", ".join(names), chars) if names else []
    return [head, *body]


def _names_in(line: str) -> list[str]:
    return [n.strip() for n in line.split(",") if n.strip()]


def write_episode_gif(trainer, runner, path: str | Path, max_steps: int = 400, seed: int = 0,
                      scale: int = 4) -> Path:
    """Roll out one episode and write it, scaled and annotated, as a GIF (atomically)."""
    frames, unlocked = rollout_frames(trainer, runner, jax.random.PRNGKey(seed), max_steps)
    names = None
    if unlocked is not None and len(trainer.achievement_names) == unlocked.shape[1]:
        names = [[n for n, on in zip(trainer.achievement_names, row) if on] for row in unlocked]
    return write_annotated_gif(frames, names, path, scale=scale)


def write_annotated_gif(frames: np.ndarray, achievements: Sequence[Sequence[str]] | None, path: str | Path, *,
                        scale: int = 4, captions: Sequence[str] | None = None) -> Path:
    """`annotate_frames`, written as a GIF through one atomic write."""
    import imageio.v2 as imageio

    from jaxrl_hier.io import atomic_writer

    frames = annotate_frames(frames, achievements, scale=scale, captions=captions)
    with atomic_writer(path, "wb") as f:
        buf = io.BytesIO()
        imageio.mimsave(buf, list(frames), format="GIF", duration=0.08, loop=0)
        f.write(buf.getvalue())
    return Path(path)
