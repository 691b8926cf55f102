"""PPO: learning, determinism, seeds, and 1-vs-4-device equivalence."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxrl_hier.algorithms.ppo import PPOConfig, make_train, metrics_to_records

CARTPOLE = dict(env="CartPole-v1", num_envs=32, num_steps=64, num_minibatches=4, hidden_size=64, num_layers=2,
                lr=2.5e-3, gae_lambda=0.95, reset_mode="auto")


@pytest.fixture(scope="module")
def cartpole_run():
    config = PPOConfig(total_timesteps=32 * 64 * 60, **CARTPOLE)
    trainer = make_train(config)
    runner, metrics = trainer(jax.random.PRNGKey(0))
    return trainer, runner, metrics


def test_learns_cartpole(cartpole_run):
    trainer, _, metrics = cartpole_run
    returns = np.asarray(metrics["episode_return"])[:, 0]
    assert np.nanmean(returns[:5]) < 60  # a random policy balances ~20 steps
    assert np.nanmean(returns[-10:]) > 150, returns


def test_same_seed_same_numbers(cartpole_run):
    trainer, runner, metrics = cartpole_run
    runner2, metrics2 = trainer(jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(metrics), jax.tree.leaves(metrics2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(runner.train_state.params), jax.tree.leaves(runner2.train_state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_seeds_are_vmapped_and_independent():
    config = PPOConfig(total_timesteps=16 * 16 * 3, num_seeds=3, **{**CARTPOLE, "num_envs": 16, "num_steps": 16})
    trainer = make_train(config)
    runner, metrics = trainer(jax.random.PRNGKey(1))
    assert metrics["loss"].shape == (3, 3)
    kernel = np.asarray(jax.tree.leaves(runner.train_state.params)[0])
    assert kernel.shape[0] == 3 and not np.allclose(kernel[0], kernel[1])
    records = metrics_to_records(metrics, ())
    assert len(records) == 3 and {"loss", "episode_return", "entropy"} <= set(records[0])


def test_custom_env_and_achievements_are_logged():
    config = PPOConfig(env="TechTree-v0", total_timesteps=32 * 100 * 2, num_envs=32, num_steps=100, num_minibatches=4,
                       hidden_size=32, num_layers=1, reset_mode="pool", reset_ratio=8)
    trainer = make_train(config)
    _, metrics = trainer(jax.random.PRNGKey(0))
    # Every TechTree episode lasts exactly 100 steps: each update sees all 32 finish once.
    np.testing.assert_array_equal(np.asarray(metrics["episodes"])[:, 0], [32, 32])
    np.testing.assert_allclose(np.asarray(metrics["episode_length"]), 100)
    assert metrics["achievements"].shape == (2, 1, 8)
    rec = metrics_to_records(metrics, trainer.achievement_names)[0]
    assert 0.0 <= rec["achievement/collect_wood"] <= 1.0 and rec["achievement/collect_wood"] > 0


MULTI_DEVICE = textwrap.dedent("""
    import jax, numpy as np
    from jaxrl_hier.algorithms.ppo import PPOConfig, make_train
    assert jax.device_count() == 4
    base = dict(env="TechTree-v0", total_timesteps=32 * 16 * 3, num_envs=32, num_steps=16, num_minibatches=4,
                hidden_size=32, num_layers=1, reset_mode="{mode}", reset_ratio=4, env_shards=4)
    one = make_train(PPOConfig(num_devices=1, **base))
    four = make_train(PPOConfig(num_devices=4, **base))
    assert four.mesh.devices.size == 4 and one.mesh.devices.size == 1
    r1, m1 = one(jax.random.PRNGKey(3))
    r4, m4 = four(jax.random.PRNGKey(3))
    assert len(r4.obs.sharding.device_set) == 4
    for a, b in zip(jax.tree.leaves(r1.train_state.params), jax.tree.leaves(r4.train_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    for k in ("loss", "value_loss", "entropy", "episode_return"):
        np.testing.assert_allclose(np.asarray(m1[k]), np.asarray(m4[k]), rtol=2e-4, atol=2e-5)
    print("EQUAL")
""")


@pytest.mark.parametrize("mode", ["pool", "auto"])
def test_one_device_equals_four(mode):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", MULTI_DEVICE.replace("{mode}", mode)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EQUAL" in proc.stdout
