"""LoRA adapters (identity at init, merge, training, export) and value / classification heads."""

from __future__ import annotations

import numpy as np
import optax
import pytest
import torch
import transformers

import jax
import jax.numpy as jnp

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import (EncoderModel, LanguageModel, LoraConfig, classification_head_apply,
                            classification_head_init, init_lora, merge_lora, save_pretrained, value_head_apply,
                            value_head_init)
from jaxrl_hier.llm import heads, lora as lora_lib

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, bos_token_id=None, eos_token_id=None)
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IDS = np.array([[0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]], np.int32)
MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8], np.int32)


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.random(transformers.Qwen2Config(**TINY), jax.random.key(0), jnp.float32)
    # weights N(0, 0.16) rather than 0.02, so that logits are O(1) and can be fitted
    model.params = jax.tree_util.tree_map(lambda x: 8 * x if x.ndim >= 2 else x, model.params)
    return model


def _randomise_b(adapter, key):
    """A trained-looking adapter: b drawn instead of zero."""
    layers = {name: {"a": ab["a"], "b": 0.3 * jax.random.normal(jax.random.fold_in(key, i), ab["b"].shape)}
              for i, (name, ab) in enumerate(sorted(adapter.params["layers"].items()))}
    return adapter.replace(params={"layers": layers})


def test_fresh_adapter_is_identity_and_separate_from_base(lm):
    adapter = init_lora(lm.config, LoraConfig(rank=4, alpha=8, target_modules=ALL), jax.random.key(1))
    assert adapter.scale == 2.0
    assert set(adapter.params["layers"]) == set(ALL)
    assert adapter.params["layers"]["gate_proj"]["a"].shape == (2, 32, 4)
    assert adapter.params["layers"]["down_proj"]["b"].shape == (2, 4, 32)
    base = np.asarray(lm.logits(lm.params, IDS, MASK))
    np.testing.assert_array_equal(np.asarray(lm.logits(lm.params, IDS, MASK, lora=adapter)), base)
    # the adapter holds only rank * (in + out) per projection: far fewer numbers than the model
    assert lora_lib.count(adapter) < lm.num_params() // 5


def test_merged_adapter_equals_adapter_forward(lm):
    adapter = _randomise_b(init_lora(lm.config, LoraConfig(rank=4, alpha=8, target_modules=ALL),
                                     jax.random.key(2)), jax.random.key(3))
    base = np.asarray(lm.logits(lm.params, IDS, MASK))
    with_lora = np.asarray(lm.logits(lm.params, IDS, MASK, lora=adapter))
    assert np.abs(with_lora - base).max() > 1e-3
    merged = merge_lora(lm.params, adapter, lm.config)
    np.testing.assert_allclose(np.asarray(lm.logits(merged, IDS, MASK)), with_lora, atol=2e-4, rtol=1e-4)
    # the base tree is untouched (the reference policy stays lora=None on the same params)
    np.testing.assert_array_equal(np.asarray(lm.logits(lm.params, IDS, MASK)), base)


def test_training_the_adapter_lowers_the_loss_and_leaves_the_base(lm):
    """A few Adam steps on the adapter alone fit a fixed sequence better; gradients reach b first."""
    adapter = init_lora(lm.config, LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "up_proj")),
                        jax.random.key(4))
    ids, mask = jnp.asarray(IDS), jnp.asarray(MASK)

    def nll(adapter):
        logits, _ = lm.forward(lm.params, ids, mask, lora=adapter)
        logp = jax.nn.log_softmax(logits[:, :-1], -1)
        picked = jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
        return -(picked * mask[:, 1:]).sum() / mask[:, 1:].sum()

    grads = jax.jit(jax.grad(nll))(adapter)
    assert float(jnp.abs(grads.params["layers"]["q_proj"]["b"]).max()) > 0  # b = 0 so only b moves first
    assert float(jnp.abs(grads.params["layers"]["q_proj"]["a"]).max()) == 0
    opt = optax.adam(3e-2)
    state = opt.init(adapter)

    @jax.jit
    def step(adapter, state):
        loss, g = jax.value_and_grad(nll)(adapter)
        updates, state = opt.update(g, state)
        return optax.apply_updates(adapter, updates), state, loss

    losses = []
    for _ in range(20):
        adapter, state, loss = step(adapter, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5


def test_export_merged_adapter_opens_in_transformers(lm, tmp_path):
    adapter = _randomise_b(init_lora(lm.config, LoraConfig(rank=2, target_modules=("o_proj", "down_proj")),
                                     jax.random.key(5)), jax.random.key(6))
    save_pretrained(lm, lm.params, tmp_path, lora=adapter)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    pos = np.maximum(MASK.cumsum(-1) - 1, 0)
    with torch.no_grad():
        ref = back(torch.tensor(IDS, dtype=torch.long), attention_mask=torch.tensor(MASK),
                   position_ids=torch.tensor(pos)).logits.numpy()
    got = np.asarray(lm.logits(lm.params, IDS, MASK, lora=adapter))
    np.testing.assert_allclose(got[MASK > 0], ref[MASK > 0], atol=1e-4, rtol=1e-4)


def test_target_aliases_and_errors():
    gpt2 = LanguageModel.random(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                        n_positions=32), jax.random.key(0))
    got = lora_lib.resolve_targets(gpt2.config, ("c_attn", "c_proj", "c_fc", "gate_proj"))
    assert got == ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "up_proj")  # no gate in GPT-2
    adapter = init_lora(gpt2.config, LoraConfig(rank=2, target_modules=("c_attn", "c_fc")), jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(gpt2.logits(gpt2.params, IDS, MASK, lora=adapter)),
                                  np.asarray(gpt2.logits(gpt2.params, IDS, MASK)))
    with pytest.raises(ConfigError, match="unknown LoRA target 'qkv'"):
        lora_lib.resolve_targets(gpt2.config, ("qkv",))
    with pytest.raises(ConfigError, match="rank must be >= 1"):
        init_lora(gpt2.config, LoraConfig(rank=0), jax.random.key(0))
    with pytest.raises(ConfigError, match="lora must be a jaxrl_hier.llm.Lora"):
        gpt2.forward(gpt2.params, IDS, MASK, lora={"layers": {}})


