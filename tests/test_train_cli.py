"""The train CLI's bad-input errors: one clear message and exit code 2, before anything compiles."""

import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_hier.train import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["env=NoSuchEnv-v0"], ["unknown environment", "CartPole"]),
        (["num_envz=8"], ["unknown config key 'num_envz'", "Did you mean 'num_envs'"]),
        (["num_envs=100", "num_minibatches=8"], ["num_envs (100) must be divisible by num_minibatches (8)"]),
        (["num_envs=0"], ["'num_envs' must be positive"]),
        (["num_steps=-4"], ["'num_steps' must be positive"]),
        (["num_envs=abc"], ["'num_envs' must be an integer"]),
        (["num_devices=64"], ["num_devices=64 but only"]),
        (["env_shards=3", "num_envs=16", "num_minibatches=4", "num_steps=8"],
         ["num_envs (16) must be divisible by the number of devices/env shards (3)"]),
        (["--config", "does/not/exist.yaml"], ["config file not found: does/not/exist.yaml"]),
        (["novalue"], ["not of the form key=value"]),
        (["--resume"], ["--resume needs --output-dir"]),
    ],
)
def test_bad_input_exits_2_with_clear_message(argv, expected, capsys, tmp_path):
    if "--resume" not in argv:
        argv = ["--output-dir", str(tmp_path / "run"), *argv]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ")
    for text in expected:
        assert text in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before anything was set up


def test_resume_of_missing_run_is_clear(tmp_path, capsys):
    assert main(["--resume", "--output-dir", str(tmp_path / "nothing")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err


def test_existing_checkpoints_need_resume(tmp_path, capsys):
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    assert main(["--output-dir", str(tmp_path), "env=CartPole-v1"]) == 2
    assert "pass --resume" in capsys.readouterr().err


def test_cli_process_exit_code():
    # The real entry point, in its own process: the exit code reaches the shell.
    proc = subprocess.run([sys.executable, "-m", "jaxrl_hier.train", "bogus_key=1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown config key 'bogus_key'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_happy_path_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["--output-dir", str(out), "--no-progress", "env=CartPole-v1", "num_envs=16", "num_steps=16",
                 "num_minibatches=4", "hidden_size=16", "num_layers=1", f"total_timesteps={16 * 16 * 6}",
                 "log_every=2", "checkpoint_every=4", "tensorboard=true"])
    assert code == 0
    import json

    import yaml

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["env"] == "CartPole-v1" and config["num_envs"] == 16 and config["log_every"] == 2
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in lines] == [2, 4, 6]
    assert [r["env_steps"] for r in lines] == [512, 1024, 1536]
    for key in ("fps", "episode_return", "episode_length", "loss", "value_loss", "entropy"):
        assert key in lines[-1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["4", "6"]
    assert (out / "learning_curve.png").stat().st_size > 1000
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").iterdir())
    assert not (out / "episode.gif").exists()  # GIFs are for Craftax only
    assert "episode return" in capsys.readouterr().err


def test_missing_logging_package_is_clear(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["--output-dir", str(tmp_path), "wandb=true"]) == 2
    assert "wandb=true needs the wandb package: pip install -e '.[wandb]'" in capsys.readouterr().err
