"""One decoder-only transformer for Llama (incl. Llama 3 rope scaling), Mistral, Qwen2/2.5, Qwen3
and GPT-2, with the family differences as `ModelConfig` switches.

Parameters are a plain dict; the layers are stacked along a leading [num_layers] axis and run
with `lax.scan` (one compiled layer whatever the depth):

    embed/embedding [V, H]            pos_embed/embedding [P, H]       (GPT-2 only)
    layers/attn_norm/{scale,bias}     layers/{q,k,v}_proj/{kernel,bias} [L, H, heads*D]
    layers/q_norm, k_norm/scale [L, D] (Qwen3)                     layers/o_proj [L, heads*D, H]
    layers/mlp_norm/{scale,bias}      layers/{gate,up}_proj [L, H, I]  layers/down_proj [L, I, H]
    final_norm/{scale,bias}           lm_head/kernel [H, V]            (untied models only)

Biases and LayerNorm biases exist only where the family has them. GPT-2's fused c_attn is split
into q/k/v on load and joined again on save, so every family uses the same projections.

`forward` without a cache scores a left-padded [B, T] batch; with a cache (`init_cache`) it writes
the new tokens' keys and values at slots cache_index .. cache_index + T - 1 and attends causally
by slot over the slots whose `attention_mask` is 1 (incremental decoding).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import layers as L
from jaxrl_hier.llm import sharding
from jaxrl_hier.llm.lora import Lora, proj_shapes
from jaxrl_hier.llm.model_config import ModelConfig

Params = dict[str, Any]

__all__ = ["KVCache", "ModelConfig", "forward", "hidden_states", "shared_prefix_hidden_states", "init_cache",
           "init_params", "default_positions", "unstack_layers", "unrolls_decode", "fuse_projections", "frozen_copy"]


class KVCache(NamedTuple):
    """Keys and values of every layer: [num_layers, batch, num_kv_heads, max_len, head_dim].

    Head-major, as attention reads them: a decode step attends over a layer's cache as it lies
    instead of transposing all of it every step."""

    k: jax.Array
    v: jax.Array


# ----------------------------------------------------------------------------- parameters


def _norm_params(init: L.Init, config: ModelConfig, shape: tuple[int, ...], dtype: Any) -> Params:
    p = {"scale": init.ones(shape, dtype)}
    if config.norm == "layer":
        p["bias"] = init.zeros(shape, dtype)
    return p


def _proj(init: L.Init, layers: int, fan_in: int, fan_out: int, bias: bool, dtype: Any) -> Params:
    p = {"kernel": init.normal((layers, fan_in, fan_out), dtype)}
    if bias:
        p["bias"] = init.zeros((layers, fan_out), dtype)
    return p


def _init_params(config: ModelConfig, key: jax.Array, dtype: Any) -> Params:
    """Traceable random init (used for shapes; init_params picks host or device drawing)."""
    return L.traced_init(lambda init: _build(config, init, dtype), key)


def _build(config: ModelConfig, init: L.Init, dtype: Any) -> Params:
    c, n = config, config.num_layers
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer: Params = {
        "attn_norm": _norm_params(init, c, (n, c.hidden_size), dtype),
        "q_proj": _proj(init, n, c.hidden_size, q_width, c.qkv_bias, dtype),
        "k_proj": _proj(init, n, c.hidden_size, kv_width, c.qkv_bias, dtype),
        "v_proj": _proj(init, n, c.hidden_size, kv_width, c.qkv_bias, dtype),
        "o_proj": _proj(init, n, q_width, c.hidden_size, c.o_bias, dtype),
        "mlp_norm": _norm_params(init, c, (n, c.hidden_size), dtype),
        "up_proj": _proj(init, n, c.hidden_size, c.intermediate_size, c.mlp_bias, dtype),
        "down_proj": _proj(init, n, c.intermediate_size, c.hidden_size, c.mlp_bias, dtype),
    }
    if c.gated_mlp:
        layer["gate_proj"] = _proj(init, n, c.hidden_size, c.intermediate_size, c.mlp_bias, dtype)
    if c.qk_norm:
        layer["q_norm"] = {"scale": init.ones((n, c.head_dim), dtype)}
        layer["k_norm"] = {"scale": init.ones((n, c.head_dim), dtype)}
    params: Params = {
        "embed": {"embedding": init.normal((c.vocab_size, c.hidden_size), dtype)},
        "layers": layer,
        "final_norm": _norm_params(init, c, (c.hidden_size,), dtype),
    }
    if not c.rope:
        params["pos_embed"] = {"embedding": init.normal((c.max_position_embeddings, c.hidden_size), dtype)}
    if not c.tie_word_embeddings:
        params["lm_head"] = {"kernel": init.normal((c.hidden_size, c.vocab_size), dtype)}
    return params


def init_params(config: ModelConfig, key: jax.Array, dtype: Any = jnp.float32, mesh: Mesh | None = None) -> Params:
    """Random weights (N(0, 0.02), unit norms, zero biases) for tests and benchmarks.

    Deterministic in `key`. With a mesh every weight is created directly in its shard.
    """
    if not config.is_decoder:
        raise ConfigError(f"{config.model_type} is an encoder; use jaxrl_hier.llm.encoder.init_params.")
    shardings = None if mesh is None else sharding.param_shardings(param_shapes(config, dtype), mesh)
    return L.init_tree(lambda init: _build(config, init, dtype), key, shardings)


def param_shapes(config: ModelConfig, dtype: Any = jnp.float32) -> Params:
    """The parameter tree as ShapeDtypeStructs (no memory allocated)."""
    return jax.eval_shape(lambda k: _init_params(config, k, dtype), jax.random.key(0))


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = jnp.float32,
               mesh: Mesh | None = None) -> KVCache:
    """An empty cache for `batch` rows of `max_len` slots (batch over data x fsdp, kv heads over tensor)."""
    shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
    k, v = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
    if mesh is not None:
        spec = sharding.cache_spec(mesh, shape)
        k, v = sharding.constrain(k, mesh, spec), sharding.constrain(v, mesh, spec)
    return KVCache(k, v)


# ----------------------------------------------------------------------------- forward


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """Position ids of left-padded rows: 0 at the first real token, padding clipped to 0."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


