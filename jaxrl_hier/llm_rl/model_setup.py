"""The policy model of an LLM-RL run and its tokenizer: a local Hugging Face checkpoint, or a tiny
model built from scratch for the character-level tokenizer.

Offline by construction: `model.path` must be a local directory (never a hub id); without it a
small Qwen2-shaped decoder is initialised at random for the task's character-level tokenizer, the
way the CPU demos start before their supervised warm-start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import LanguageModel, LoraConfig, init_lora, load_pretrained, make_mesh
from jaxrl_hier.llm.lora import Lora


def tiny_qwen2_config(vocab_size: int, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                      intermediate_size: int, max_positions: int = 512, pad_token_id: int | None = None,
                      bos_token_id: int | None = None, eos_token_id: int | None = None) -> Any:
    """A transformers Qwen2Config for a small from-scratch model (tied embeddings)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                       num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       intermediate_size=intermediate_size, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0,
                       pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)


def policy_tokenizer(model_path: str | None, algorithm: str) -> Any:
    """The tokenizer of a run: the tiny character tokenizer for a from-scratch model, else the one
    saved in the local `model_path` (ConfigError when the directory or its tokenizer is missing)."""
    from jaxrl_hier.tasks import build_char_tokenizer

    if model_path is None:
        return build_char_tokenizer()
    from jaxrl_hier.llm.checkpoint import _load_tokenizer

    if not Path(model_path).is_dir():
        raise ConfigError(f"model.path {model_path} is not a local directory (nothing is downloaded).")
    tokenizer = _load_tokenizer(Path(model_path))
    if tokenizer is None:
        raise ConfigError(f"{model_path} holds no tokenizer (tokenizer.json); {algorithm} needs one.")
    return tokenizer


def build_mesh(config: Any) -> Any:
    return make_mesh(data=config.mesh_data, fsdp=config.mesh_fsdp, tensor=config.mesh_tensor)


def build_policy(config: Any, tokenizer: Any = None, *, mesh: Any = None, model_path: str | Path | None = None
                 ) -> tuple[LanguageModel, Any]:
    """(model, tokenizer): loaded from `model_path` (or the `model:` section's path), else tiny and random
    for `tokenizer` in the section's shape."""
    model = config.model
    dtype = jnp.dtype(model.dtype)
    path = model_path if model_path is not None else model.path
    if path is not None:
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"model path {path} is not a local directory. Nothing is downloaded: point it at a "
                              "directory holding config.json and *.safetensors (e.g. one written by save_pretrained).")
        lm = load_pretrained(path, dtype=dtype, mesh=mesh)
        tok = lm.tokenizer if lm.tokenizer is not None else tokenizer
        if tok is None:
            raise ConfigError(f"{path} has no tokenizer (tokenizer.json) and none was given.")
        lm.tokenizer = tok
        return lm, tok
    if tokenizer is None:
        raise ConfigError("a model built from scratch needs a tokenizer.")
    hf = tiny_qwen2_config(len(tokenizer), hidden_size=model.hidden_size, num_layers=model.layers,
                           num_heads=model.heads, num_kv_heads=model.kv_heads, intermediate_size=model.intermediate_size,
                           max_positions=max(512, config.max_prompt_length + config.max_new_tokens),
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    lm = LanguageModel.random(hf, jax.random.key(config.seed), dtype=dtype, mesh=mesh, tokenizer=tokenizer)
    return lm, tokenizer


def build_lora(config: Any, lm: LanguageModel, mesh: Any = None) -> Lora | None:
    """A fresh adapter (identity at start) when lora_rank > 0, else None (full fine-tuning)."""
    if config.lora_rank == 0:
        return None
    lc = LoraConfig(rank=config.lora_rank, alpha=config.lora_alpha, target_modules=tuple(config.lora_targets))
    return init_lora(lm.config, lc, jax.random.key(config.seed + 1), mesh=mesh)


def commit_to_mesh(tree: Any, mesh: Any) -> Any:
    """`tree` with every leaf that is not yet laid out on `mesh` (optimiser counters, step counters,
    keys, fresh LoRA factors) replicated on it; leaves already on it keep their layout.

    A compiled step returns its state committed to the mesh, so a first state that is not would
    differ in sharding from the second step's inputs and the step would compile twice. Without a
    mesh the same holds for the one device: every leaf is committed to it."""
    if mesh is None:
        return jax.device_put(tree, jax.local_devices()[0])
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x: Any) -> Any:
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(place, tree)


def jit_keeping_layout(fn: Any, state: Any, extra_outputs: int) -> Any:
    """`fn(state, ...) -> (state, *extra_outputs)` jitted with `state` donated and the new state
    returned in the layout `state` has. Left to XLA's sharding propagation the outputs come back
    with other, equivalent specs (`P(None)` as `P()`, say), so the next call's inputs differ in
    sharding and every step program compiled twice."""
    layout = jax.tree.map(lambda x: x.sharding, state)
    return jax.jit(fn, donate_argnums=(0,), out_shardings=(layout,) + (None,) * extra_outputs)


__all__ = ["tiny_qwen2_config", "build_mesh", "build_policy", "build_lora", "commit_to_mesh", "jit_keeping_layout"]
