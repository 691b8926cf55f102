"""Building blocks shared by the decoder and the encoder: norms, dense (+LoRA), rotary embeddings,
grouped-query attention. Pure functions over parameter dicts; numerics follow transformers
(norms and softmax in float32, results cast back to the activation dtype)."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.llm.model_config import ModelConfig

Params = dict[str, Any]
NEG_INF = float(np.finfo(np.float32).min)  # finite, so a fully masked (padding) row stays NaN-free


def norm(x: jax.Array, p: Params, config: ModelConfig) -> jax.Array:
    """RMSNorm (Llama family) or LayerNorm (GPT-2, RoBERTa), computed in float32."""
    h = x.astype(jnp.float32)
    if config.norm == "rms":
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + config.norm_eps)
        # transformers casts back to the activation dtype before the weight multiply
        return p["scale"] * h.astype(x.dtype)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(var + config.norm_eps)
    return (h * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def rms_norm_heads(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """Qwen3's per-head q/k RMSNorm over head_dim."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    return scale * h.astype(x.dtype)


def dense(x: jax.Array, p: Params, lora: Params | None = None, scale: float = 1.0) -> jax.Array:
    """x @ kernel (+ bias), plus the LoRA update scale * (x @ a) @ b when an adapter is given."""
    # one 2-D matmul over all leading axes: XLA:CPU computes the kernel gradient of a [B, T, H] @
    # [H, O] product about twice as slowly as that of the same product reshaped to [B * T, H]
    y = (x.reshape(-1, x.shape[-1]) @ p["kernel"]).reshape(*x.shape[:-1], p["kernel"].shape[-1])
    if "bias" in p:
        y = y + p["bias"]
    if lora is not None:
        update = (x.astype(lora["a"].dtype) @ lora["a"]) @ lora["b"]
        y = y + (scale * update).astype(y.dtype)
    return y


def activation(x: jax.Array, name: str) -> jax.Array:
    if name == "silu":
        return jax.nn.silu(x)
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.relu(x)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Rotary inverse frequencies [head_dim / 2] as transformers computes them (incl. 'llama3' scaling)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    inv_freq = inv_freq.astype(np.float32)
    if config.rope_type == "linear":
        return (inv_freq / config.rope_factor).astype(np.float32)
    if config.rope_type == "llama3":
        factor, low, high = config.rope_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
        old_len = config.rope_original_max_positions
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


def rope_tables(config: ModelConfig, positions: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, head_dim] for integer positions [B, T]."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate [B, T, heads, head_dim] by the tables (the 'rotate_half' layout of HF checkpoints)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention.

    q [B, T, heads, D]; k, v [B, kv_heads, S, D] (head-major, the KV cache's layout); allowed
    [B, T, S] (True = may attend). Scores and softmax in float32. Returns [B, T, heads * D] in v's
    dtype. A query that may attend to nothing (left padding before the first token) gets a zero
    output, as torch's SDPA gives.
    """
    b, t, heads, d = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(b, t, kv_heads, heads // kv_heads, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    mask = allowed[:, None, None]
    probs = jax.nn.softmax(jnp.where(mask, scores, NEG_INF), axis=-1)
    probs = jnp.where(jnp.any(mask, axis=-1, keepdims=True), probs, 0.0).astype(v.dtype)
    # [.., T, S] @ [.., S, D] as a plain batched matmul, transposed after: asked for "btkgd"
    # directly, XLA:CPU contracts v over its major axis, a slow kernel
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, heads * d)


def normal(key: jax.Array, shape: tuple[int, ...], dtype: Any, std: float = 0.02) -> jax.Array:
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


HOST_INIT_MAX = 1 << 24  # models up to 16M weights are drawn on the host


class Init:
    """What a parameter builder needs: normal(shape, dtype) with N(0, std), ones, zeros.

    On the device (`xp` = jax.numpy, one key per array, traced inside a jit whose outputs are
    created in their shardings) or on the host (`xp` = numpy, a generator seeded by the key):
    XLA:CPU spends ~30 ms compiling each output of an init program, which small (test) models
    avoid on the host. Both are deterministic in the key (with different numbers).
    """

    def __init__(self, key: jax.Array, *, host: bool, count: int = 0, std: float = 0.02) -> None:
        self.host, self.std = host, std
        if host:
            self._rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        else:
            self._keys = iter(jax.random.split(key, max(count, 1)))

    def normal(self, shape: tuple[int, ...], dtype: Any, std: float | None = None) -> Any:
        """N(0, std) with the builder's default std unless one is given."""
        std = self.std if std is None else std
        if self.host:
            return (std * self._rng.standard_normal(shape, np.float32)).astype(jnp.dtype(dtype))
        return normal(next(self._keys), shape, dtype, std)

    def ones(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return (np if self.host else jnp).ones(shape, jnp.dtype(dtype))

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return (np if self.host else jnp).zeros(shape, jnp.dtype(dtype))


class _Shapes(Init):
    """Records the normal draws a builder makes (no arrays created)."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def normal(self, shape: tuple[int, ...], dtype: Any, std: float | None = None) -> Any:
        self.shapes.append(tuple(shape))
        return jax.ShapeDtypeStruct(shape, dtype)

    def ones(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype)

    zeros = ones


def init_tree(build: Callable[[Init], Any], key: jax.Array, shardings: Any = None, std: float = 0.02) -> Any:
    """Random parameters from `build(init)`: drawn on the host for small models, else by a jitted
    program whose outputs are created directly in their shardings (never whole on one device)."""
    rec = _Shapes()
    build(rec)
    if isinstance(key, jax.core.Tracer):  # called under jit / eval_shape: stay traced
        return build(Init(key, host=False, count=len(rec.shapes), std=std))
    if sum(int(np.prod(s)) for s in rec.shapes) <= HOST_INIT_MAX:
        tree = build(Init(key, host=True, std=std))
        return jax.device_put(tree, shardings) if shardings is not None else jax.device_put(tree)
    fn = jax.jit(lambda k: build(Init(k, host=False, count=len(rec.shapes), std=std)), out_shardings=shardings)
    return fn(key)


def traced_init(build: Callable[[Init], Any], key: jax.Array) -> Any:
    """`build` on the device path (for jax.eval_shape and jit)."""
    rec = _Shapes()
    build(rec)
    return build(Init(key, host=False, count=len(rec.shapes)))