def _cache_shape(cache: KVCache) -> tuple[int, ...]:
    """[num_layers, batch, kv_heads, max_len, head_dim] of a stacked or per-layer (tuple) cache."""
    if isinstance(cache.k, (tuple, list)):
        return (len(cache.k), *cache.k[0].shape)
    return tuple(cache.k.shape)


def _check_inputs(config: ModelConfig, input_ids: jax.Array, attention_mask: jax.Array, positions: Any,
                  cache: KVCache | None, cache_index: Any) -> None:
    """Shape errors are reported before tracing goes further (all checks are on static shapes)."""
    if input_ids.ndim != 2:
        raise ConfigError(f"input_ids must be [batch, length], got shape {input_ids.shape}.")
    batch, length = input_ids.shape
    if cache is None:
        if attention_mask.shape != input_ids.shape:
            raise ConfigError(f"attention_mask {attention_mask.shape} must match input_ids {input_ids.shape} "
                              "when no cache is given.")
        if cache_index is not None:
            raise ConfigError("cache_index was given without a cache; pass cache=init_cache(...) too.")
        return
    shape = _cache_shape(cache)
    max_len = shape[3]
    if shape[:3] != (config.num_layers, batch, config.num_kv_heads) or shape[4:] != (config.head_dim,):
        raise ConfigError(f"cache shape {shape} does not fit this model and batch {batch}: expected "
                          f"({config.num_layers}, {batch}, {config.num_kv_heads}, max_len, {config.head_dim}).")
    if attention_mask.shape != (batch, max_len):
        raise ConfigError(f"with a cache, attention_mask must cover the cache slots: expected {(batch, max_len)}, "
                          f"got {attention_mask.shape}.")
    if positions is None or cache_index is None:
        raise ConfigError("with a cache, pass positions [batch, length] and cache_index (the first slot to write).")
    if length > max_len:
        raise ConfigError(f"{length} new tokens do not fit a cache of {max_len} slots.")


