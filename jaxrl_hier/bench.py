"""Shared pieces of the benchmark scripts under `benchmarks/`: device and version info, and the
timing of a compiled function with compile time kept apart from run time."""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any, Callable

import jax


#: the benchmark scripts' `--unroll-decode` choices -> `ModelConfig.unroll_decode` (auto: the decoder's size rule)
UNROLL_DECODE = {"auto": None, "on": True, "off": False}


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def device_info() -> dict:
    import flax
    import optax

    dev = jax.devices()[0]
    return {"device": f"{dev.platform}:{dev.device_kind}", "num_devices": jax.device_count(),
            "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu_count": cpu_count()}


def time_compiled(fn: Callable, *args: Any, repeats: int = 3) -> tuple[float, float]:
    """(compile seconds, best steady-state seconds) of `jax.jit`-able `fn` on `args`."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))  # first run: allocations, thread pools
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - t0)
    return compile_s, best
