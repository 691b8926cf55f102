"""`LanguageModel` and `EncoderModel`: a config, its weights, tokenizer and mesh behind one object.

The objects hold `params` for convenience but every method takes `params` explicitly, so a
training loop can pass updated weights (or the same base weights with and without a LoRA adapter)
through the same compiled functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import decoder, encoder, sharding
from jaxrl_hier.llm.decoder import KVCache
from jaxrl_hier.llm.lora import Lora
from jaxrl_hier.llm.model_config import ModelConfig

#: the transformers class written into config.json by save_pretrained
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel", "roberta": "RobertaModel"}


class _Model:
    def __init__(self, config: ModelConfig, params: Any, *, hf_config: Any = None, tokenizer: Any = None,
                 mesh: Mesh | None = None, weight_prefix: str | None = None) -> None:
        self.config = config
        self.params = params
        self.hf_config = hf_config
        self.tokenizer = tokenizer
        self.mesh = sharding.check_mesh(mesh)
        self.weight_prefix = weight_prefix  # the checkpoint's name prefix ("model.", "roberta.", ...)

    @property
    def dtype(self) -> Any:
        return self.params["embed"]["embedding"].dtype

    def num_params(self, params: Any = None) -> int:
        return int(sum(x.size for x in jax.tree_util.tree_leaves(self.params if params is None else params)))

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}({c.model_type}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"heads={c.num_heads}/{c.num_kv_heads}, vocab={c.vocab_size}, dtype={jnp.dtype(self.dtype).name}, "
                f"params={self.num_params():,})")


class LanguageModel(_Model):
    """A decoder (Llama, Mistral, Qwen2, Qwen3, GPT-2) following the `forward` / `init_cache` contract."""

    def __init__(self, config: ModelConfig, params: Any, **kw: Any) -> None:
        if not config.is_decoder:
            raise ConfigError(f"{config.model_type} is an encoder; use EncoderModel.")
        super().__init__(config, params, **kw)
        self._logits_fn = jax.jit(self._logits)

    def _with_execution(self, **changes: Any) -> "LanguageModel":
        """This model (the same parameter arrays, no copy) with execution fields of its config changed."""
        if all(getattr(self.config, k) == v for k, v in changes.items()):
            return self
        return LanguageModel(dataclasses.replace(self.config, **changes), self.params, hf_config=self.hf_config,
                             tokenizer=self.tokenizer, mesh=self.mesh, weight_prefix=self.weight_prefix)

    def with_remat(self, remat: bool, save_dots: bool | None = None) -> "LanguageModel":
        """This model (the same parameter arrays, no copy) with the layers rematerialised in the
        backward pass (`ModelConfig.remat`), or not; `save_dots`: `ModelConfig.remat_save_dots`."""
        return self._with_execution(remat=bool(remat), remat_save_dots=save_dots)

    def with_unroll_decode(self, unroll: bool | None) -> "LanguageModel":
        """This model (the same parameter arrays, no copy) with the sampler's decode loop unrolled over
        the layers (True), as a layer scan (False) or chosen by size (None): `ModelConfig.unroll_decode`."""
        return self._with_execution(unroll_decode=unroll)

    @classmethod
    def random(cls, hf_config: Any, key: jax.Array, dtype: Any = jnp.float32, mesh: Mesh | None = None,
               tokenizer: Any = None) -> "LanguageModel":
        """A randomly initialised model for a transformers config (tests, benchmarks)."""
        config = ModelConfig.from_hf(hf_config)
        params = decoder.init_params(config, key, dtype, mesh)
        return cls(config, params, hf_config=hf_config, tokenizer=tokenizer, mesh=mesh)

    def forward(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, *,
                positions: jax.Array | None = None, cache: KVCache | None = None, cache_index: Any = None,
                lora: Lora | None = None, return_hidden: bool = False) -> tuple:
        """`decoder.forward` with this model's config and mesh (call it inside your own jit)."""
        return decoder.forward(self.config, params, input_ids, attention_mask, positions=positions, cache=cache,
                               cache_index=cache_index, lora=lora, return_hidden=return_hidden, mesh=self.mesh)

    def hidden_states(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, *,
                      positions: jax.Array | None = None, lora: Lora | None = None) -> jax.Array:
        """Final-norm hidden states [B, T, H] without the vocabulary projection (for value heads)."""
        return decoder.hidden_states(self.config, params, input_ids, attention_mask, positions=positions,
                                     lora=lora, mesh=self.mesh)[0]

    def hidden_and_cache(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, *,
                         positions: jax.Array | None = None, cache: KVCache | None = None, cache_index: Any = None,
                         lora: Lora | None = None) -> tuple[jax.Array, KVCache | None]:
        """`forward` without the vocabulary projection: final-norm hidden [B, T, H] and the new cache.

        With `head` it lets the sampler project only the positions it needs (the last one of a
        prompt) and the scorer project the sequence chunk by chunk."""
        return decoder.hidden_states(self.config, params, input_ids, attention_mask, positions=positions,
                                     cache=cache, cache_index=cache_index, lora=lora, mesh=self.mesh)

    def shared_prefix_hidden(self, params: Any, prefix_ids: jax.Array, prefix_mask: jax.Array, input_ids: jax.Array,
                             attention_mask: jax.Array, *, group: int, lora: Lora | None = None
                             ) -> tuple[jax.Array, jax.Array]:
        """`decoder.shared_prefix_hidden_states`: `group` continuations per prefix, each prefix computed once."""
        return decoder.shared_prefix_hidden_states(self.config, params, prefix_ids, prefix_mask, input_ids,
                                                   attention_mask, group=group, lora=lora, mesh=self.mesh)

    def head(self, params: Any, hidden: jax.Array) -> jax.Array:
        """Float32 vocabulary logits [..., V] of final-norm hidden states [..., H]."""
        return decoder.lm_head(self.config, params, hidden)

    def decode_layout(self, params: Any, lora: Lora | None, cache: KVCache) -> tuple[Any, Lora | None, KVCache]:
        """What the sampler's decode loop runs on: per-layer weights and caches (`decoder.unstack_layers`)
        when `decoder.unrolls_decode`, else the stacked arrays as they are (`decoder.decode_layout`).
        Its fused q|k|v and gate|up kernels: `fuses_projections`."""
        return decoder.decode_layout(self.config, params, lora, cache, fuse=self.fuses_projections)

    @property
    def fuses_projections(self) -> bool:
        """Whether scoring-only layouts (the decode loop's, a frozen reference) concatenate q|k|v and
        gate|up (`decoder.fuse_projections`): not on a mesh that splits heads over "tensor", where
        the concatenation would regather them."""
        return self.mesh is None or self.mesh.shape.get("tensor", 1) == 1

    def frozen_copy(self, params: Any) -> Any:
        """A copy of `params` for scoring only (a reference model): every array copied (training may
        donate the originals), in the layout the forward runs fastest (`decoder.frozen_copy`)."""
        return decoder.frozen_copy(params, fuse=self.fuses_projections)

    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> KVCache:
        """An empty KV cache; dtype defaults to the weights' dtype."""
        return decoder.init_cache(self.config, batch, max_len, dtype or self.dtype, mesh=self.mesh)

    def _logits(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, lora: Lora | None) -> jax.Array:
        return self.forward(params, input_ids, attention_mask, lora=lora)[0]

    def logits(self, params: Any, input_ids: Any, attention_mask: Any, lora: Lora | None = None) -> jax.Array:
        """Float32 logits [B, T, V] of a (left-padded) batch, jitted."""
        return self._logits_fn(params, jnp.asarray(input_ids, jnp.int32), jnp.asarray(attention_mask, jnp.int32),
                               lora)