def _embed(config: ModelConfig, params: Params, input_ids: jax.Array, positions: jax.Array) -> jax.Array:
    x = jnp.take(params["embed"]["embedding"], input_ids, axis=0)
    if not config.rope:
        x = x + jnp.take(params["pos_embed"]["embedding"], positions, axis=0)
    return x


def _qkv(config: ModelConfig, x: jax.Array, p: Params, lora: Params, scale: float,
         rope: tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A block's attention inputs: q [B, T, heads, D] and k, v [B, kv_heads, T, D] of norm(x), rotated."""
    c = config
    b, t, _ = x.shape
    h = L.norm(x, p["attn_norm"], c)
    if "qkv_proj" in p:  # the decode layout's q|k|v kernel (fuse_projections): one matmul for the three
        nq, nk = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q, k, v = jnp.split(L.dense(h, p["qkv_proj"]), [nq, nq + nk], axis=-1)
    else:
        q, k, v = (L.dense(h, p[n], lora.get(n), scale) for n in ("q_proj", "k_proj", "v_proj"))
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k, v = k.reshape(b, t, c.num_kv_heads, c.head_dim), v.reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = L.rms_norm_heads(q, p["q_norm"]["scale"], c.norm_eps)
        k = L.rms_norm_heads(k, p["k_norm"]["scale"], c.norm_eps)
    if rope is not None:
        q, k = L.apply_rope(q, *rope), L.apply_rope(k, *rope)
    return q, k.swapaxes(1, 2), v.swapaxes(1, 2)


def _attend(config: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array, window: jax.Array, allowed: jax.Array,
            offsets: jax.Array) -> jax.Array:
    # sliding window (0 = none): a query at slot i sees slot j only when i - j < window
    allowed = allowed & ((window == 0) | (offsets < window))[None]
    return L.attention(q, k, v, allowed, config.head_dim**-0.5 if config.scale_attn else 1.0)


def _finish(config: ModelConfig, x: jax.Array, attn: jax.Array, p: Params, lora: Params, scale: float,
            mesh: Mesh | None) -> jax.Array:
    """The rest of a block: x + o_proj(attn), then + mlp(norm(x))."""
    c = config
    x = sharding.constrain_batch(x + L.dense(attn, p["o_proj"], lora.get("o_proj"), scale), mesh)
    h = L.norm(x, p["mlp_norm"], c)
    if "gate_up_proj" in p:  # the decode layout's gate|up kernel (fuse_projections)
        gate, up = jnp.split(L.dense(h, p["gate_up_proj"]), 2, axis=-1)
        up = L.activation(gate, c.activation) * up
    elif c.gated_mlp:
        up = L.activation(L.dense(h, p["gate_proj"], lora.get("gate_proj"), scale), c.activation) \
            * L.dense(h, p["up_proj"], lora.get("up_proj"), scale)
    else:
        up = L.activation(L.dense(h, p["up_proj"], lora.get("up_proj"), scale), c.activation)
    return sharding.constrain_batch(x + L.dense(up, p["down_proj"], lora.get("down_proj"), scale), mesh)


def _layer(config: ModelConfig, x: jax.Array, p: Params, lora: Params, scale: float, window: jax.Array,
           rope: tuple[jax.Array, jax.Array] | None, allowed: jax.Array, offsets: jax.Array,
           kv: tuple[jax.Array, jax.Array] | None, layer: jax.Array, cache_index: Any, mesh: Mesh | None
           ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """One pre-norm block: x + attn(norm(x)), then + mlp(norm(x)).

    `kv` is the whole stacked cache [L, B, kv_heads, S, D] (k, v): this layer writes its new keys
    and values at (layer, :, :, cache_index) in place and reads its own slice back. With `layer`
    None, `kv` is this layer's own cache [B, kv_heads, S, D] (the unrolled decode loop)."""
    q, k, v = _qkv(config, x, p, lora, scale, rope)
    if kv is not None and layer is None:  # this layer's own cache buffers [B, kv_heads, S, D] (unrolled layers)
        zero = jnp.zeros((), jnp.int32)
        kv = tuple(jax.lax.dynamic_update_slice(full, new.astype(full.dtype), (zero, zero, cache_index, zero))
                   for full, new in zip(kv, (k, v)))
        k, v = (full.astype(q.dtype) for full in kv)
    elif kv is not None:  # write this step's keys/values into their cache slots, attend over all slots
        zero = jnp.zeros((), jnp.int32)
        start = (layer, zero, zero, cache_index, zero)
        kv = tuple(jax.lax.dynamic_update_slice(full, new[None].astype(full.dtype), start)
                   for full, new in zip(kv, (k, v)))
        k, v = (jax.lax.dynamic_index_in_dim(full, layer, 0, keepdims=False).astype(q.dtype) for full in kv)
    attn = _attend(config, q, k, v, window, allowed, offsets)
    return _finish(config, x, attn, p, lora, scale, mesh), kv


# Under remat, keeping the projections' outputs as well spares the backward pass their matmuls:
# the GRPO benchmark's update (32 sequences of 44 tokens, 3M parameters) took 7% less time on this
# CPU. It costs memory per token and layer, about 14x the layer input for a Qwen2.5 shape, so it is
# taken by default only while those outputs fit in this many bytes.
REMAT_SAVED_DOTS_MAX_BYTES = 2**28


def saved_dot_values(config: ModelConfig, lora_targets: tuple[str, ...] = (), lora_rank: int = 0) -> int:
    """Values per token and layer that `remat_save_dots` keeps: every projection's output, and for
    each LoRA target its x @ a (rank values) and (x @ a) @ b (the projection's width)."""
    shapes = {k: v for k, v in proj_shapes(config).items() if k != "gate_proj" or config.gated_mlp}
    return sum(out for _, out in shapes.values()) + sum(lora_rank + shapes[t][1] for t in lora_targets)


def saves_dots(config: ModelConfig, tokens: int, itemsize: int, lora_targets: tuple[str, ...] = (),
               lora_rank: int = 0) -> bool:
    """Whether a remat forward over `tokens` tokens keeps the projections' outputs (`ModelConfig.remat_save_dots`)."""
    if config.remat_save_dots is not None:
        return config.remat_save_dots
    values = config.num_layers * tokens * saved_dot_values(config, lora_targets, lora_rank)
    return values * itemsize <= REMAT_SAVED_DOTS_MAX_BYTES


def _rematerialised(config: ModelConfig, body: Any, tokens: int, itemsize: int, lora: Lora | None) -> Any:
    """The layer-scan body under jax.checkpoint when `config.remat` (training without a cache): the
    backward pass keeps each layer's input (and, by `saves_dots`, its projections' outputs) and
    recomputes the rest of the layer."""
    if not config.remat:
        return body
    targets, rank = (), 0
    if lora is not None:
        targets = tuple(lora.params["layers"])
        rank = max(ab["a"].shape[-1] for ab in lora.params["layers"].values())
    keep = saves_dots(config, tokens, itemsize, targets, rank)
    # the projections are 2-D matmuls (layers.dense); attention's batched products are recomputed
    policies = jax.checkpoint_policies
    policy = policies.dots_with_no_batch_dims_saveable if keep else policies.nothing_saveable
    return jax.checkpoint(body, policy=policy)


def hidden_states(config: ModelConfig, params: Params, input_ids: jax.Array, attention_mask: jax.Array, *,
                  positions: jax.Array | None = None, cache: KVCache | None = None, cache_index: Any = None,
                  lora: Lora | None = None, mesh: Mesh | None = None) -> tuple[jax.Array, KVCache | None]:
    """The final-norm hidden states [B, T, H] (what the LM head and value heads read) and the new cache."""
    input_ids = jnp.asarray(input_ids)
    attention_mask = jnp.asarray(attention_mask)
    _check_inputs(config, input_ids, attention_mask, positions, cache, cache_index)
    if lora is not None and not isinstance(lora, Lora):
        raise ConfigError(f"lora must be a jaxrl_hier.llm.Lora (from init_lora), got {type(lora).__name__}.")
    if positions is None:
        positions = default_positions(attention_mask)
    positions = jnp.asarray(positions, jnp.int32)
    b, t = input_ids.shape
    x = sharding.constrain_batch(_embed(config, params, input_ids, positions), mesh)
    rope = L.rope_tables(config, positions, x.dtype) if config.rope else None

    if cache is None:
        q_slots = k_slots = jnp.arange(t)
    else:
        cache_index = jnp.asarray(cache_index, jnp.int32)
        q_slots, k_slots = cache_index + jnp.arange(t), jnp.arange(_cache_shape(cache)[3])
    offsets = q_slots[:, None] - k_slots[None, :]  # [T, S]
    allowed = (attention_mask[:, None, :] > 0) & (offsets >= 0)[None]  # causal by slot, valid slots only

    lora_layers = lora.params["layers"] if lora is not None else {}
    scale = lora.scale if lora is not None else 1.0
    windows = jnp.asarray(config.windows, jnp.int32)

    def body(carry, xs):
        # the cache rides in the carry (not as scanned xs/ys), so each layer updates it in place
        # instead of slicing out and stacking back a copy of the whole cache every call
        x, kv = carry
        p, lp, window, layer = xs
        return _layer(config, x, p, lp, scale, window, rope, allowed, offsets, kv, layer, cache_index, mesh), None

    if isinstance(params["layers"], (tuple, list)):  # per-layer weights and caches: a Python loop, no slicing
        ks, vs = [], []
        for i, p in enumerate(params["layers"]):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            lp = lora_layers[i] if lora is not None else {}
            x, kv = _layer(config, x, p, lp, scale, windows[i], rope, allowed, offsets, kv, None, cache_index, mesh)
            if kv is not None:
                ks.append(kv[0])
                vs.append(kv[1])
        x = L.norm(x, params["final_norm"], config)
        return x, (None if cache is None else KVCache(tuple(ks), tuple(vs)))
    if cache is None:
        body = _rematerialised(config, body, b * t, x.dtype.itemsize, lora)
    kv0 = None if cache is None else (cache.k, cache.v)
    layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
    (x, kv), _ = jax.lax.scan(body, (x, kv0), (params["layers"], lora_layers, windows, layer_ids))
    x = L.norm(x, params["final_norm"], config)
    return x, (None if cache is None else KVCache(*kv))


# Decoding one token reads every layer's weights and cache. In the layer scan XLA copies each
# layer's weight and cache slices out of the stacked arrays on every step: on the GRPO benchmark's
# 3M-parameter model on CPU that was a quarter of a decode step, and unrolled a Qwen2.5-0.5B-shaped
# model decoded 1.2-1.5x faster on an H100 (docs/llm_sampling.md). Unrolled over per-layer arrays,
# the layer weights are copied once per generate call instead; up to this size that copy is taken.
UNROLL_DECODE_MAX_BYTES = 2**30


def unrolls_decode(config: ModelConfig, params: Params) -> bool:
    """Whether the decode loop runs the layers unrolled (`ModelConfig.unroll_decode`, None = by size)."""
    if config.unroll_decode is not None:
        return config.unroll_decode
    size = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params["layers"]))
    return size <= UNROLL_DECODE_MAX_BYTES


