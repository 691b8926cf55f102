"""`ModelConfig`: one frozen description of every supported transformer, read from a HF config.

The decoder families (Llama, Mistral, Qwen2, Qwen3, GPT-2) differ in a handful of switches
(norm type, gated MLP, rotary or learned positions, which projections carry biases, q/k norm,
sliding windows); RoBERTa adds post-norm bidirectional layers and a pooler. `from_hf` maps a
transformers config onto those switches and refuses, with one clear message, anything the
shared implementation would compute differently.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxrl_hier.config import ConfigError

#: HF `model_type` -> layout family. Llama-like decoders share one layout ("llama").
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gpt2": "gpt2",
    "roberta": "roberta",
}
ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture switches shared by the decoder (`decoder.py`) and the encoder (`encoder.py`).

    Shapes: `num_heads * head_dim` is the query width, `num_kv_heads * head_dim` the key/value
    width (grouped-query attention when num_kv_heads < num_heads). `sliding_windows` holds one
    window per layer (0 = full attention): a query at cache slot i sees slots j with i - j < window.
    """

    model_type: str
    family: str  # "llama" (rope, RMSNorm, gated MLP), "gpt2" (learned positions, LayerNorm), "roberta"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    norm: str = "rms"  # "rms" or "layer"
    norm_eps: float = 1e-6
    activation: str = "silu"
    gated_mlp: bool = True
    rope: bool = True
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    sliding_windows: tuple[int, ...] = ()
    scale_attn: bool = True
    pad_token_id: int | None = None
    type_vocab_size: int = 0
    # execution, not architecture (never read from or written to config.json): in a forward
    # without a KV cache, keep only each layer's input for the backward pass and recompute the
    # layer there (jax.checkpoint), as the memory planner's `remat=True` assumes
    remat: bool = False
    # with `remat`, also keep the outputs of each layer's dense projections (q, k, v, o, gate, up,
    # down and their LoRA products), so that the backward pass recomputes only norms, attention and
    # activations: True, False, or None = when they take at most `decoder.REMAT_SAVED_DOTS_MAX_BYTES`
    remat_save_dots: bool | None = None
    # how the sampler's decode loop runs the layers: True = a Python loop over per-layer weight
    # and cache arrays (sliced once per generate call: no per-step slice copies, but one copy of
    # the layer weights while generating), False = the layer scan over the stacked arrays, None =
    # unrolled when the layer weights are at most `decoder.UNROLL_DECODE_MAX_BYTES`
    unroll_decode: bool | None = None

    def __post_init__(self) -> None:
        if self.family not in ("llama", "gpt2", "roberta"):
            raise ConfigError(f"unknown model family '{self.family}'; use llama, gpt2 or roberta.")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}.")
        if self.norm not in ("rms", "layer"):
            raise ConfigError(f"norm must be 'rms' or 'layer', got '{self.norm}'.")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation '{self.activation}' is not supported; use one of {ACTIVATIONS}.")
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope type '{self.rope_type}' is not supported; use one of {ROPE_TYPES}.")
        if self.sliding_windows and len(self.sliding_windows) != self.num_layers:
            raise ConfigError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers.")
        if self.family == "roberta" and self.pad_token_id is None:
            raise ConfigError("a RoBERTa config needs pad_token_id (its positions start after padding_idx).")

    @property
    def is_decoder(self) -> bool:
        return self.family != "roberta"

    @property
    def windows(self) -> tuple[int, ...]:
        """Per-layer sliding windows, 0 = full attention."""
        return self.sliding_windows or (0,) * self.num_layers

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: Any) -> "ModelConfig":
        """Read a transformers config (any `PretrainedConfig` of a supported model type)."""
        model_type = getattr(hf, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported architecture model_type='{model_type}' "
                f"({', '.join(getattr(hf, 'architectures', None) or []) or 'no architectures listed'}); "
                f"jaxrl_hier.llm supports {', '.join(SUPPORTED_MODEL_TYPES)}.")
        family = SUPPORTED_MODEL_TYPES[model_type]
        if family == "gpt2":
            return _from_gpt2(hf)
        if family == "roberta":
            return _from_roberta(hf)
        return _from_llama_like(hf, model_type)


