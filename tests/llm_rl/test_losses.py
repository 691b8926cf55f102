"""GRPO / DAPO / Dr.GRPO losses, advantages and overlong shaping against hand-computed numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.llm_rl import losses

# Two completions of lengths 2 (then padding) and 3; ratios chosen to hit both clip branches.
RATIOS = np.array([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
ADV = np.array([1.0, -2.0], np.float32)
OLD = np.full((2, 3), -1.0, np.float32)


def _loss(loss_type, logp=None, **kw):
    logp = np.log(RATIOS) + OLD if logp is None else logp
    w = losses.token_weights(jnp.asarray(MASK), loss_type, max_completion_length=3)
    return losses.policy_loss(jnp.asarray(logp), jnp.asarray(OLD), jnp.asarray(ADV), w, eps_low=0.2, eps_high=0.28, **kw)


# Surrogates by hand: row 0 (A = 1): min(1.5, 1.28) = 1.28 (clipped), min(0.5, 0.8) = 0.5;
# row 1 (A = -2): -2.2, min(-1.4, -1.6) = -1.6 (clipped), min(-4.0, -2.56) = -4.0.  Sums: 1.78 and -7.8.
@pytest.mark.parametrize("loss_type, expected", [
    ("grpo", -(1.78 / 2 + -7.8 / 3) / 2),   # sequence mean of token means
    ("dapo", -(1.78 - 7.8) / 5),            # one token mean over the batch
    ("dr_grpo", -(1.78 - 7.8) / (2 * 3)),   # constant normaliser G * L_max
])
def test_loss_variants_hand_computed(loss_type, expected):
    parts = _loss(loss_type)
    np.testing.assert_allclose(float(parts.loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(parts.pg_loss), expected, rtol=1e-5)


def test_clip_fraction_uses_the_loss_weights():
    parts = _loss("grpo")
    # clipped tokens: row 0 token 0 (weight 1/4) and row 1 token 1 (weight 1/6); weights sum to 1
    np.testing.assert_allclose(float(parts.clip_frac), 0.25 + 1 / 6, rtol=1e-5)


def test_padding_and_after_eos_tokens_change_nothing():
    garbage = np.log(RATIOS) + OLD
    garbage[0, 2] = 200.0  # would be exp(201) = inf without the mask guard
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        clean, dirty = _loss(loss_type), _loss(loss_type, logp=garbage)
        np.testing.assert_allclose(float(dirty.loss), float(clean.loss), rtol=1e-6)
    grad = jax.grad(lambda lp: _loss("dapo", logp=lp).loss)(jnp.asarray(garbage))
    assert np.all(np.isfinite(np.asarray(grad)))
    assert float(grad[0, 2]) == 0.0


def test_gradient_zero_on_clipped_tokens_only():
    grad = np.asarray(jax.grad(lambda lp: _loss("dapo", logp=lp).loss)(jnp.asarray(np.log(RATIOS) + OLD)))
    # d/dlogp of -(w r A) = -w r A on unclipped tokens; clipped tokens get no gradient
    expected = -np.array([[0.0, 0.5 * 1.0, 0.0], [1.1 * -2.0, 0.0, 2.0 * -2.0]]) / 5
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_kl_estimators_and_beta():
    lp, ref = jnp.array([[-1.0]]), jnp.array([[-2.0]])
    np.testing.assert_allclose(float(losses.kl_penalty(lp, ref, "k1")[0, 0]), 1.0)
    np.testing.assert_allclose(float(losses.kl_penalty(lp, ref, "k3")[0, 0]), np.exp(-1.0) + 1.0 - 1.0, rtol=1e-6)
    ref = np.log(RATIOS) + OLD - 0.5  # every token's ref log-prob 0.5 below the policy's
    k3 = np.exp(-0.5) + 0.5 - 1.0
    parts = _loss("dapo", beta=0.1, ref_logp=jnp.asarray(ref))
    np.testing.assert_allclose(float(parts.kl), k3, rtol=1e-5)
    np.testing.assert_allclose(float(parts.loss), -(1.78 - 7.8) / 5 + 0.1 * k3, rtol=1e-5)


def test_group_advantages_scalings():
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    std = np.sqrt(4 * 0.25 / 3)  # unbiased, as TRL
    np.testing.assert_allclose(np.asarray(losses.group_advantages(r, 4, "group"))[:4],
                               np.array([0.5, -0.5, -0.5, 0.5]) / (std + losses.STD_EPS), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(losses.group_advantages(r, 4, "group"))[4:], 0.0)
    np.testing.assert_allclose(np.asarray(losses.group_advantages(r, 4, "none")),
                               [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], atol=1e-7)
    bstd = np.std(np.asarray(r), ddof=1)
    np.testing.assert_allclose(np.asarray(losses.group_advantages(r, 4, "batch"))[:4],
                               np.array([0.5, -0.5, -0.5, 0.5]) / (bstd + losses.STD_EPS), rtol=1e-5)
    valid = jnp.array([1.0] * 4 + [0.0] * 4)
    np.testing.assert_allclose(np.asarray(losses.group_advantages(r, 4, "group", valid))[4:], 0.0)


def test_token_weights_ignore_invalid_rows():
    w = losses.token_weights(jnp.asarray(MASK), "grpo", 3, row_valid=jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(np.asarray(w), [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])


def test_overlong_penalty_ramp():
    from jaxrl_hier.tasks.base import overlong_penalty  # the one formula, shared with the tasks' rewards

    out = overlong_penalty(jnp.array([10, 12, 14, 16]), max_len=16, buffer=4, penalty=1.0, xp=jnp)
    np.testing.assert_allclose(np.asarray(out), [0.0, 0.0, -0.5, -1.0])
