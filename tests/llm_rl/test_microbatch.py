"""Gradient accumulation over micro-batches (llm_rl.microbatch): the sum of the micro-batch gradients
and statistics equals the whole batch's when the loss is a weighted sum over rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.llm_rl.microbatch import accumulate_gradients, split_rows


def test_accumulated_gradient_equals_the_whole_batch_and_none_leaves_pass():
    x = jax.random.normal(jax.random.key(0), (8, 3))
    w = jnp.linspace(0.1, 0.8, 8)  # per-row weights fixed for the whole batch
    params = {"a": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array(0.3)}

    def loss(p, batch):
        xs, ws, extra = batch
        assert extra is None
        per_row = jnp.tanh(xs @ p["a"] + p["b"]) ** 2
        return jnp.sum(ws * per_row), {"rows": jnp.sum(ws > 0).astype(jnp.float32), "loss": jnp.sum(ws * per_row)}

    whole_loss, whole_grad = jax.value_and_grad(lambda p: loss(p, (x, w, None))[0])(params)
    grads, aux = jax.jit(lambda p: accumulate_gradients(loss, p, split_rows((x, w, None), 4)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), grads, whole_grad)
    assert float(aux["rows"]) == 8.0 and float(aux["loss"]) == pytest.approx(float(whole_loss), rel=1e-5)
    with pytest.raises(ValueError, match="do not split into 3"):
        split_rows((x, w), 3)


def test_fixed_batches_pad_the_last_batch_with_its_first_row():
    from jaxrl_hier.llm_rl.data import fixed_batches

    ids, mask = np.arange(14).reshape(7, 2), np.arange(7)
    got = list(fixed_batches(3, ids, mask))
    assert [(start, n) for start, n, _ in got] == [(0, 3), (3, 3), (6, 1)]
    assert all(a.shape == (3, 2) and m.shape == (3,) for _, _, (a, m) in got)  # one shape for every call
    np.testing.assert_array_equal(got[2][2][0], [[12, 13]] * 3)
    np.testing.assert_array_equal(got[2][2][1], [6, 6, 6])
    np.testing.assert_array_equal(np.concatenate([a[:n] for _, n, (a, _) in got]), ids)  # real rows, in order
    assert list(fixed_batches(4, np.zeros((0, 2)))) == []
