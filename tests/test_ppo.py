"""PPO: learning, determinism, seeds, 1-vs-4-device equivalence, the loss against hand-computed
numbers, the truncation bootstrap inside the trainer, action masks, and minibatch constraints."""

import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl_hier.algorithms.ppo import PPOConfig, make_train, metrics_to_records, ppo_loss
from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete
from jaxrl_hier.networks import make_network

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


def test_bf16_matmuls_learn_cartpole():
    # The same run with the MLP's products in bf16 (float32 parameters and optimiser) learns as well.
    config = PPOConfig(total_timesteps=32 * 64 * 60, matmul_dtype="bfloat16", **CARTPOLE)
    runner, metrics = make_train(config)(jax.random.PRNGKey(0))
    returns = np.asarray(metrics["episode_return"])[:, 0]
    assert np.nanmean(returns[-10:]) > 150, returns
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(runner.train_state.params))


def test_bf16_matmuls_are_refused_where_the_network_is_not_an_mlp():
    # Pixel observations get the CNN under network "auto": refused before anything compiles.
    with pytest.raises(ConfigError, match="applies to the MLP network only; Craftax-Classic-Pixels-v1 gets the 'cnn'"):
        make_train(PPOConfig(env="Craftax-Classic-Pixels-v1", num_envs=8, matmul_dtype="bfloat16"))
    # A network passed in (the skills' experts, say) runs its own products: the setting would do nothing.
    with pytest.raises(ConfigError, match="the network passed in runs its own"):
        make_train(PPOConfig(env="CartPole-v1", num_envs=8, matmul_dtype="bfloat16"),
                   network=make_network("mlp", 2, 8, 1, "tanh"))


