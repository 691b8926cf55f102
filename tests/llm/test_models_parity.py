"""jaxrl_hier.llm models against transformers' PyTorch models: logits, caches, round trips, bf16.

Each family is a tiny random transformers model (torch.manual_seed), re-drawn with weights large
enough that the logits are O(1) (transformers' 0.02 init makes every logit ~0 and any bug small),
saved with save_pretrained and loaded by jaxrl_hier.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import jax
import jax.numpy as jnp

from jaxrl_hier.llm import ModelConfig, decoder, load_pretrained, save_pretrained

V = 96
COMMON = dict(vocab_size=V, bos_token_id=None, eos_token_id=None, pad_token_id=0)
LLAMA_LIKE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, **COMMON)

FAMILIES = {
    # Llama 3: 'llama3' rope scaling (original context short enough that all three frequency bands
    # occur) and tied embeddings, as Llama-3.2-1B
    "llama3": lambda: transformers.LlamaConfig(
        **LLAMA_LIKE, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16)),
    # Llama with attention_bias (q/k/v/o biases) and mlp_bias, untied head
    "llama_bias": lambda: transformers.LlamaConfig(**LLAMA_LIKE, attention_bias=True, mlp_bias=True),
    # Mistral: one kv head (GQA 4:1) and a 3-token sliding window
    "mistral": lambda: transformers.MistralConfig(**{**LLAMA_LIKE, "num_key_value_heads": 1}, sliding_window=3),
    "qwen2": lambda: transformers.Qwen2Config(**LLAMA_LIKE),
    # Qwen3: per-head q/k RMSNorm and head_dim (16) != hidden / heads (8)
    "qwen3": lambda: transformers.Qwen3Config(**LLAMA_LIKE, head_dim=16),
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **COMMON),
}

# a left-padded batch: row 0 has 3 padding tokens, row 1 none
IDS = np.array([[0, 0, 0, 11, 12, 13, 14, 15, 16, 17], [5, 6, 7, 8, 9, 10, 3, 4, 90, 91]], np.int64)
MASK = (np.arange(10)[None] >= np.array([[3], [0]])).astype(np.int64)
POS = np.maximum(MASK.cumsum(-1) - 1, 0)


def redraw(model: torch.nn.Module) -> torch.nn.Module:
    """Weights with O(1) logits: matrices N(0, 0.15), norm weights 1 + N(0, 0.2), biases N(0, 0.1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.15)
            elif "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def torch_logits(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    pos = np.maximum(mask.cumsum(-1) - 1, 0)
    with torch.no_grad():
        return model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(pos)).logits.float().numpy()


_BUILT: dict[str, tuple] = {}


def build(name: str, tmp_path_factory) -> tuple:
    """(name, torch model, jaxrl_hier LanguageModel, checkpoint dir) for one tiny random model, built once."""
    if name not in _BUILT:
        torch.manual_seed(0)
        model = redraw(transformers.AutoModelForCausalLM.from_config(FAMILIES[name]())).eval()
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        _BUILT[name] = (name, model, load_pretrained(path, dtype=jnp.float32), path)
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return build(request.param, tmp_path_factory)


def test_logits_match_transformers(family):
    name, model, lm, _ = family
    ref = torch_logits(model, IDS, MASK)
    got = np.asarray(lm.logits(lm.params, IDS, MASK))
    assert got.shape == (2, 10, V) and got.dtype == np.float32
    assert np.abs(ref).max() > 1.0  # the weights are large enough for the comparison to mean something
    real = MASK.astype(bool)
    np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=1e-4)
    # the left-padded row equals the same tokens without padding
    alone = np.asarray(lm.logits(lm.params, IDS[:1, 3:], MASK[:1, 3:]))
    np.testing.assert_allclose(got[0, 3:], alone[0], atol=1e-5, rtol=1e-5)


