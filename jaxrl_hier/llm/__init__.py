"""LLM components as JAX/Flax transformers: decoder-only Llama / Mistral / Qwen2 / Qwen3 / GPT-2 and
the RoBERTa encoder, HF checkpoint loading and saving, mesh sharding, LoRA, value and
classification heads, plus batched sampling (`generate`, `token_logprobs`) and the memory planner.
See docs/llm_models.md and docs/llm_sampling.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from jaxrl_hier.llm.checkpoint import load_params, load_pretrained, save_pretrained
from jaxrl_hier.llm.decoder import KVCache, forward, hidden_states, init_cache, init_params
from jaxrl_hier.llm.heads import (classification_head_apply, classification_head_init, last_token_index,
                                  value_head_apply, value_head_init)
from jaxrl_hier.llm.lora import Lora, LoraConfig, init_lora, merge_lora
from jaxrl_hier.llm.model_config import SUPPORTED_MODEL_TYPES, ModelConfig
from jaxrl_hier.llm.models import EncoderModel, LanguageModel
from jaxrl_hier.llm.sharding import make_mesh, param_shardings

# The sampler and the memory planner live in their own modules; import them on first use so this
# package imports even while they are being changed.
_LAZY = {"generate": ("jaxrl_hier.llm.sampling", "generate"),
         "sample_tokens": ("jaxrl_hier.llm.sampling", "sample_tokens"),
         "token_logprobs": ("jaxrl_hier.llm.sampling", "token_logprobs"),
         "GenerateOutput": ("jaxrl_hier.llm.sampling", "GenerateOutput"),
         "sampling": ("jaxrl_hier.llm.sampling", None),
         "memory": ("jaxrl_hier.llm.memory", None),
         "memory_case": ("jaxrl_hier.llm.memory_case", None)}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'jaxrl_hier.llm' has no attribute '{name}'")


__all__ = [
    "EncoderModel", "GenerateOutput", "KVCache", "LanguageModel", "Lora", "LoraConfig", "ModelConfig",
    "SUPPORTED_MODEL_TYPES", "classification_head_apply", "classification_head_init", "forward", "generate",
    "hidden_states", "init_cache", "init_lora", "init_params", "last_token_index", "load_params", "load_pretrained",
    "make_mesh", "memory", "merge_lora", "param_shardings", "sample_tokens", "save_pretrained", "token_logprobs", "value_head_apply",
    "value_head_init",
]
