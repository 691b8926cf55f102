"""benchmarks/ppo/world_gen.py and its device script, at a CPU size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bad_blocks_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/ppo/world_gen.py", "--out", str(tmp_path), "--worlds", "8",
                          "--blocks", "16"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "every block within 1..--worlds" in out.stderr


@pytest.mark.slow
def test_device_script_checks_fresh_worlds_at_a_tiny_size(tmp_path):
    """TINY=1 on a CPU: Craftax-Classic, 16 worlds, blocks of 8 and 16 against each key's own world.
    reset_many (8 at a time on a CPU) gives each key its own world (with jax 0.10.2 a block of 16 gave
    half of them another's terrain)."""
    env = {**os.environ, "TINY": "1", "GPU_NAME": "cpu", "RESULTS": str(tmp_path / "results"),
           "PYTHON": sys.executable}
    out = subprocess.run(["bash", "benchmarks/device/world_gen_gpu.sh", str(tmp_path / "out")], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "results" / "classic" / "world_gen.json").read_text())
    assert result["reset_many_block"] == 8
    assert result["reset_many"]["alone"]["own_world"] == result["reset_many"]["seed_vmap"]["own_world"] == 16
    assert [row["block"] for row in result["blocks"]] == [8, 16]
    assert result["blocks"][0]["alone"]["own_world"] == 16 and result["blocks"][0]["seed_vmap"]["us_per_world"] > 0
    assert (tmp_path / "results" / "classic" / "world_gen.png").exists()
    assert (tmp_path / "out" / "versions.txt").read_text().startswith("jax ")
