"""Scalar value heads and classification (reward-model) heads on any backbone.

Both are pure init/apply pairs over small parameter dicts, applied to hidden states:
per-token values from a decoder's `hidden_states` [B, T, H], a sequence score from the last real
token (`gather_last`), or an encoder's pooled output [B, H]. Outputs are float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_hier.config import ConfigError

Params = dict[str, Any]


def value_head_init(key: jax.Array, hidden_size: int, dtype: Any = jnp.float32, std: float | None = None) -> Params:
    """A linear H -> 1 head; std defaults to 1/sqrt(H+1) (as TRL's value head layer's scale)."""
    std = (hidden_size + 1) ** -0.5 if std is None else std
    return {"kernel": (std * jax.random.normal(key, (hidden_size, 1), jnp.float32)).astype(dtype),
            "bias": jnp.zeros((1,), dtype)}


def value_head_apply(head: Params, hidden: jax.Array) -> jax.Array:
    """Values [...] (the hidden dims' leading shape) in float32."""
    out = jnp.matmul(hidden.astype(head["kernel"].dtype), head["kernel"], preferred_element_type=jnp.float32)
    return (out + head["bias"].astype(jnp.float32))[..., 0]


def classification_head_init(key: jax.Array, hidden_size: int, num_labels: int, *, hidden_layer: bool = False,
                             dtype: Any = jnp.float32, std: float = 0.02) -> Params:
    """A linear H -> num_labels head; with hidden_layer, dense(H) -> tanh first (RoBERTa's classifier)."""
    if num_labels < 1:
        raise ConfigError(f"num_labels must be >= 1, got {num_labels}.")
    k1, k2 = jax.random.split(key)
    head: Params = {"out": {"kernel": (std * jax.random.normal(k2, (hidden_size, num_labels))).astype(dtype),
                            "bias": jnp.zeros((num_labels,), dtype)}}
    if hidden_layer:
        head["dense"] = {"kernel": (std * jax.random.normal(k1, (hidden_size, hidden_size))).astype(dtype),
                         "bias": jnp.zeros((hidden_size,), dtype)}
    return head


def classification_head_apply(head: Params, features: jax.Array) -> jax.Array:
    """Logits [..., num_labels] in float32 from features [..., H]."""
    x = features.astype(head["out"]["kernel"].dtype)
    if "dense" in head:
        x = jnp.tanh(x @ head["dense"]["kernel"] + head["dense"]["bias"])
    out = jnp.matmul(x, head["out"]["kernel"], preferred_element_type=jnp.float32)
    return out + head["out"]["bias"].astype(jnp.float32)


def last_token_index(attention_mask: jax.Array) -> jax.Array:
    """Index of each row's last real token (works for left and right padding)."""
    t = attention_mask.shape[-1]
    return (t - 1 - jnp.argmax(jnp.flip(attention_mask > 0, axis=-1), axis=-1)).astype(jnp.int32)


def gather_last(x: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """x [B, T, ...] at each row's last real token -> [B, ...] (a decoder's sequence summary)."""
    idx = last_token_index(attention_mask)
    return jnp.take_along_axis(x, idx.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]
