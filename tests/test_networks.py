"""Actor-critic networks: output shapes, the pixel CNN, action masks, and the GRU's resets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.networks import MASKED_LOGIT, ScannedGRU, make_network


@pytest.mark.parametrize("kind, obs_shape", [("mlp", (5, 12)), ("cnn", (5, 33, 27, 3))])
def test_actor_critic_outputs(kind, obs_shape):
    net = make_network(kind, num_actions=7, hidden_size=32, num_layers=2, activation="tanh")
    obs = jax.random.uniform(jax.random.PRNGKey(0), obs_shape)
    params = net.init(jax.random.PRNGKey(1), obs)
    pi, value = net.apply(params, obs)
    assert pi.logits.shape == (5, 7) and value.shape == (5,)
    # The policy head starts near uniform (orthogonal init with scale 0.01).
    assert jnp.abs(pi.probs - 1 / 7).max() < 0.05
    # Different observations give different values: the trunk is wired to the input.
    assert jnp.unique(value).size == 5


def test_unknown_network():
    with pytest.raises(ValueError, match="unknown network 'rnn'"):
        make_network("rnn", 3, 8, 1, "tanh")


@pytest.mark.parametrize("kind", ["mlp", "gru"])
def test_action_mask_pushes_masked_logits_down(kind):
    net = make_network(kind, num_actions=4, hidden_size=16, num_layers=1, activation="tanh")
    x = jax.random.uniform(jax.random.PRNGKey(0), (3, 5))
    mask = jnp.array([[True, False, True, True], [False, False, False, True], [True] * 4])
    recurrent = kind == "gru"

    def run(params, obs):  # (logits, value); the GRU sees the batch as one time step
        if not recurrent:
            pi, value = net.apply(params, obs)
            return pi, value
        _, pi, value = net.apply(params, net.initialize_carry((3,)), jax.tree.map(lambda a: a[None], obs),
                                 jnp.zeros((1, 3), bool))
        return pi, value[0]

    init_args = (net.initialize_carry((3,)), x[None], jnp.zeros((1, 3), bool)) if recurrent else (x,)
    params = net.init(jax.random.PRNGKey(1), *init_args)
    pi_plain, v_plain = run(params, x)
    pi, value = run(params, {"obs": x, "action_mask": mask})
    logits, probs = pi.logits.reshape(3, 4), pi.probs.reshape(3, 4)  # distrax's logits are log-probabilities
    # Masked actions: a large finite negative logit (not -inf, which makes the entropy NaN), probability 0.
    assert jnp.isfinite(logits).all() and (logits[~mask] < MASKED_LOGIT / 2).all() and (probs[~mask] == 0).all()
    assert jnp.isfinite(pi.entropy()).all()
    # Legal actions keep their relative probabilities: the network read obs["obs"] as it reads x.
    legal = pi_plain.probs.reshape(3, 4) * mask
    np.testing.assert_allclose(probs, legal / legal.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(probs[1], [0, 0, 0, 1])  # one legal action left
    np.testing.assert_array_equal(value, v_plain)  # the mask only touches the policy


def test_gru_resets_hidden_where_an_episode_starts():
    gru = ScannedGRU(8)
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 2, 3))  # [T, B, features]
    h0 = jax.random.normal(jax.random.PRNGKey(1), (2, 8))
    no_reset = jnp.zeros((6, 2), bool)
    params = gru.init(jax.random.PRNGKey(2), h0, (x, no_reset))
    _, full = gru.apply(params, h0, (x, no_reset))
    # Carrying the hidden state across two calls is the same as one call over the whole sequence.
    h_mid, first = gru.apply(params, h0, (x[:3], no_reset[:3]))
    _, second = gru.apply(params, h_mid, (x[3:], no_reset[3:]))
    np.testing.assert_allclose(jnp.concatenate([first, second]), full, rtol=1e-6, atol=1e-6)
    # A reset at t=3 in env 0: from there env 0 runs as from a zero state, env 1 is untouched.
    reset = no_reset.at[3, 0].set(True)
    _, out = gru.apply(params, h0, (x, reset))
    _, fresh = gru.apply(params, jnp.zeros((2, 8)), (x[3:], no_reset[3:]))
    np.testing.assert_allclose(out[3:, 0], fresh[:, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[:, 1], full[:, 1])
    assert not np.allclose(out[3:, 0], full[3:, 0])


def test_bf16_matmul_rounds_its_operands_and_accumulates_in_float32():
    from jaxrl_hier.networks.precision import bf16_matmul

    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x, w = jax.random.normal(kx, (48, 40)), jax.random.normal(kw, (40, 24))
    g = jax.random.normal(kg, (48, 24))  # the cotangent of the product
    r = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731
    hi = jax.lax.Precision.HIGHEST
    y, vjp = jax.vjp(bf16_matmul, x, w)
    dx, dw = vjp(g)
    assert y.dtype == dx.dtype == dw.dtype == jnp.float32
    # Every product (forward, input cotangent, kernel cotangent) is of bf16-rounded operands.
    np.testing.assert_allclose(y, jnp.dot(r(x), r(w), precision=hi), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, jnp.dot(r(g), r(w).T, precision=hi), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, jnp.dot(r(x).T, r(g), precision=hi), rtol=1e-5, atol=1e-5)
    # ... and so differs from the float32 product, by bf16's rounding only.
    assert 0 < float(jnp.abs(dw - x.T @ g).max()) < 0.02 * float(jnp.abs(x.T @ g).max())


def test_bf16_mlp_keeps_float32_parameters_and_follows_the_float32_network():
    obs = jax.random.uniform(jax.random.PRNGKey(0), (6, 3, 12))  # leading axes are flattened and restored
    f32 = make_network("mlp", num_actions=5, hidden_size=32, num_layers=2, activation="tanh")
    bf16 = make_network("mlp", num_actions=5, hidden_size=32, num_layers=2, activation="tanh", matmul_dtype="bfloat16")
    params = bf16.init(jax.random.PRNGKey(1), obs)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    (pi_a, v_a), (pi_b, v_b) = f32.apply(params, obs), bf16.apply(params, obs)
    assert pi_b.logits.shape == (6, 3, 5) and v_b.shape == (6, 3) and v_b.dtype == jnp.float32
    np.testing.assert_allclose(pi_b.logits, pi_a.logits, atol=2e-3)
    np.testing.assert_allclose(v_b, v_a, atol=3e-2)
    assert not np.array_equal(np.asarray(v_b), np.asarray(v_a))  # the products really ran in bf16


def test_bf16_matmuls_are_for_the_mlp_only():
    with pytest.raises(ValueError, match="for the 'mlp' network only, not 'cnn'"):
        make_network("cnn", 3, 8, 1, "tanh", matmul_dtype="bfloat16")
