"""Recurrent (GRU) PPO: it learns a memory task that a feed-forward policy cannot, and a run
checkpointed halfway and resumed gives the same numbers as one run straight through."""

import jax
import numpy as np
import pytest

from jaxrl_hier.algorithms.ppo import PPOConfig, make_train
from jaxrl_hier.checkpointing import Checkpointer
from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs import make

# 3 cues: chance is 1/3. 16 steps per rollout against 5-step episodes, so rollouts end mid-episode
# and the hidden state really is carried from one update to the next.
ENV = dict(num_cues=3, delay=4)
MEMORY = dict(env="MemoryCue-v0", num_envs=32, num_steps=16, num_minibatches=4, hidden_size=32, rnn_hidden_size=32,
              num_layers=1, lr=3e-3, gae_lambda=0.95, reset_mode="pool", reset_ratio=1)
UPDATES = 32  # 24 ended on a transient dip (0.71 at update 21) under the tests' XLA flags on an AMD EPYC host
KEY = jax.random.PRNGKey(0)


def trainer_for(network: str):
    env, params = make("MemoryCue-v0", **ENV)
    config = PPOConfig(network=network, total_timesteps=32 * 16 * UPDATES, **MEMORY)
    return make_train(config, env=env, env_params=params)


@pytest.fixture(scope="module")
def gru_run():
    # Two chunks of UPDATES / 2, uninterrupted: the resume test reuses the same compiled program.
    trainer = trainer_for("gru")
    runner, first = trainer.update(trainer.init(KEY), UPDATES // 2)
    runner, second = trainer.update(runner, UPDATES // 2)
    return trainer, runner, jax.tree.map(lambda a, b: np.concatenate([a, b]), first, second)


def success(metrics, last: int = 4) -> float:
    # Reward 1 for a right answer, 0 otherwise: the mean return is the success rate.
    return float(np.nanmean(np.asarray(metrics["episode_return"])[-last:]))


@pytest.mark.slow
def test_gru_learns_what_a_feedforward_policy_cannot(gru_run):
    _, runner, metrics = gru_run
    assert success(metrics) > 0.9, np.asarray(metrics["episode_return"])[:, 0]
    mlp = trainer_for("mlp")
    _, mlp_metrics = mlp.update(mlp.init(KEY), UPDATES)
    assert abs(success(mlp_metrics) - 1 / 3) < 0.1, np.asarray(mlp_metrics["episode_return"])[:, 0]
    # The hidden state is part of the runner state, one per env: [seeds, shards, envs, units].
    assert runner.hidden.shape == (1, 1, 32, 32) and np.abs(np.asarray(runner.hidden)).max() > 0


def test_gru_resume_from_checkpoint_is_exact(gru_run, tmp_path):
    trainer, runner_full, metrics_full = gru_run
    half = UPDATES // 2
    start = trainer.init(KEY)
    runner, first = trainer.update(start, half)
    ckpt = Checkpointer(tmp_path / "checkpoints", asynchronous=False)
    ckpt.save(half, runner, {"network": "gru"})
    restored, _ = ckpt.restore(half, start, expect={"network": "gru"})  # into the structure of train.init(key)
    ckpt.close()
    np.testing.assert_array_equal(np.asarray(restored.hidden), np.asarray(runner.hidden))
    restored, second = trainer.update(restored, half)
    for k in metrics_full:
        resumed = np.concatenate([np.asarray(first[k]), np.asarray(second[k])])
        np.testing.assert_array_equal(resumed, np.asarray(metrics_full[k]), err_msg=k)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(runner_full)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_gru_minibatches_need_whole_envs():
    with pytest.raises(ConfigError, match=r"num_envs \(6\) must be divisible by num_minibatches \(4\).*"
                                          r"whole env trajectories.*Change num_minibatches"):
        PPOConfig(network="gru", num_envs=6, num_steps=5, num_minibatches=4).validate()
    # With env shards each shard must split evenly: 8 envs in 2 shards of 4 cannot make 8 minibatches.
    with pytest.raises(ConfigError, match=r"num_envs \(8\) per env shard \(4 with 2 shards\)"):
        make_train(PPOConfig(network="gru", env="MemoryCue-v0", num_envs=8, num_steps=5, num_minibatches=8,
                             env_shards=2, total_timesteps=40))