def test_value_head_on_decoder_hidden_states(lm):
    logits, _, hidden = lm.forward(lm.params, jnp.asarray(IDS), jnp.asarray(MASK), return_hidden=True)
    np.testing.assert_allclose(np.asarray(lm.hidden_states(lm.params, IDS, MASK)), np.asarray(hidden), atol=1e-6)
    # the LM head reads the same hidden states
    emb = lm.params["lm_head"]["kernel"]
    np.testing.assert_allclose(np.asarray(hidden @ emb), np.asarray(logits), atol=1e-4)
    head = value_head_init(jax.random.key(7), 32)
    values = value_head_apply(head, hidden)
    assert values.shape == (2, 8) and values.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(values), np.asarray(hidden @ head["kernel"][:, 0] + head["bias"][0]),
                               atol=1e-6)
    last = heads.gather_last(values, jnp.asarray(MASK))
    np.testing.assert_array_equal(np.asarray(last), np.asarray(values[:, -1]))
    right = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(np.asarray(heads.last_token_index(right)), [2, 4])
    np.testing.assert_array_equal(np.asarray(heads.last_token_index(jnp.asarray(MASK))), [7, 7])


def test_classification_head_on_pooled_encoder_output():
    cfg = transformers.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=40)
    enc = EncoderModel.random(cfg, jax.random.key(0))
    ids = np.array([[0, 5, 6, 2, 1], [0, 7, 8, 9, 2]], np.int32)
    mask = (ids != 1).astype(np.int32)
    pooled = enc.pooled(enc.params, ids, mask)
    assert pooled.shape == (2, 32)
    head = classification_head_init(jax.random.key(1), 32, 3, hidden_layer=True)
    logits = classification_head_apply(head, pooled)
    assert logits.shape == (2, 3) and logits.dtype == jnp.float32
    by_hand = np.tanh(np.asarray(pooled) @ np.asarray(head["dense"]["kernel"])) @ np.asarray(head["out"]["kernel"])
    np.testing.assert_allclose(np.asarray(logits), by_hand, atol=1e-5)
    # LoRA on the encoder with RoBERTa's names starts as identity too
    adapter = init_lora(enc.config, LoraConfig(rank=2, target_modules=("query", "value", "dense")), jax.random.key(2))
    np.testing.assert_allclose(np.asarray(enc.pooled(enc.params, ids, mask, lora=adapter)), np.asarray(pooled),
                               atol=1e-6)
    with pytest.raises(ConfigError, match="num_labels"):
        classification_head_init(jax.random.key(0), 32, 0)


def test_unrolled_decode_equals_the_layer_scan(lm):
    """The sampler's decode loop over per-layer arrays (`unroll_decode`) gives the layer scan's
    tokens and log-probs, with left padding and with a LoRA adapter on every projection, on q/v
    only, or none; the size rule picks it for this model. Its layers get one q|k|v and one gate|up
    kernel wherever no adapter rides on those projections."""
    import dataclasses

    from jaxrl_hier.llm import decoder, sampling

    assert decoder.unrolls_decode(lm.config, lm.params)
    assert not decoder.unrolls_decode(dataclasses.replace(lm.config, unroll_decode=False), lm.params)
    adapters = {"all": _randomise_b(init_lora(lm.config, LoraConfig(rank=4, alpha=8, target_modules=ALL),
                                              jax.random.key(7)), jax.random.key(8)),
                "q_v": _randomise_b(init_lora(lm.config, LoraConfig(rank=4, target_modules=("q_proj", "v_proj")),
                                              jax.random.key(7)), jax.random.key(8)),
                "none": None}
    fused = {"all": set(), "q_v": {"gate_up_proj"}, "none": {"qkv_proj", "gate_up_proj"}}
    for name, adapter in adapters.items():
        outs = []
        for unroll in (True, False):
            model = LanguageModel(dataclasses.replace(lm.config, unroll_decode=unroll), lm.params)
            outs.append(jax.jit(lambda p, a, k, m=model: sampling.sample_tokens(
                m, p, IDS, MASK, k, max_new_tokens=6, temperature=0.8, lora=a))(lm.params, adapter, jax.random.key(9)))
        np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
        np.testing.assert_allclose(np.asarray(outs[0].logprobs), np.asarray(outs[1].logprobs), atol=1e-6, rtol=1e-5)
        # the decode loop really ran on per-layer arrays: the cache comes out of it as one array per layer
        params, _, cache = lm.decode_layout(lm.params, adapter, lm.init_cache(2, 10))
        assert isinstance(params["layers"], tuple) and len(cache.k) == lm.config.num_layers
        layer = params["layers"][0]
        assert {"qkv_proj", "gate_up_proj"} & set(layer) == fused[name], name
        if "qkv_proj" in layer:  # the three kernels side by side, in order, and none left beside them
            q, k, v = (lm.params["layers"][n]["kernel"][0] for n in ("q_proj", "k_proj", "v_proj"))
            np.testing.assert_array_equal(np.asarray(layer["qkv_proj"]["kernel"]), np.concatenate([q, k, v], axis=-1))
            assert not {"q_proj", "k_proj", "v_proj"} & set(layer)
