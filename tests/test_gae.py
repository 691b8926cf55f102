"""GAE against hand-computed values, with termination and truncation kept apart."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.algorithms.gae import gae

GAMMA, LAM = 0.9, 0.5
REWARDS = jnp.array([1.0, 2.0, 3.0])
VALUES = jnp.array([0.5, 0.6, 0.7])
FINAL = jnp.array([-5.0, 0.9, -5.0])  # only read where an episode ended
LAST = jnp.array(0.8)


def run(terminated, truncated):
    return gae(REWARDS, VALUES, jnp.array(terminated, bool), jnp.array(truncated, bool), FINAL, LAST, GAMMA, LAM)


def test_no_episode_end_is_plain_gae():
    adv, targets = run([0, 0, 0], [0, 0, 0])
    d2 = 3 + GAMMA * 0.8 - 0.7
    d1 = 2 + GAMMA * 0.7 - 0.6
    d0 = 1 + GAMMA * 0.6 - 0.5
    a2 = d2
    a1 = d1 + GAMMA * LAM * a2
    a0 = d0 + GAMMA * LAM * a1
    np.testing.assert_allclose(adv, [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(targets, np.array([a0, a1, a2]) + np.array(VALUES), rtol=1e-6)


def test_truncation_bootstraps_from_final_obs_value():
    adv, _ = run([0, 0, 0], [0, 1, 0])
    a2 = 3 + GAMMA * 0.8 - 0.7
    a1 = 2 + GAMMA * 0.9 - 0.6  # V(final_obs) = 0.9, and the recursion stops here
    a0 = (1 + GAMMA * 0.6 - 0.5) + GAMMA * LAM * a1
    np.testing.assert_allclose(adv, [a0, a1, a2], rtol=1e-6)


def test_termination_bootstraps_zero():
    adv, _ = run([0, 1, 0], [0, 0, 0])
    a1 = 2 - 0.6
    a0 = (1 + GAMMA * 0.6 - 0.5) + GAMMA * LAM * a1
    np.testing.assert_allclose(adv[:2], [a0, a1], rtol=1e-6)


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_batched_envs_are_independent(flag):
    # Two envs: the episode end in env 0 must not leak into env 1.
    T = 3
    rewards = jnp.stack([REWARDS, REWARDS], 1)
    values = jnp.stack([VALUES, VALUES], 1)
    ends = jnp.zeros((T, 2), bool).at[1, 0].set(True)
    zeros = jnp.zeros((T, 2), bool)
    term, trunc = (ends, zeros) if flag == "terminated" else (zeros, ends)
    adv, _ = gae(rewards, values, term, trunc, jnp.stack([FINAL, FINAL], 1), jnp.array([0.8, 0.8]), GAMMA, LAM)
    plain, _ = run([0, 0, 0], [0, 0, 0])
    np.testing.assert_allclose(adv[:, 1], plain, rtol=1e-6)
    assert not np.allclose(adv[:, 0], plain)
