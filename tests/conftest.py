"""Shared test set-up: CPU only, offline, quiet XLA, and one XLA compilation cache for the session.

Many tests compile the same programs more than once: every CLI test runs `python -m jaxrl_hier...`
in fresh processes (a run, then its resume), and equal shapes recur across test files. A persistent
compilation cache shared by this process and every subprocess (through the environment) compiles
each program once per session. It lives in a fresh temporary directory, so no test depends on an
earlier session, and is removed at the end.
"""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests compile far more than they run: without XLA's backend optimisations a Craftax step
# program compiles 28% faster, and the PPO-RNN and skills-env test files finish 23% sooner. XLA:CPU's
# older elemental emitters instead of its fusion emitters compile faster again: a TechTree skills
# round 30 s instead of 48 s, tests/skills/test_manager.py 192 s instead of 287 s, the Craftax smoke
# test 65 s instead of 84 s (a 2-core AMD EPYC, jax 0.10.2, the same load on both). Results stay
# deterministic (every process of the session uses the same flags; subprocesses inherit them, and
# tests that add flags append to these).
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # xdist workers import this again
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_CACHE_DIR = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE_DIR = tempfile.mkdtemp(prefix="jaxrl_hier-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
    # Cache every program: on this CPU most test programs compile in well under JAX's default 1 s bar.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_collection_modifyitems(session, config, items):
    """Files holding an end-to-end (`slow`) test first, each group in its own order. The two workers
    take whole files (`--dist loadfile`) in collection order (`--no-loadscope-reorder`; by default
    xdist sorts files by their number of tests, which put the few-test, three-minute end-to-end
    files last, one worker busy with them while the other idled): longest jobs first packs the two
    workers tighter."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within each group stays


def pytest_sessionfinish(session, exitstatus):
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