def test_family_switches_are_exercised(family):
    """Switching a family's feature off changes the logits, so the parity test covers it."""
    name, _, lm, _ = family
    c = lm.config
    expected = {"llama3": dict(tie=True, rope_type="llama3"), "llama_bias": dict(qkv_bias=True, o_bias=True),
                "mistral": dict(windows=(3, 3), kv=1), "qwen2": dict(qkv_bias=True, o_bias=False),
                "qwen3": dict(qk_norm=True), "gpt2": dict(rope=False, norm="layer")}[name]
    seen = dict(tie=c.tie_word_embeddings, rope_type=c.rope_type, qkv_bias=c.qkv_bias, o_bias=c.o_bias,
                windows=c.sliding_windows, kv=c.num_kv_heads, qk_norm=c.qk_norm, rope=c.rope, norm=c.norm)
    assert {k: seen[k] for k in expected} == expected
    off = {"llama3": dict(rope_type="default"), "mistral": dict(sliding_windows=())}.get(name)
    if off:
        base = np.asarray(lm.logits(lm.params, IDS, MASK))
        changed = np.asarray(decoder.forward(c.replace(**off), lm.params, IDS, MASK)[0])
        assert np.abs(changed - base)[MASK.astype(bool)].max() > 1e-2


def test_incremental_cache_decode_equals_full_forward(family):
    """Prefill 6 slots, then 2 tokens at once, then 1 at a time: the logits equal the full forward."""
    _, _, lm, _ = family
    full = np.asarray(lm.logits(lm.params, IDS, MASK))
    ids, mask, pos = jnp.asarray(IDS), jnp.asarray(MASK), jnp.asarray(POS)
    step = jax.jit(lambda p, cache, i, n, m: lm.forward(p, jax.lax.dynamic_slice_in_dim(ids, i, n, 1), m,
                                                       positions=jax.lax.dynamic_slice_in_dim(pos, i, n, 1),
                                                       cache=cache, cache_index=i), static_argnums=3)
    cache = lm.init_cache(2, 12)  # two spare slots: unused slots must be masked out
    assert cache.k.shape == (lm.config.num_layers, 2, lm.config.num_kv_heads, 12, lm.config.head_dim)
    slot_mask = jnp.zeros((2, 12), jnp.int32)
    got = []
    for start, n in ((0, 6), (6, 2), (8, 1), (9, 1)):
        slot_mask = slot_mask.at[:, start:start + n].set(mask[:, start:start + n])
        logits, cache = step(lm.params, cache, jnp.int32(start), n, slot_mask)
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    real = MASK.astype(bool)
    np.testing.assert_allclose(got[real], full[real], atol=1e-4, rtol=1e-4)


def test_round_trip_through_transformers(family, tmp_path):
    """load -> save_pretrained -> transformers loads it -> the same logits (tied heads included)."""
    name, model, lm, _ = family
    save_pretrained(lm, lm.params, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    real = MASK.astype(bool)
    np.testing.assert_allclose(torch_logits(back, IDS, MASK)[real], torch_logits(model, IDS, MASK)[real],
                               atol=1e-6, rtol=1e-6)
    reloaded = load_pretrained(tmp_path)
    for a, b in zip(jax.tree_util.tree_leaves(reloaded.params), jax.tree_util.tree_leaves(lm.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", ["llama3", "gpt2"])  # one rotary and one learned-position family
def test_bfloat16_weights_close_to_float32(name, tmp_path_factory):
    _, _, lm32, path = build(name, tmp_path_factory)
    lm = load_pretrained(path, dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(lm.params))
    assert lm.init_cache(2, 4).k.dtype == jnp.bfloat16
    got = np.asarray(lm.logits(lm.params, IDS, MASK))
    ref = np.asarray(lm32.logits(lm32.params, IDS, MASK))
    real = MASK.astype(bool)
    assert got.dtype == np.float32
    scale = np.abs(ref[real]).max()
    assert np.abs(got[real] - ref[real]).max() < 0.05 * scale
    assert (got[real].argmax(-1) == ref[real].argmax(-1)).mean() > 0.9


def test_model_config_from_hf_reads_every_switch():
    """from_hf maps each family's transformers config onto the decoder switches."""
    cfg = ModelConfig.from_hf(FAMILIES["qwen3"]())
    assert (cfg.family, cfg.head_dim, cfg.qk_norm, cfg.qkv_bias, cfg.num_kv_heads) == ("llama", 16, True, False, 2)
    cfg = ModelConfig.from_hf(FAMILIES["gpt2"]())
    assert (cfg.family, cfg.activation, cfg.gated_mlp, cfg.tie_word_embeddings, cfg.intermediate_size) == \
        ("gpt2", "gelu_new", False, True, 128)
    qwen_sw = transformers.Qwen2Config(**{**LLAMA_LIKE, "num_hidden_layers": 3}, use_sliding_window=True,
                                       sliding_window=5, max_window_layers=1)
    assert ModelConfig.from_hf(qwen_sw).sliding_windows == (0, 5, 5)
