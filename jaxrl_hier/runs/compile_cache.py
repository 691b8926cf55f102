"""XLA's persistent compilation cache, kept in the run directory.

A resumed run (after a kill, a preemption, the end of a time-limited job) compiles the very programs it
compiled before. With JAX's persistent cache in RUN/xla_cache it loads them instead: on one H200 the
Craftax-Classic skills program took 58.9 s to compile and 11.7 s to load in a new process
(`benchmarks/results/h200/skills_compile/`). On the GPU the cache also keeps XLA's per-fusion
autotuning results. Only programs that took over a second to compile are stored (JAX's default), so
the directory stays small (11 MB for three Craftax programs on the GPU).

A cache the user chose wins: `JAX_COMPILATION_CACHE_DIR`, or a directory set in code
(`jax_compilation_cache_dir`), is kept, and `JAX_ENABLE_COMPILATION_CACHE=false` turns caching off.
A cached program is the same executable, so a resumed run's numbers do not change. JAX writes an
entry in place, not atomically: a kill in mid-write leaves a truncated entry, which JAX refuses with
a warning when a later run reads it (the stream fails to decompress) and compiles past, so the run
still resumes, without the saving for that one program (tests/test_compile_cache.py).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = "xla_cache"


def use_compilation_cache(run_dir: Path) -> Path | None:
    """Point JAX's persistent compilation cache at `run_dir`/xla_cache unless the user chose a cache;
    return the directory in use (None: caching is off). Call it before the run's first compile. A
    second run in the same process (research code, tests) moves the cache to its own directory: a
    directory named xla_cache that the environment did not set is taken for an earlier run's."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if not jax.config.jax_enable_compilation_cache:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current and (os.environ.get("JAX_COMPILATION_CACHE_DIR") or Path(current).name != CACHE_DIR):
        return Path(current)
    target = Path(run_dir) / CACHE_DIR
    if current != str(target):
        jax.config.update("jax_compilation_cache_dir", str(target))
        compilation_cache.reset_cache()  # JAX opens the directory at the next compile
    return target


__all__ = ["CACHE_DIR", "use_compilation_cache"]
