"""Orthogonal initialisation that cannot deadlock XLA:CPU when vmapped.

`jax.nn.initializers.orthogonal` takes the QR decomposition of a Gaussian matrix through LAPACK
(geqrf, orgqr). Under `vmap` (seeds of `make_train`, slots of a skills trainer) that is one
batched LAPACK call per layer, and in jaxlib 0.10.2 a batched LAPACK kernel splits its batch
over XLA:CPU's intra-op thread pool and blocks until the pieces finish. XLA runs independent
layers' initialisations concurrently on that same pool, so as soon as as many batched QRs are in
flight as the pool has threads (two on a 2-core CPU), every pool thread waits for work that no
thread is left to run, and the program never returns: all threads parked, no error.
`benchmarks/ppo/start_loop.py --entry qr_vmap_jax qr_vmap_ours --frozen-s 20` repeats the pattern in
fresh processes (the deadlock needs the pool's threads to meet in the batched call, which a loaded
CPU makes likely: on the idle CPU neither arm deadlocked in 3 starts), and a stack dump of a hung
skills run shows it
(`benchmarks/results/cpu/start_loop_hangs/skills_craftax_gdb.txt`: the two XLA:CPU workers in
`jax::ParallelBatchMap` under `lapack_sgeqrf_ffi` and `lapack_sorgqr_ffi`, the main thread
waiting for the init's result).

An unbatched QR never touches the pool, so `orthogonal` here is jax's own initializer made
sequential under `vmap` (`jax.custom_batching.sequential_vmap`: a `lax.map` over the batch, one
matrix per LAPACK call). LAPACK factors each matrix of a batch by the same routine it applies to
one matrix, so the parameters are bit-for-bit those of `jax.nn.initializers.orthogonal`
(`tests/test_networks_init.py`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def orthogonal(scale: float = 1.0, column_axis: int = -1) -> Callable[..., jax.Array]:
    """`jax.nn.initializers.orthogonal(scale, column_axis)`, one matrix at a time under `vmap`."""
    base = jax.nn.initializers.orthogonal(scale, column_axis)

    def init(key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> jax.Array:
        shape, dtype = tuple(shape), jnp.dtype(dtype)
        return jax.custom_batching.sequential_vmap(lambda k: base(k, shape, dtype))(key)

    return init


__all__ = ["orthogonal"]
