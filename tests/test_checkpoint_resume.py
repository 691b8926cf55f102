"""Checkpoints: a run killed with SIGKILL and resumed writes the same metrics as an
uninterrupted one; corrupt and mismatched checkpoints give clear errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
UPDATES = 60  # the kill lands at checkpoint 20, well before the end
ARGS = ["env=CartPole-v1", "num_envs=64", "num_steps=32", "num_minibatches=4", "hidden_size=64", "num_layers=2",
        "reset_mode=pool", "reset_ratio=8", "log_every=1", "checkpoint_every=5", "keep_checkpoints=2",
        f"total_timesteps={64 * 32 * UPDATES}"]
VOLATILE = {"fps", "time_s"}  # wall-clock figures


def train(out: Path, *extra: str, wait: bool = True, args: tuple[str, ...] = tuple(ARGS)):
    cmd = [sys.executable, "-m", "jaxrl_hier.train", "--output-dir", str(out), "--no-progress", *args, *extra]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if wait:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE} for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    proc = train(out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(uninterrupted, tmp_path):
    out = tmp_path / "killed"
    proc = train(out, wait=False)
    ckpt = out / "checkpoints" / "20"
    deadline = time.time() + 300
    while not ckpt.is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    written = len(records(out)) if (out / "metrics.jsonl").exists() else 0
    assert written < UPDATES
    resumed = train(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed" in resumed.stderr
    assert records(out) == records(uninterrupted)
    assert (out / "learning_curve.png").stat().st_size > 0


def test_mismatched_checkpoint_is_refused(uninterrupted, tmp_path):
    # Structural overrides are refused before the checkpoint is read (see test_train_cli.py), so the
    # mismatch here comes from a config.yaml edited by hand; the refusal must not rewrite it.
    out = tmp_path / "copy"
    shutil.copytree(uninterrupted, out)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("hidden_size: 64", "hidden_size: 32"))
    before = config.read_bytes()
    proc = train(out, "--resume", args=())
    assert proc.returncode == 2
    assert "does not match this run: hidden_size is 64 in the checkpoint but 32 here" in proc.stderr
    assert str(out / "checkpoints") in proc.stderr
    assert config.read_bytes() == before


def test_refused_resume_leaves_config_and_a_safe_resume_works(uninterrupted, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(uninterrupted, out)
    config = out / "config.yaml"
    before = config.read_bytes()
    proc = train(out, "--resume", "hidden_size=32")
    assert proc.returncode == 2
    assert "cannot change 'hidden_size' on --resume (64 in the run, 32 asked)" in proc.stderr
    assert config.read_bytes() == before
    # The run directory is still good: a resume with a logging-only change goes through and records it.
    proc = train(out, "--resume", "keep_checkpoints=3", args=())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed" in proc.stderr
    assert config.read_text() == before.decode().replace("keep_checkpoints: 2", "keep_checkpoints: 3")
    assert records(out) == records(uninterrupted)


def test_corrupt_checkpoint_is_refused(uninterrupted, tmp_path):
    out = tmp_path / "corrupt"
    shutil.copytree(uninterrupted, out)
    latest = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    for f in (out / "checkpoints" / str(latest) / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    proc = train(out, "--resume")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{out / 'checkpoints'}/{latest}" in proc.stderr
    assert "corrupt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("pack", [True, False])
def test_checkpointer_round_trips_zero_size_leaves_keys_and_dtypes(tmp_path, pack):
    """reset_mode auto/none leave the reset pool empty; Orbax alone refuses zero-size arrays. Both
    layouts (packed, one process's default; one array per leaf, as with several processes) keep every
    dtype, PRNG keys and host arrays."""
    import jax
    import jax.numpy as jnp

    from jaxrl_hier.checkpointing import Checkpointer

    tree = {"a": jnp.arange(3.0), "pool": jnp.zeros((0, 4), jnp.int32), "key": jax.random.key(1),
            "keys": jax.random.split(jax.random.key(2), 3), "done": jnp.array([True, False]),
            "host": np.arange(4, dtype=np.int32), "step": jnp.int32(7)}
    ckpt = Checkpointer(tmp_path / "ckpt", asynchronous=False, pack=pack)
    ckpt.save(1, tree, {"env": "x"})
    target = {"a": jnp.zeros(3), "pool": jnp.zeros((0, 4), jnp.int32), "key": jax.random.key(0),
              "keys": jax.random.split(jax.random.key(0), 3), "done": jnp.zeros(2, bool),
              "host": np.zeros(4, np.int32), "step": jnp.int32(0)}
    restored, meta = ckpt.restore(1, target, {"env": "x"})
    ckpt.close()
    assert meta == {"env": "x", "step": 1}
    assert restored["a"].tolist() == [0.0, 1.0, 2.0] and restored["pool"].shape == (0, 4)
    for k in ("key", "keys"):
        assert jax.random.key_data(restored[k]).tolist() == jax.random.key_data(tree[k]).tolist()
    assert restored["done"].tolist() == [True, False] and restored["done"].dtype == jnp.bool_
    assert np.asarray(restored["host"]).tolist() == [0, 1, 2, 3] and int(restored["step"]) == 7


def test_packed_checkpoint_refuses_a_state_of_other_shapes_and_reads_per_array_ones(tmp_path):
    """A packed checkpoint joins arrays, so equal byte counts must not pass for an equal state: the
    saved shapes are checked first, naming the array. Checkpoints saved one array per leaf (several
    processes, and every run before packing) still restore through the default Checkpointer."""
    import jax.numpy as jnp

    from jaxrl_hier.checkpointing import Checkpointer, CheckpointError

    tree = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    Checkpointer(tmp_path / "packed", asynchronous=False).save(1, tree, {})
    with pytest.raises(CheckpointError, match=r"its array \['w'\] is float32\[2, 3\] where this run has float32\[3, 2\]"):
        Checkpointer(tmp_path / "packed").restore(1, {"w": jnp.zeros((3, 2)), "b": jnp.zeros(3)}, {})
    Checkpointer(tmp_path / "per_array", asynchronous=False, pack=False).save(1, tree, {})
    restored, _ = Checkpointer(tmp_path / "per_array").restore(1, {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}, {})
    assert np.asarray(restored["w"]).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_checkpoint_save_benchmark_times_both_layouts_and_refuses_no_repeats(tmp_path):
    """`benchmarks/runs/checkpoint_save.py` on the smallest of its states: both layouts timed, the
    packed one restoring the state it saved (the script restores into the saved state each time)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.runs import checkpoint_save

    assert checkpoint_save.main(["--out", str(tmp_path), "--repeats", "0"]) == 2
    assert checkpoint_save.main(["--out", str(tmp_path), "--repeats", "1", "--states", "ppo_techtree"]) == 0
    result = json.loads((tmp_path / "checkpoint_save.json").read_text())
    (row,) = result["states"]
    assert row["arrays"] > 10 and row["bytes"] > 0
    assert all(row[layout]["save_s"] > 0 and row[layout]["restore_s"] > 0 for layout in ("one array per leaf", "packed"))
    assert "| PPO (ppo_techtree.yaml) |" in (tmp_path / "checkpoint_save.md").read_text()
    assert (tmp_path / "checkpoint_save.png").is_file()
