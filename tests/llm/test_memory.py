"""Memory planner figures checked against real models: transformers' PyTorch modules and our arrays."""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (the test extra installs it; a missing one must fail, not skip)
import transformers

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import decoder as llm
from jaxrl_hier.llm import memory

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _hf_configs():
    t = transformers
    return {
        "llama": t.LlamaConfig(**TINY),
        "llama_tied": t.LlamaConfig(**TINY, tie_word_embeddings=True),
        "mistral": t.MistralConfig(**TINY),
        "qwen2": t.Qwen2Config(**TINY),
        "qwen3": t.Qwen3Config(**TINY, head_dim=12),
        "gpt2": t.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        "roberta": t.RobertaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=66, type_vocab_size=2),
    }


@pytest.mark.parametrize("name", list(_hf_configs()))
def test_param_count_matches_transformers(name):
    cfg = _hf_configs()[name]
    if name == "roberta":
        model = transformers.RobertaModel(cfg, add_pooling_layer=False)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    expected = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert memory.count_params(memory.dims_of(cfg)) == expected


def test_lora_param_count_matches_formula_by_hand():
    d = memory.dims_of(_hf_configs()["llama"])
    # q: 32->16*... heads 4, head_dim 8: q 32->32, k/v 32->16, o 32->32; rank 4 -> 4*(in+out) each
    by_hand = 2 * 4 * ((32 + 32) + (32 + 16) + (32 + 16) + (32 + 32))
    assert memory.count_lora_params(d, 4, ("q_proj", "k_proj", "v_proj", "o_proj")) == by_hand


def _actor_ref(train="lora"):
    cfg = _hf_configs()["qwen2"]
    actor = memory.ModelSpec("actor", cfg, dtype="bfloat16", train=train, lora_rank=8, batch=8, seq_len=32,
                             kv_cache_len=48)
    ref = memory.ModelSpec("reference", cfg, dtype="bfloat16", train="frozen", batch=8, seq_len=32,
                           shares_base_with="actor" if train == "lora" else None)
    return actor, ref


def test_lora_reference_shares_base_and_full_training_costs_adam():
    cfg = _hf_configs()["qwen2"]
    n = memory.count_params(memory.dims_of(cfg))
    lora = memory.plan(list(_actor_ref("lora")))
    full = memory.plan(list(_actor_ref("full")))
    a_lora, r_lora = lora.models
    a_full, r_full = full.models
    assert r_lora.params == 0 and r_full.params == 2 * n
    assert a_full.params == 2 * n and a_full.grads == 2 * n and a_full.optimizer == 8 * n
    n_lora = memory.count_lora_params(memory.dims_of(cfg), 8, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert a_lora.params == 2 * n + 4 * n_lora and a_lora.optimizer == 8 * n_lora
    assert lora.total < full.total
    text = full.table()
    assert "actor" in text and "reference" in text and "total" in text


def test_mesh_splits_params_and_cache_per_device():
    actor, ref = _actor_ref("full")
    one = memory.plan([actor]).models[0]
    four = memory.plan([actor], {"data": 1, "fsdp": 2, "tensor": 2}).models[0]
    assert four.params * 4 == pytest.approx(one.params, abs=4)
    # batch over fsdp (2), kv heads (2) over tensor (2): a quarter of the cache per device
    assert four.kv_cache * 4 == one.kv_cache
    data = memory.plan([actor], {"data": 4}).models[0]
    assert data.params == one.params and data.kv_cache * 4 == one.kv_cache
    assert data.activations < one.activations


def test_remat_keeps_fewer_activations():
    actor, _ = _actor_ref("full")
    import dataclasses

    no_remat = dataclasses.replace(actor, remat=False)
    assert memory.plan([actor]).models[0].activations < memory.plan([no_remat]).models[0].activations


def test_capacity_verdict_and_bad_input():
    actor, ref = _actor_ref("lora")
    assert memory.plan([actor, ref], capacity_gib=80).fits is True
    assert "DOES NOT FIT" in memory.plan([actor, ref], capacity_gib=1e-6).table()
    with pytest.raises(ConfigError, match="lora_rank"):
        memory.plan([memory.ModelSpec("a", TINY | {"model_type": "llama"}, train="lora")])
    with pytest.raises(ConfigError, match="shares_base_with"):
        memory.plan([memory.ModelSpec("ref", TINY, shares_base_with="actor")])
    with pytest.raises(ConfigError, match="mesh axes"):
        memory.plan([actor], {"model": 2})
    with pytest.raises(ConfigError, match="LoRA target"):
        memory.plan([memory.ModelSpec("a", TINY, train="lora", lora_rank=2, lora_targets=("qkv",))])


def test_figures_match_real_jax_arrays():
    """Parameter and cache bytes equal the nbytes of our own init_params / init_cache."""
    import jax
    import jax.numpy as jnp

    for name in ("llama", "qwen2", "qwen3"):
        cfg = llm.ModelConfig.from_hf(_hf_configs()[name])
        params = llm.init_params(cfg, jax.random.key(0), jnp.bfloat16)
        d = memory.dims_of(cfg)
        assert memory.tree_nbytes(params) == 2 * memory.count_params(d), name
        cache = llm.init_cache(cfg, 3, 40, jnp.bfloat16)
        assert memory.tree_nbytes(cache) == memory.kv_cache_bytes(d, 3, 40, "bfloat16"), name
