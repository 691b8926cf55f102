"""An on-device replay buffer of utterance transitions, stored as fixed-size token arrays.

Every field is one array with `capacity` rows, so the buffer is an ordinary pytree: it lives on the
device, goes through `jit` (insert and sample are pure functions) and is saved whole in Orbax
checkpoints. A transition is one utterance of a turn-level MDP:

    state      [S] left-padded token ids + mask     the dialogue so far (the policy's prompt)
    action     [N] right-padded token ids + mask    the utterance (static completion layout of llm_rl.data)
    reward, done, next_state [S] (+ mask), role (which policy spoke: an index into the trainer's roles)

`insert` writes a batch ring-wise, skipping rows whose `valid` flag is 0 (finished episodes in a
static-shape batch), without leaving the device; `sample` draws rows uniformly from the filled part.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct


class Transitions(NamedTuple):
    state: jax.Array        # [B, S] int32
    state_mask: jax.Array   # [B, S] int32
    action: jax.Array       # [B, N] int32
    action_mask: jax.Array  # [B, N] int32
    reward: jax.Array       # [B] float32
    next_state: jax.Array   # [B, S] int32
    next_mask: jax.Array    # [B, S] int32
    done: jax.Array         # [B] float32
    role: jax.Array         # [B] int32


class ReplayBuffer(struct.PyTreeNode):
    data: Transitions
    size: jax.Array  # rows filled (<= capacity)
    ptr: jax.Array   # next row to write

    @property
    def capacity(self) -> int:
        return self.data.reward.shape[0]


def init_replay(capacity: int, state_len: int, action_len: int) -> ReplayBuffer:
    """An empty buffer of `capacity` transitions."""
    z = lambda *shape: jnp.zeros(shape, jnp.int32)  # noqa: E731
    data = Transitions(z(capacity, state_len), z(capacity, state_len), z(capacity, action_len),
                       z(capacity, action_len), jnp.zeros((capacity,), jnp.float32), z(capacity, state_len),
                       z(capacity, state_len), jnp.zeros((capacity,), jnp.float32), z(capacity))
    return ReplayBuffer(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def insert(buffer: ReplayBuffer, batch: Transitions, valid: jax.Array) -> ReplayBuffer:
    """Append the rows of `batch` with valid != 0, in order, overwriting the oldest when full.

    The batch's valid rows must number at most the capacity (a larger batch would overwrite itself)."""
    cap = buffer.capacity
    valid = valid.astype(bool)
    offset = jnp.cumsum(valid.astype(jnp.int32)) - 1
    rows = jnp.where(valid, (buffer.ptr + offset) % cap, cap)  # row `cap` is out of range: dropped
    data = jax.tree.map(lambda old, new: old.at[rows].set(new.astype(old.dtype), mode="drop"), buffer.data, batch)
    count = valid.sum().astype(jnp.int32)
    return ReplayBuffer(data, jnp.minimum(buffer.size + count, cap), (buffer.ptr + count) % cap)


def sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> Transitions:
    """`batch_size` transitions drawn uniformly (with replacement) from the filled rows."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return jax.tree.map(lambda x: x[idx], buffer.data)


__all__ = ["Transitions", "ReplayBuffer", "init_replay", "insert", "sample"]
