"""Shared pieces of the benchmark scripts under `benchmarks/`: device and version info, and the
timing of a compiled function with compile time kept apart from run time."""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any, Callable


#: the benchmark scripts' `--unroll-decode` choices -> `ModelConfig.unroll_decode` (auto: the decoder's size rule)
UNROLL_DECODE = {"auto": None, "on": True, "off": False}


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cpu_model() -> str:
    """The CPU's model name (as `lscpu` prints it: /proc/cpuinfo's "model name"), or platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """The fraction of all the CPUs' time spent busy (not idle, not waiting on I/O) over the next `seconds`,
    from /proc/stat; call it while this process sleeps, so what it measures is the other jobs' load.
    None where /proc/stat is missing."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle  # user nice system idle iowait irq softirq steal (guest is in user)

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    total = total1 - total0
    return 0.0 if total <= 0 else 1.0 - (idle1 - idle0) / total


def device_info() -> dict:
    import flax
    import jax
    import optax

    dev = jax.devices()[0]
    return {"device": f"{dev.platform}:{dev.device_kind}", "cpu_model": cpu_model(), "num_devices": jax.device_count(),
            "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu_count": cpu_count()}


def time_compiled(fn: Callable, *args: Any, repeats: int = 3) -> tuple[float, float]:
    """(compile seconds, best steady-state seconds) of `jax.jit`-able `fn` on `args`."""
    import jax

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
