"""Gradient accumulation over micro-batches, for every LLM-RL update (GRPO, the guided agent).

A batch of rows is cut along its leading axis into `n` equal micro-batches; one `lax.scan` runs the
loss and its gradient on each in turn and sums gradients and auxiliary statistics. Peak activation
memory is then that of one micro-batch. The sum is the full batch's gradient exactly when the loss
is a sum over rows with weights fixed for the whole batch beforehand (`losses.token_weights`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def split_rows(tree: Any, num_micro: int) -> Any:
    """[R, ...] leaves -> [num_micro, R / num_micro, ...] (None leaves stay None)."""
    def cut(x):
        if x.shape[0] % num_micro:
            raise ValueError(f"{x.shape[0]} rows do not split into {num_micro} equal micro-batches.")
        return x.reshape((num_micro, x.shape[0] // num_micro) + x.shape[1:])

    return jax.tree.map(cut, tree)


def accumulate_gradients(loss_fn: Callable[[Any, Any], tuple[jax.Array, Any]], params: Any, micro_batches: Any
                         ) -> tuple[Any, Any]:
    """Sum over micro-batches of grad(loss_fn)(params, mb) and of its aux output.

    `loss_fn(params, mb) -> (loss, aux)`; `micro_batches` holds the micro-batches stacked on the
    leading axis (`split_rows`). Returns (summed gradients, summed aux)."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    if jax.tree.leaves(micro_batches)[0].shape[0] == 1:  # one micro-batch: no zero-filled sums to add into
        (_, aux), grads = grad_fn(params, first)
        return grads, aux
    aux_shape = jax.eval_shape(lambda p, mb: loss_fn(p, mb)[1], params, first)
    zeros = (jax.tree.map(jnp.zeros_like, params),
             jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shape))

    def body(acc, mb):
        (_, aux), grads = grad_fn(params, mb)
        return jax.tree.map(jnp.add, acc, (grads, aux)), None

    total, _ = jax.lax.scan(body, zeros, micro_batches)
    return total


__all__ = ["split_rows", "accumulate_gradients"]