class EncoderModel(_Model):
    """RoBERTa: `.forward` gives hidden states [B, T, H] and the pooled [B, H] output."""

    def __init__(self, config: ModelConfig, params: Any, **kw: Any) -> None:
        if config.is_decoder:
            raise ConfigError(f"{config.model_type} is a decoder; use LanguageModel.")
        super().__init__(config, params, **kw)
        self._forward_fn = jax.jit(self._forward)

    @classmethod
    def random(cls, hf_config: Any, key: jax.Array, dtype: Any = jnp.float32, mesh: Mesh | None = None,
               tokenizer: Any = None, pooler: bool = True) -> "EncoderModel":
        config = ModelConfig.from_hf(hf_config)
        params = encoder.init_params(config, key, dtype, mesh, pooler)
        return cls(config, params, hf_config=hf_config, tokenizer=tokenizer, mesh=mesh)

    def forward(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, *,
                token_type_ids: jax.Array | None = None, lora: Lora | None = None) -> tuple:
        return encoder.forward(self.config, params, input_ids, attention_mask, token_type_ids=token_type_ids,
                               lora=lora, mesh=self.mesh)

    def _forward(self, params: Any, input_ids: jax.Array, attention_mask: jax.Array, lora: Lora | None) -> tuple:
        return self.forward(params, input_ids, attention_mask, lora=lora)

    def encode(self, params: Any, input_ids: Any, attention_mask: Any, lora: Lora | None = None) -> tuple:
        """(hidden [B, T, H], pooled [B, H] or None), jitted."""
        return self._forward_fn(params, jnp.asarray(input_ids, jnp.int32), jnp.asarray(attention_mask, jnp.int32),
                                lora)

    def pooled(self, params: Any, input_ids: Any, attention_mask: Any, lora: Lora | None = None) -> jax.Array:
        """The pooled [B, H] sentence embedding (tanh(dense(h_<s>)))."""
        pooled = self.encode(params, input_ids, attention_mask, lora)[1]
        if pooled is None:
            raise ConfigError("this RoBERTa checkpoint has no pooler; use encode(...)[0][:, 0] instead.")
        return pooled
