"""benchmarks/ppo/matmul_dtype.py: both arms from one command, the learning test, bad input."""

import json

import pytest

from benchmarks.ppo import matmul_dtype as bench

TINY = ["env=CartPole-v1", "num_envs=8", "num_steps=16", "num_minibatches=2", "hidden_size=16", "num_layers=1",
        "total_timesteps=1024", "reset_mode=auto", "log_every=1"]


def test_both_arms_run_from_the_same_seeds_and_everything_is_written(tmp_path):
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--seeds", "2", "--date", "2026-11-29", *TINY]) == 0
    result = json.loads((out / "matmul_dtype.json").read_text())
    f32, bf16 = result["arms"]
    assert (f32["matmul_dtype"], bf16["matmul_dtype"]) == ("float32", "bfloat16")
    for arm in (f32, bf16):
        assert arm["env_steps"] == 8 * 16 * 8 * 2 and arm["fps"] > 0 and arm["compile_s"] > 0
        assert len(arm["curve"]) == 8 and len(arm["curve"][0]) == 2 and len(arm["final_return"]) == 2
    assert result["comparison"]["speedup"] == bf16["fps"] / f32["fps"]
    table = (out / "matmul_dtype.md").read_text()
    assert "| float32 |" in table and "| bfloat16 |" in table and "2026-11-29" in table and "CartPole-v1" in table
    assert (out / "matmul_dtype.png").stat().st_size > 1000


def test_learning_counts_as_the_same_only_within_the_float32_spread():
    f32 = {"final_return": [5.0, 5.2, 5.1], "fps": 100.0}
    close = bench.compare(f32, {"final_return": [5.05, 5.15, 5.1], "fps": 150.0})
    assert close["same"] and close["every_bf16_seed_in_band"] and close["speedup"] == 1.5
    low = bench.compare(f32, {"final_return": [4.6, 4.7, 4.65], "fps": 150.0})
    assert not low["same"] and not low["every_bf16_seed_in_band"]
    shifted = bench.compare(f32, {"final_return": [5.2, 5.25, 5.28], "fps": 150.0})  # each in band, mean off
    assert shifted["every_bf16_seed_in_band"] and not shifted["same"]


def test_bad_config_exits_2_before_anything_runs(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "o"), "network=gru"]) == 2
    assert "applies to the MLP network only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
