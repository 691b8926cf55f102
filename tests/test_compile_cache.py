"""The run directory's persistent compilation cache (runs.compile_cache): a CLI run stores its
compiled programs in RUN/xla_cache, a second run in the same process moves the cache to its own
directory, a cache the user chose wins, and a truncated entry (a kill in mid-write) is compiled past.

The suite sets JAX_COMPILATION_CACHE_DIR for itself (conftest), which is a user's choice here: the
run-directory behaviour is checked in subprocesses whose environment lacks it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax

from jaxrl_hier.runs import use_compilation_cache
from jaxrl_hier.runs.compile_cache import CACHE_DIR

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import jax, jax.numpy as jnp
from jaxrl_hier.runs import use_compilation_cache
out = []
for run in sys.argv[1:]:
    print("cache", use_compilation_cache(run))
    f = jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)
    print("value", float(f(jnp.arange(12.0).reshape(3, 4) / 10).sum()))
"""


def _python(args: list[str], **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    clean.update(PYTHONPATH=str(ROOT), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **env)
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _entries(run: Path) -> list[Path]:
    return sorted((run / CACHE_DIR).glob("*-cache"))


def test_a_run_keeps_its_programs_in_its_directory_and_a_truncated_entry_is_compiled_past(tmp_path):
    # The PPO CLI, as a user runs it: its programs land in the run directory.
    run = tmp_path / "ppo"
    _python(["-m", "jaxrl_hier.train", "--config", "configs/ppo_cartpole.yaml", "--output-dir", str(run),
             "--no-progress", "total_timesteps=256", "num_envs=4", "num_steps=16", "log_every=2"])
    assert any(p.name.startswith("jit_") for p in _entries(run))

    # Two runs in one process: each run's programs in its own directory.
    a, b = tmp_path / "a", tmp_path / "b"
    first = _python(["-c", PROBE, str(a), str(b)]).stdout.split("\n")
    assert first[0] == f"cache {a / CACHE_DIR}" and first[2] == f"cache {b / CACHE_DIR}"
    assert _entries(a) and _entries(b)

    # A kill while JAX wrote an entry leaves it truncated: the next run warns, compiles, and gets the
    # same numbers.
    for entry in _entries(a):
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    again = _python(["-c", PROBE, str(a)])
    assert again.stdout.split("\n")[1] == first[1]
    assert "Error reading persistent compilation cache entry" in again.stderr


def test_a_cache_the_user_chose_wins_and_caching_can_be_turned_off(tmp_path):
    # conftest set JAX_COMPILATION_CACHE_DIR for the suite: that is the user's choice, kept.
    assert use_compilation_cache(tmp_path) == Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    assert not (tmp_path / CACHE_DIR).exists()
    enabled = jax.config.jax_enable_compilation_cache
    try:
        jax.config.update("jax_enable_compilation_cache", False)
        assert use_compilation_cache(tmp_path) is None
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