def unstack_layers(params: Params, lora: Lora | None, cache: KVCache) -> tuple[Params, Lora | None, KVCache]:
    """The stacked layer weights, LoRA adapters and cache as tuples of per-layer arrays (static
    slices); `hidden_states` runs such params as a Python loop over the layers."""
    n = cache.k.shape[0]
    split = lambda tree: tuple(jax.tree.map(lambda a: a[i], tree) for i in range(n))  # noqa: E731
    params = {**params, "layers": split(params["layers"])}
    if lora is not None:
        lora = lora.replace(params={**lora.params, "layers": split(lora.params["layers"])})
    return params, lora, KVCache(tuple(cache.k[i] for i in range(n)), tuple(cache.v[i] for i in range(n)))


# the projections that read one input, concatenated along their outputs in the decode layout
FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fuse_projections(p: Params, lora_layer: Params) -> Params:
    """One layer's weights with q|k|v and gate|up each as one kernel (and bias) [H, sum of outputs].

    A decode step multiplies 32-odd rows by each kernel, where XLA:CPU runs one wide matmul
    faster than three narrow ones (the GRPO benchmark's rollout: about a tenth less time). A group is left
    as it is when a LoRA adapter rides on one of its projections, or when only some have a bias."""
    p = dict(p)
    for fused, names in FUSED_PROJECTIONS.items():
        if not all(n in p for n in names) or any(n in lora_layer for n in names):
            continue
        biased = {"bias" in p[n] for n in names}
        if len(biased) > 1:
            continue
        parts = [p.pop(n) for n in names]
        p[fused] = {k: jnp.concatenate([q[k] for q in parts], axis=-1) for k in parts[0]}
    return p


