"""Matrix products in bfloat16 with float32 parameters, for `flax.linen.Dense(dot_general=...)`.

`matmul_dot_general("bfloat16")` gives Dense a product that rounds both operands to bfloat16 and
accumulates in float32, in the forward pass and in both products of the backward pass (the input's
and the kernel's cotangents); parameters, optimiser state and every other op stay float32. On a CPU
with AVX-512 BF16 XLA runs such products faster than float32 (figures with their machine: the PPO
and Results pages of the docs); GPUs multiply bf16 natively too (this form is not yet timed on one);
on a CPU without native bf16 they are slower than float32, so float32 stays the default
(`PPOConfig.matmul_dtype`).

The backward pass is written out (`jax.custom_vjp`) because the one autodiff derives casts the
cotangent back to float32 and mixes dtypes in both products, which XLA:CPU then runs as float32
after converting each operand, slower than float32 throughout. The kernel's cotangent x^T g
contracts over the batch, the leading axis of both operands, and XLA:CPU's fast bf16 path takes a
left operand only when it contracts over its last axis; a transpose alone is folded back into the
product's dimension numbers, so the transposed input is materialised through a pad and a slice
that the simplifier leaves in place (one bf16 copy of the input, small beside the product).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

MATMUL_DTYPES = ("float32", "bfloat16")


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _materialised_transpose(x: jax.Array) -> jax.Array:
    """x.T as a row-major array of its own (see the module docstring)."""
    rows, cols = x.shape
    padded = jnp.pad(x.T, ((0, 0), (0, 1)))
    return lax.dynamic_slice(padded, (0, 0), (cols, rows))


@jax.custom_vjp
def bf16_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """float32[M, N] = bf16(x[M, K]) @ bf16(w[K, N]), accumulated in float32."""
    return _dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))


def _bf16_matmul_fwd(x, w):
    # The float32 operands are kept (the layer's input is held for the backward pass anyway) and
    # rounded again there, so that the cotangents come back in their dtypes.
    return bf16_matmul(x, w), (x, w)


def _bf16_matmul_bwd(res, g):
    x, w = res
    xb, wb, gb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), g.astype(jnp.bfloat16)
    dx = _dot(gb, wb.T)  # contracts over the kernel's output axis, the last of both: the fast path
    dw = _dot(_materialised_transpose(xb), gb)
    return dx.astype(x.dtype), dw.astype(w.dtype)


bf16_matmul.defvjp(_bf16_matmul_fwd, _bf16_matmul_bwd)


def bf16_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """Dense's product (lhs [..., K] by kernel [K, N]) through `bf16_matmul`; float32 out."""
    (lc, rc), (lb, rb) = dimension_numbers
    if tuple(lc) != (lhs.ndim - 1,) or tuple(rc) != (0,) or lb or rb or rhs.ndim != 2:
        raise ValueError("bf16_dot_general takes Dense's product only: lhs [..., K] by a [K, N] kernel.")
    out = bf16_matmul(lhs.reshape(-1, lhs.shape[-1]), rhs)
    return out.reshape(lhs.shape[:-1] + (rhs.shape[1],))


def matmul_dot_general(dtype: str) -> Callable:
    """The `dot_general` for Dense layers whose products run in `dtype` (one of MATMUL_DTYPES)."""
    if dtype == "float32":
        return lax.dot_general
    if dtype == "bfloat16":
        return bf16_dot_general
    raise ValueError(f"matmul dtype must be one of {MATMUL_DTYPES}, got '{dtype}'.")


__all__ = ["MATMUL_DTYPES", "bf16_dot_general", "bf16_matmul", "matmul_dot_general"]
