"""The GPU lease script (`benchmarks/device/skills_leases_gpu.sh`) on a CPU at a tiny TechTree size: a
first call stopped by its wall-time budget, a second that takes the run directory and the compiled
programs back in, finishes the run and compares the final agent with flat PPO at the same env steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device" / "skills_leases_gpu.sh"
# Two skills, one round of chain fine-tuning and one of the manager: every stage of a run, in minutes.
TINY = ["target=place_table", "skill_timesteps=20480", "min_skill_timesteps=10240", "chain_timesteps=10240",
        "manager.timesteps=10240"]


def call(out: Path, wall_s: int, cache: Path, *overrides: str, **extra: str) -> subprocess.CompletedProcess:
    # The script runs `python3`: this interpreter's (a fresh venv's in CI), not whatever PATH finds first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "JAX_PLATFORMS": "cpu", "CONFIG": "configs/skills_techtree.yaml", "XLA_CACHE_DIR": str(cache), **extra}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the script sets its own
    return subprocess.run(["bash", str(SCRIPT), str(out), str(wall_s), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_run_carried_across_two_calls_finishes_and_is_compared_with_flat_ppo(tmp_path):
    first, second = tmp_path / "call1", tmp_path / "call2"
    # 1 s: the budget is spent before the first round, so the call stops at its first check
    res = call(first, 1, tmp_path / "cache1", *TINY)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stopped after max_wall_s=1 s" in res.stderr
    assert {p.name for p in first.iterdir()} == {"run.tgz", "xla_cache.tgz", "status.txt", "versions.txt"}
    assert "running" in (first / "status.txt").read_text()  # not finished: no comparison yet

    res = call(second, 600, tmp_path / "cache2", RUN_IN=str(first / "run.tgz"),
               XLA_CACHE_IN=str(first / "xla_cache.tgz"), PPO_EPISODES="4")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    loaded = re.search(r"xla cache in: (\d+) entries", res.stdout)
    assert loaded and int(loaded.group(1)) >= 1  # the first call's programs, carried in
    assert re.search(r"resumed \S+ at round 0", res.stderr)
    assert "the run has finished" in res.stdout
    status = (second / "status.txt").read_text()
    assert "chain fine-tuning towards place_table" in status and re.search(r"manager over .*: done", status)
    report = json.loads((second / "skills_vs_ppo.json").read_text())
    (run,) = report["runs"]
    assert run["ppo"]["env_steps"] == run["manager"]["env_steps"]  # flat PPO at the run's total env steps
    assert run["manager"]["sampled"]["episodes"] == 4
    with tarfile.open(second / "run.tgz") as tar:  # the finished run, its manager saved, for a later call
        names = tar.getnames()
    assert any(n.startswith("run/manager/expert") for n in names)
    assert not any("xla_cache" in n for n in names)  # the programs travel in xla_cache.tgz alone