@jax.jit
def _fused_copy(params: Params) -> Params:
    return {**params, "layers": fuse_projections(params["layers"], {})}


def frozen_copy(params: Params, *, fuse: bool = True) -> Params:
    """A copy of every weight array (a frozen reference beside weights that training updates in
    place), with each layer's q|k|v and gate|up kernels fused when `fuse` (`fuse_projections`, on
    the stacked [L, ...] arrays): the same numbers from `hidden_states`, a forward about a tenth
    faster on the GRPO benchmark's shape on CPU, and no more memory than a plain copy."""
    if not fuse:
        return jax.tree.map(jnp.copy, params)
    return _fused_copy(params)  # a jit's outputs are new buffers, also where they pass an input through


def decode_layout(config: ModelConfig, params: Params, lora: Lora | None, cache: KVCache, *,
                  fuse: bool = True) -> tuple[Params, Lora | None, KVCache]:
    """What the sampler's decode loop runs on: per-layer weights and caches (`unstack_layers`) when
    `unrolls_decode`, else the stacked arrays as they are. With `fuse`, the per-layer weights get
    their fused projections (`fuse_projections`; the copy is the one unstacking makes anyway)."""
    if not unrolls_decode(config, params):
        return params, lora, cache
    params, lora, cache = unstack_layers(params, lora, cache)
    if fuse:
        lora_layers = lora.params["layers"] if lora is not None else ({},) * len(params["layers"])
        params = {**params, "layers": tuple(fuse_projections(p, lp) for p, lp in zip(params["layers"], lora_layers))}
    return params, lora, cache