def _rope_fields(hf: Any) -> dict[str, Any]:
    """Rotary settings from `rope_parameters` (transformers 5) or the older rope_theta/rope_scaling."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"rope scaling type '{rope_type}' is not supported; jaxrl_hier.llm implements "
                          f"{', '.join(ROPE_TYPES)}.")
    if params.get("partial_rotary_factor", 1.0) != 1.0 or getattr(hf, "partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("partial rotary embeddings (partial_rotary_factor != 1) are not supported.")
    out: dict[str, Any] = dict(rope_theta=float(theta), rope_type=rope_type)
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = float(params["factor"])
    if rope_type == "llama3":
        out.update(rope_low_freq_factor=float(params["low_freq_factor"]),
                   rope_high_freq_factor=float(params["high_freq_factor"]),
                   rope_original_max_positions=int(params["original_max_position_embeddings"]))
    return out


def _windows(hf: Any, num_layers: int) -> tuple[int, ...]:
    """Per-layer sliding windows: Qwen2/3 name them in `layer_types`, Mistral applies one to all."""
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is not None:
        if window is None and "sliding_attention" in layer_types:
            raise ConfigError("layer_types asks for sliding_attention but sliding_window is not set.")
        return tuple(int(window) if t == "sliding_attention" else 0 for t in layer_types)
    if window is None or getattr(hf, "use_sliding_window", True) is False:
        return ()
    return (int(window),) * num_layers


def _from_llama_like(hf: Any, model_type: str) -> ModelConfig:
    heads = int(hf.num_attention_heads)
    hidden = int(hf.hidden_size)
    head_dim = getattr(hf, "head_dim", None) or hidden // heads
    act = getattr(hf, "hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{model_type} with hidden_act='{act}' is not supported; only silu.")
    attention_bias = bool(getattr(hf, "attention_bias", False) or False)
    layers = int(hf.num_hidden_layers)
    return ModelConfig(
        model_type=model_type, family="llama", vocab_size=int(hf.vocab_size), hidden_size=hidden,
        intermediate_size=int(hf.intermediate_size), num_layers=layers, num_heads=heads,
        num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
        max_position_embeddings=int(hf.max_position_embeddings), norm="rms", norm_eps=float(hf.rms_norm_eps),
        activation="silu", gated_mlp=True, rope=True, **_rope_fields(hf),
        # Qwen2 always has q/k/v biases and no o bias; Llama/Qwen3 `attention_bias` covers all four.
        qkv_bias=model_type == "qwen2" or attention_bias, o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(getattr(hf, "mlp_bias", False) or False), qk_norm=model_type == "qwen3",
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        sliding_windows=_windows(hf, layers), pad_token_id=getattr(hf, "pad_token_id", None))


def _from_gpt2(hf: Any) -> ModelConfig:
    if getattr(hf, "scale_attn_by_inverse_layer_idx", False):
        raise ConfigError("GPT-2 with scale_attn_by_inverse_layer_idx=True is not supported.")
    if getattr(hf, "add_cross_attention", False):
        raise ConfigError("GPT-2 with add_cross_attention=True (an encoder-decoder) is not supported.")
    hidden, heads = int(hf.n_embd), int(hf.n_head)
    return ModelConfig(
        model_type="gpt2", family="gpt2", vocab_size=int(hf.vocab_size), hidden_size=hidden,
        intermediate_size=int(hf.n_inner or 4 * hidden), num_layers=int(hf.n_layer), num_heads=heads,
        num_kv_heads=heads, head_dim=hidden // heads, max_position_embeddings=int(hf.n_positions),
        norm="layer", norm_eps=float(hf.layer_norm_epsilon), activation=str(hf.activation_function),
        gated_mlp=False, rope=False, qkv_bias=True, o_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        scale_attn=bool(getattr(hf, "scale_attn_weights", True)), pad_token_id=getattr(hf, "pad_token_id", None))


def _from_roberta(hf: Any) -> ModelConfig:
    if getattr(hf, "is_decoder", False):
        raise ConfigError("RoBERTa with is_decoder=True is not supported; use it as an encoder.")
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise ConfigError(f"RoBERTa position_embedding_type='{kind}' is not supported; only absolute.")
    hidden, heads = int(hf.hidden_size), int(hf.num_attention_heads)
    return ModelConfig(
        model_type="roberta", family="roberta", vocab_size=int(hf.vocab_size), hidden_size=hidden,
        intermediate_size=int(hf.intermediate_size), num_layers=int(hf.num_hidden_layers), num_heads=heads,
        num_kv_heads=heads, head_dim=hidden // heads, max_position_embeddings=int(hf.max_position_embeddings),
        norm="layer", norm_eps=float(hf.layer_norm_eps), activation=str(hf.hidden_act), gated_mlp=False,
        rope=False, qkv_bias=True, o_bias=True, mlp_bias=True, tie_word_embeddings=True,
        pad_token_id=int(hf.pad_token_id), type_vocab_size=int(hf.type_vocab_size))