def test_same_seed_same_numbers(cartpole_run):
    trainer, runner, metrics = cartpole_run
    runner2, metrics2 = trainer(jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(metrics), jax.tree.leaves(metrics2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(runner.train_state.params), jax.tree.leaves(runner2.train_state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_from_given_params_continues_a_trained_policy(cartpole_run):
    """PPO.init(key, params=...) starts every seed from those params (a warm start, as the PGTS
    imitation stage gives): a trained CartPole policy balances from its first update."""
    trainer, runner, _ = cartpole_run
    trained = jax.tree.map(lambda x: x[0], runner.train_state.params)
    warm = trainer.init(jax.random.PRNGKey(7), params=trained)
    for a, b in zip(jax.tree.leaves(warm.train_state.params), jax.tree.leaves(runner.train_state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, metrics = trainer.update(warm, 2)
    _, scratch = trainer.update(trainer.init(jax.random.PRNGKey(7)), 2)  # the same seed from random params
    # Judged against the from-scratch run, by margins no float rounding crosses. From scratch about
    # 165 episodes end within these 2 x 64 steps of 32 envs (returns near 20); the warm start's last
    # longer than the window or nearly so: on the CPUs tried, none to about 45 end, with mean
    # returns of 90-110 (only episodes that end in the window count, so that figure is capped). The
    # returns are judged only where enough episodes end: on a 2-core AMD EPYC (AVX2) a single one
    # ended, an early fall at 25 steps, which says nothing about the mean.
    warm_episodes, scratch_episodes = float(np.sum(metrics["episodes"])), float(np.sum(scratch["episodes"]))
    assert scratch_episodes > 100 and warm_episodes < scratch_episodes / 2.5, (warm_episodes, scratch_episodes)
    if warm_episodes >= 10:
        warm_return = np.nanmean(np.asarray(metrics["episode_return"]))
        assert warm_return > 2.5 * np.nanmean(np.asarray(scratch["episode_return"])), warm_return
    with pytest.raises(ValueError, match="parameter tree"):
        trainer.init(jax.random.PRNGKey(7), params={"other": trained})


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
                hidden_size=32, num_layers=1, reset_mode="pool", reset_ratio=4, env_shards=4)
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


@pytest.mark.slow
def test_one_device_equals_four():
    # The pool reset scheme: its refill branch is the one synchronised across env shards; "auto"
    # resets each env on its own and has nothing that depends on the device count.
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"  # after the session's
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", MULTI_DEVICE], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EQUAL" in proc.stdout


# ---------------------------------------------------------------------------- the loss by hand


def test_ppo_loss_against_hand_computed_numbers():
    ratio = np.array([1.5, 0.5, 1.0, 1.1])
    adv_raw = np.array([1.0, -1.0, 2.0, 0.0])  # mean 0.5, mean square 1.5, so std sqrt(1.25)
    value = np.array([0.5, -0.1, 0.1, 0.3])
    targets = np.array([1.0, 1.0, 0.0, -1.0])
    total, aux = ppo_loss(jnp.log(jnp.asarray(ratio)), jnp.full(4, 0.5), jnp.asarray(value), jnp.zeros(4), jnp.zeros(4),
                          jnp.asarray(adv_raw), jnp.asarray(targets), clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)
    a = (adv_raw - 0.5) / math.sqrt(1.25)  # normalised: [0.447, -1.342, 1.342, -0.447]
    # Per sample, the smaller of r*A and clip(r)*A: sample 0 (A > 0, r = 1.5) is clipped to 1.2,
    # sample 1 (A < 0, r = 0.5) to 0.8, samples 2 and 3 lie inside [0.8, 1.2].
    actor = -np.mean([1.2 * a[0], 0.8 * a[1], 1.0 * a[2], 1.1 * a[3]])
    # Old values 0, clip 0.2: clipped values [0.2, -0.1, 0.1, 0.2]; per sample the larger squared
    # error: 0.64 (clipped), 1.21, 0.01, 1.69 (unclipped).
    value_loss = 0.5 * np.mean([0.64, 1.21, 0.01, 1.69])
    np.testing.assert_allclose(aux["actor_loss"], actor, rtol=1e-5)
    np.testing.assert_allclose(aux["value_loss"], 0.44375, rtol=1e-6)
    np.testing.assert_allclose(value_loss, 0.44375)
    np.testing.assert_allclose(aux["entropy"], 0.5)
    np.testing.assert_allclose(total, actor + 0.5 * 0.44375 - 0.01 * 0.5, rtol=1e-5)
    np.testing.assert_allclose(aux["clip_frac"], 0.5)  # samples 0 and 1
    np.testing.assert_allclose(aux["approx_kl"], np.mean(ratio - 1 - np.log(ratio)), rtol=1e-5)


# ---------------------------------------------------------------------------- truncation bootstrap


@struct.dataclass
class LimitParams:
    limit: int = 3


class TimeLimitEnv(Environment):
    """Observation [t]; reward 1 every step; never terminates, truncated when t reaches `limit`."""

    default_params = LimitParams()

    def reset(self, key, params):
        return jnp.zeros(1), jnp.int32(0)

    def step(self, key, t, action, params):
        t = t + 1
        return jnp.asarray(t, jnp.float32)[None], t, jnp.float32(1.0), jnp.bool_(False), t >= params.limit, {}

    def observation_space(self, params):
        return Box(0.0, float(params.limit), (1,))

    def action_space(self, params):
        return Discrete(2)


class FixedValue(nn.Module):
    """A trainable policy, but a value that no parameter touches: V(s) = 10 + t."""

    @nn.compact
    def __call__(self, obs):
        return distrax.Categorical(logits=nn.Dense(2)(obs)), 10.0 + obs[..., 0]


def reference_advantages(start: int, num_steps: int, limit: int, gamma: float, lam: float, bootstrap_final: bool):
    """GAE of one env by hand, its rollout starting at episode time `start`."""
    times = [(start + i) % limit for i in range(num_steps + 1)]
    adv, out = 0.0, []
    for i in reversed(range(num_steps)):
        truncated = times[i] + 1 == limit
        next_value = (10.0 + limit if bootstrap_final else 0.0) if truncated else 10.0 + times[i + 1]
        adv = 1.0 + gamma * next_value - (10.0 + times[i]) + gamma * lam * (0.0 if truncated else adv)
        out.append(adv)
    return np.array(out)


def test_truncated_episode_bootstraps_from_final_observation_value():
    gamma, lam, steps = 0.9, 0.8, 4
    config = PPOConfig(env="time-limit", num_envs=2, num_steps=steps, num_minibatches=2, update_epochs=2, gamma=gamma,
                       gae_lambda=lam, reset_mode="auto", total_timesteps=2 * steps * 3)
    trainer = make_train(config, env=TimeLimitEnv(), network=FixedValue())
    _, metrics = trainer(jax.random.PRNGKey(0))
    # The value never changes, so the value loss is 0.5 * mean(advantage^2) over the rollout, and
    # each rollout starts 4 steps (mod the limit 3) later in the episode than the one before.
    for update, start in enumerate([0, 1, 2]):
        right = 0.5 * np.mean(reference_advantages(start, steps, 3, gamma, lam, bootstrap_final=True) ** 2)
        wrong = 0.5 * np.mean(reference_advantages(start, steps, 3, gamma, lam, bootstrap_final=False) ** 2)
        assert abs(right - wrong) > 10.0  # the test tells the two apart
        np.testing.assert_allclose(metrics["value_loss"][update, 0], right, rtol=1e-5)


# ---------------------------------------------------------------------------- action masks


@struct.dataclass
class BanditState:
    mask: jax.Array


class MaskedBandit(Environment):
    """One-step episodes; a random one of 3 actions is masked out, and choosing it pays 1."""

    default_params = None

    def _obs(self, mask):
        return {"obs": mask.astype(jnp.float32), "action_mask": mask}

    def reset(self, key, params):
        mask = jnp.arange(3) != jax.random.randint(key, (), 0, 3)
        return self._obs(mask), BanditState(mask)

    def step(self, key, state, action, params):
        reward = (~state.mask[action]).astype(jnp.float32)
        obs, state = self.reset(key, params)
        return obs, state, reward, jnp.bool_(True), jnp.bool_(False), {}

    def observation_space(self, params):
        return {"obs": Box(0.0, 1.0, (3,)), "action_mask": Box(0, 1, (3,), jnp.bool_)}

    def action_space(self, params):
        return Discrete(3)


def test_action_mask_flows_through_rollout_and_training():
    # 3 envs with 4 minibatches: time-split minibatches need no divisibility of num_envs.
    config = PPOConfig(env="masked-bandit", num_envs=3, num_steps=8, num_minibatches=4, hidden_size=8, num_layers=1,
                       reset_mode="auto", network="mlp", total_timesteps=3 * 8 * 3)
    trainer = make_train(config, env=MaskedBandit())
    runner, metrics = trainer(jax.random.PRNGKey(0))
    assert set(runner.obs) == {"obs", "action_mask"}
    np.testing.assert_array_equal(metrics["episodes"][:, 0], [24, 24, 24])
    # Unmasked, 72 uniform draws would pick a masked action about 24 times.
    np.testing.assert_array_equal(metrics["episode_return"][:, 0], [0, 0, 0])
    assert np.isfinite(np.asarray(metrics["loss"])).all() and np.isfinite(np.asarray(metrics["entropy"])).all()


class TaggedPolicy(distrax.Categorical):
    """A distribution whose per-row penalty is `tag`, an input only the network's `loss_inputs` adds."""

    def __init__(self, logits, tag):
        super().__init__(logits=logits)
        self.tag = tag

    def log_prob_and_penalty(self, action):
        return self.log_prob(action), self.tag


class LossInputsNet(nn.Module):
    """A trainable policy and value whose loss reads `tag`: a frozen variable (2.5) that `loss_inputs`
    writes into each stored observation, as a teacher's logits are."""

    @nn.compact
    def __call__(self, obs):
        self.variable("frozen", "tag", lambda: jnp.float32(2.5))
        return TaggedPolicy(nn.Dense(3)(obs["obs"]), obs.get("tag")), nn.Dense(1)(obs["obs"])[:, 0]

    def loss_inputs(self, extra, obs):
        return {**obs, "tag": jnp.full(obs["obs"].shape[:1], extra["frozen"]["tag"])}


def test_a_networks_loss_inputs_are_computed_once_per_rollout_and_read_by_the_loss():
    # The rollout's own steps see no tag (the policy there is never priced); every minibatch of the
    # loss does, so the logged penalty is the frozen 2.5 at every update.
    config = PPOConfig(env="masked-bandit", num_envs=3, num_steps=8, num_minibatches=4, update_epochs=2,
                       reset_mode="auto", total_timesteps=3 * 8 * 2)
    runner, metrics = make_train(config, env=MaskedBandit(), network=LossInputsNet())(jax.random.PRNGKey(0))
    np.testing.assert_allclose(metrics["penalty"][:, 0], [2.5, 2.5])
    assert set(runner.obs) == {"obs", "action_mask"}  # the runner's observations stay the env's


def test_anneal_start_holds_the_rate_then_decays_to_zero_at_the_last_update():
    # 10 updates of 2 epochs x 2 minibatches: 40 optimizer steps, the decay from update 7 (step 28)
    config = PPOConfig(env="gymnax:CartPole-v1", num_envs=4, num_steps=8, update_epochs=2, num_minibatches=2,
                       total_timesteps=320, lr=1e-3, anneal_start=0.75)
    lr = make_train(config).learning_rate()
    assert [float(lr(s)) for s in (0, 27, 28)] == pytest.approx([1e-3, 1e-3, 1e-3])
    assert float(lr(34)) == pytest.approx(1e-3 * 6 / 12) and float(lr(40)) == 0.0
    plain = make_train(dataclasses.replace(config, anneal_start=0.0)).learning_rate()
    assert float(plain(20)) == pytest.approx(5e-4) and float(plain(40)) == 0.0
    assert make_train(dataclasses.replace(config, anneal_lr=False, anneal_start=0.0)).learning_rate() == 1e-3
    with pytest.raises(ConfigError, match=r"'anneal_start' \(0.5\) needs 'anneal_lr: true'"):
        dataclasses.replace(config, anneal_lr=False, anneal_start=0.5).validate()
    with pytest.raises(ConfigError, match=r"'anneal_start' must lie in \[0, 1\)"):
        dataclasses.replace(config, anneal_start=1.0).validate()


# ---------------------------------------------------------------------------- minibatch constraints


def test_purejaxrl_cartpole_settings_are_accepted():
    # Minibatches are cut along time: 4 envs with the default 8 minibatches is fine.
    trainer = make_train(PPOConfig(env="gymnax:CartPole-v1", num_envs=4, num_steps=128))
    assert trainer.config.num_minibatches == 8 and trainer.envs_per_shard == 4


def test_minibatch_constraint_errors_name_the_key(capsys, tmp_path):
    with pytest.raises(ConfigError, match=r"num_steps \(12\) must be divisible by num_minibatches \(8\).*"
                                          r"Change num_minibatches or num_steps"):
        PPOConfig(num_steps=12, num_minibatches=8).validate()
    from jaxrl_hier.train import main

    # Through the CLI: exit code 2 and the message, for a recurrent network's split over envs.
    assert main(["--output-dir", str(tmp_path / "run"), "network=gru", "num_envs=100", "num_minibatches=8"]) == 2
    assert "num_envs (100) must be divisible by num_minibatches (8)" in capsys.readouterr().err