def shared_prefix_hidden_states(config: ModelConfig, params: Params, prefix_ids: jax.Array, prefix_mask: jax.Array,
                                input_ids: jax.Array, attention_mask: jax.Array, *, group: int,
                                lora: Lora | None = None, mesh: Mesh | None = None) -> tuple[jax.Array, jax.Array]:
    """`hidden_states` of `group` continuations of each prefix, each prefix computed once.

    prefix_ids / prefix_mask [P, Tp] (left-padded); input_ids / attention_mask [P * group, T], the
    continuations of prefix i in rows i * group .. (i + 1) * group - 1. The numbers are those of
    `hidden_states` on the rows concat(repeat(prefix, group), input) (positions and masks as there),
    but each prefix goes through the layers once and its keys and values are shared by the rows of
    its group (the GRPO update: one prompt, G completions). Returns the prefixes' hidden states
    [P, Tp, H] and the continuations' [P * group, T, H]."""
    prefix_ids, prefix_mask = jnp.asarray(prefix_ids), jnp.asarray(prefix_mask)
    input_ids, attention_mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
    if prefix_ids.ndim != 2 or prefix_mask.shape != prefix_ids.shape or input_ids.ndim != 2 \
            or attention_mask.shape != input_ids.shape or input_ids.shape[0] != prefix_ids.shape[0] * group:
        raise ConfigError(f"shared prefixes: prefix_ids/mask [P, Tp] and input_ids/attention_mask [P * group, T] "
                          f"with group={group}; got {prefix_ids.shape}, {prefix_mask.shape}, {input_ids.shape}, "
                          f"{attention_mask.shape}.")
    if lora is not None and not isinstance(lora, Lora):
        raise ConfigError(f"lora must be a jaxrl_hier.llm.Lora (from init_lora), got {type(lora).__name__}.")
    tp, t = prefix_ids.shape[1], input_ids.shape[1]
    rep = lambda a: jnp.repeat(a, group, axis=0)  # noqa: E731  (a prefix's row for each of its continuations)
    pos_p = default_positions(prefix_mask)
    # positions continue from the prefix's real length, as cumsum over the concatenated row gives
    pos_c = jnp.maximum(rep(prefix_mask.sum(-1))[:, None] + jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)
    xp = sharding.constrain_batch(_embed(config, params, prefix_ids, pos_p), mesh)
    xc = sharding.constrain_batch(_embed(config, params, input_ids, pos_c), mesh)
    rope_p = L.rope_tables(config, pos_p, xp.dtype) if config.rope else None
    rope_c = L.rope_tables(config, pos_c, xc.dtype) if config.rope else None
    offsets_p = jnp.arange(tp)[:, None] - jnp.arange(tp)[None, :]
    allowed_p = (prefix_mask[:, None, :] > 0) & (offsets_p >= 0)[None]
    offsets_c = (tp + jnp.arange(t))[:, None] - jnp.arange(tp + t)[None, :]  # continuation slots after the prefix's
    mask_c = jnp.concatenate([rep(prefix_mask), attention_mask.astype(prefix_mask.dtype)], axis=1)
    allowed_c = (mask_c[:, None, :] > 0) & (offsets_c >= 0)[None]
    lora_layers = lora.params["layers"] if lora is not None else {}
    scale = lora.scale if lora is not None else 1.0

    def body(carry, xs):
        xp, xc = carry
        p, lp, window = xs
        qp, kp, vp = _qkv(config, xp, p, lp, scale, rope_p)
        qc, kc, vc = _qkv(config, xc, p, lp, scale, rope_c)
        attn_p = _attend(config, qp, kp, vp, window, allowed_p, offsets_p)
        k_c, v_c = (jnp.concatenate([rep(a), b], axis=2) for a, b in ((kp, kc), (vp, vc)))
        attn_c = _attend(config, qc, k_c, v_c, window, allowed_c, offsets_c)
        return (_finish(config, xp, attn_p, p, lp, scale, mesh), _finish(config, xc, attn_c, p, lp, scale, mesh)), None

    body = _rematerialised(config, body, prefix_ids.size + input_ids.size, xp.dtype.itemsize, lora)
    windows = jnp.asarray(config.windows, jnp.int32)
    (xp, xc), _ = jax.lax.scan(body, (xp, xc), (params["layers"], lora_layers, windows))
    return L.norm(xp, params["final_norm"], config), L.norm(xc, params["final_norm"], config)


