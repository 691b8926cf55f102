"""RoBERTa encoder (ArCHer's critic backbone is roberta-base) on the decoder's building blocks.

Differences from the decoder: bidirectional attention, post-norm layers (x = LN(x + sublayer(x))),
a LayerNorm after the embeddings, token-type embeddings, positions that start after `padding_idx`
(pad_token_id + 1 for the first real token, padding_idx for padding, as transformers computes them
from the input ids), and the pooler tanh(dense(h[:, 0])). Parameter names match the decoder's
(`layers/q_proj`, `layers/up_proj`, ...), so LoRA and the partition rules apply unchanged; here
`attn_norm` / `mlp_norm` are the LayerNorms *after* attention / MLP.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import layers as L
from jaxrl_hier.llm import sharding
from jaxrl_hier.llm.lora import Lora
from jaxrl_hier.llm.model_config import ModelConfig

Params = dict[str, Any]


def _init_params(config: ModelConfig, key: jax.Array, dtype: Any, pooler: bool = True) -> Params:
    if config.family != "roberta":
        raise ConfigError(f"{config.model_type} is a decoder; use jaxrl_hier.llm.decoder.init_params.")
    return L.traced_init(lambda init: _build(config, init, dtype, pooler), key)


def _build(config: ModelConfig, init: L.Init, dtype: Any, pooler: bool) -> Params:
    c, n, h, i = config, config.num_layers, config.hidden_size, config.intermediate_size

    def proj(fan_in: int, fan_out: int) -> Params:
        return {"kernel": init.normal((n, fan_in, fan_out), dtype), "bias": init.zeros((n, fan_out), dtype)}

    def ln(shape: tuple[int, ...]) -> Params:
        return {"scale": init.ones(shape, dtype), "bias": init.zeros(shape, dtype)}

    params: Params = {
        "embed": {"embedding": init.normal((c.vocab_size, h), dtype)},
        "pos_embed": {"embedding": init.normal((c.max_position_embeddings, h), dtype)},
        "type_embed": {"embedding": init.normal((c.type_vocab_size, h), dtype)},
        "embed_norm": ln((h,)),
        "layers": {"q_proj": proj(h, h), "k_proj": proj(h, h), "v_proj": proj(h, h), "o_proj": proj(h, h),
                   "attn_norm": ln((n, h)), "up_proj": proj(h, i), "down_proj": proj(i, h), "mlp_norm": ln((n, h))},
    }
    if pooler:
        params["pooler"] = {"kernel": init.normal((h, h), dtype), "bias": init.zeros((h,), dtype)}
    return params


def init_params(config: ModelConfig, key: jax.Array, dtype: Any = jnp.float32, mesh: Mesh | None = None,
                pooler: bool = True) -> Params:
    """Random RoBERTa weights (N(0, 0.02), unit LayerNorms, zero biases), sharded when a mesh is given."""
    if config.family != "roberta":
        raise ConfigError(f"{config.model_type} is a decoder; use jaxrl_hier.llm.decoder.init_params.")
    shardings = None if mesh is None else sharding.param_shardings(param_shapes(config, dtype, pooler), mesh)
    return L.init_tree(lambda init: _build(config, init, dtype, pooler), key, shardings)


def param_shapes(config: ModelConfig, dtype: Any = jnp.float32, pooler: bool = True) -> Params:
    return jax.eval_shape(lambda k: _init_params(config, k, dtype, pooler), jax.random.key(0))


def positions_from_ids(input_ids: jax.Array, padding_idx: int) -> jax.Array:
    """RoBERTa position ids: padding_idx + 1, + 2, ... over non-pad tokens; padding_idx on padding."""
    real = (input_ids != padding_idx).astype(jnp.int32)
    return (jnp.cumsum(real, axis=-1) * real + padding_idx).astype(jnp.int32)


def _layer(config: ModelConfig, x: jax.Array, p: Params, lora: Params, scale: float, allowed: jax.Array,
           mesh: Mesh | None) -> jax.Array:
    c = config
    b, t, _ = x.shape
    q = L.dense(x, p["q_proj"], lora.get("q_proj"), scale).reshape(b, t, c.num_heads, c.head_dim)
    k = L.dense(x, p["k_proj"], lora.get("k_proj"), scale).reshape(b, t, c.num_heads, c.head_dim)
    v = L.dense(x, p["v_proj"], lora.get("v_proj"), scale).reshape(b, t, c.num_heads, c.head_dim)
    attn = L.attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), allowed, c.head_dim**-0.5)
    x = L.norm(x + L.dense(attn, p["o_proj"], lora.get("o_proj"), scale), p["attn_norm"], c)
    up = L.activation(L.dense(x, p["up_proj"], lora.get("up_proj"), scale), c.activation)
    x = L.norm(x + L.dense(up, p["down_proj"], lora.get("down_proj"), scale), p["mlp_norm"], c)
    return sharding.constrain_batch(x, mesh)


def forward(config: ModelConfig, params: Params, input_ids: jax.Array, attention_mask: jax.Array, *,
            token_type_ids: jax.Array | None = None, lora: Lora | None = None,
            mesh: Mesh | None = None) -> tuple[jax.Array, jax.Array | None]:
    """Hidden states [B, T, H] and the pooled output [B, H] (None when the checkpoint has no pooler)."""
    input_ids, attention_mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ConfigError(f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} must both be "
                          "[batch, length].")
    if token_type_ids is None:
        token_type_ids = jnp.zeros_like(input_ids)
    positions = positions_from_ids(input_ids, config.pad_token_id)
    x = (jnp.take(params["embed"]["embedding"], input_ids, axis=0)
         + jnp.take(params["pos_embed"]["embedding"], positions, axis=0)
         + jnp.take(params["type_embed"]["embedding"], token_type_ids, axis=0))
    x = sharding.constrain_batch(L.norm(x, params["embed_norm"], config), mesh)
    allowed = jnp.broadcast_to(attention_mask[:, None, :] > 0, (x.shape[0], x.shape[1], x.shape[1]))
    lora_layers = lora.params["layers"] if lora is not None else {}
    scale = lora.scale if lora is not None else 1.0

    def body(x, xs):
        p, lp = xs
        return _layer(config, x, p, lp, scale, allowed, mesh), None

    x, _ = jax.lax.scan(body, x, (params["layers"], lora_layers))
    pooled = None
    if "pooler" in params:
        pooled = jnp.tanh(L.dense(x[:, 0], params["pooler"]))
    return x, pooled
