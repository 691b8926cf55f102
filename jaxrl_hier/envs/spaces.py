"""Observation and action spaces (gymnax-style, but owned here so no env library is needed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Discrete:
    """Actions 0..n-1."""

    n: int
    shape: tuple[int, ...] = ()
    dtype: Any = jnp.int32

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, self.shape, 0, self.n, dtype=self.dtype)


@dataclass(frozen=True)
class Box:
    """A box of floats (or ints) with elementwise bounds."""

    low: Any
    high: Any
    shape: tuple[int, ...]
    dtype: Any = jnp.float32

    def sample(self, key: jax.Array) -> jax.Array:
        low = jnp.broadcast_to(jnp.asarray(self.low, jnp.float32), self.shape)
        high = jnp.broadcast_to(jnp.asarray(self.high, jnp.float32), self.shape)
        low, high = jnp.maximum(low, -1e6), jnp.minimum(high, 1e6)
        return jax.random.uniform(key, self.shape, minval=low, maxval=high).astype(self.dtype)