def lm_head(config: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
    """Vocabulary logits in float32 (tied models reuse the embedding matrix)."""
    if config.tie_word_embeddings:
        kernel = params["embed"]["embedding"].T
    else:
        kernel = params["lm_head"]["kernel"]
    return jnp.matmul(hidden, kernel, preferred_element_type=jnp.float32).astype(jnp.float32)


def forward(config: ModelConfig, params: Params, input_ids: jax.Array, attention_mask: jax.Array, *,
            positions: jax.Array | None = None, cache: KVCache | None = None, cache_index: Any = None,
            lora: Lora | None = None, return_hidden: bool = False, mesh: Mesh | None = None) -> tuple:
    """Logits [B, T, V] (float32) and the new cache (None without one); + hidden [B, T, H] if return_hidden.

    Without a cache: attention_mask [B, T], 1 = real token (left padding allowed); positions default
    to cumsum(mask) - 1 clipped at 0. With a cache: tokens go to slots cache_index .. cache_index+T-1,
    attention_mask is [B, max_len] over the slots (1 = valid, including the new ones), attention is
    causal by slot, and positions must be given. `lora` adds adapters; `mesh` adds sharding
    constraints on the activations (batch over data x fsdp).
    """
    hidden, new_cache = hidden_states(config, params, input_ids, attention_mask, positions=positions, cache=cache,
                                      cache_index=cache_index, lora=lora, mesh=mesh)
    logits = lm_head(config, params, hidden)
    if return_hidden:
        return logits, new_cache, hidden
    return logits, new_cache
