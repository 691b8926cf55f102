"""generate / token_logprobs: cache vs full forward, EOS, filtering, bucketing, parity with transformers."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import sampling

V, H = 23, 16


class _Cache(NamedTuple):
    k: jax.Array  # [B, max_len, H]


class MeanAttentionLM:
    """A one-layer causal model with uniform attention over visible slots, honouring the
    LanguageModel forward contract (cache slots, [B, max_len] mask, explicit positions).
    It lets the sampler be checked independently of the decoder's numerics."""

    config = ("mean-attention", V, H)

    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> _Cache:
        return _Cache(jnp.zeros((batch, max_len, H), jnp.float32))

    def forward(self, params, input_ids, attention_mask, *, positions=None, cache=None, cache_index=None):
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(attention_mask, -1) - 1, 0)
        x = params["emb"][input_ids] + params["pos"][positions]
        if cache is None:
            keys, q_slots, mask = x, jnp.arange(x.shape[1]), attention_mask
        else:
            keys = jax.lax.dynamic_update_slice_in_dim(cache.k, x, cache_index, axis=1)
            q_slots, mask = cache_index + jnp.arange(x.shape[1]), attention_mask
            cache = _Cache(keys)
        visible = (jnp.arange(keys.shape[1])[None, :] <= q_slots[:, None])[None] & (mask[:, None, :] > 0)
        h = jnp.einsum("bts,bsh->bth", visible, keys) / jnp.maximum(visible.sum(-1, keepdims=True), 1)
        return jnp.tanh(h) @ params["out"], cache


@pytest.fixture(scope="module")
def toy():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"emb": jax.random.normal(k1, (V, H)), "pos": 0.3 * jax.random.normal(k2, (64, H)),
              "out": 3.0 * jax.random.normal(k3, (H, V))}
    ids = np.array([[0, 0, 5, 7, 9], [3, 4, 5, 6, 2]], np.int32)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], np.int32)
    return MeanAttentionLM(), params, ids, mask


def _score_completion(lm, params, ids, mask, out, bucket=16):
    p_ids, p_mask = sampling.left_pad(ids, mask, bucket)
    full_ids = np.concatenate([p_ids, np.asarray(out.tokens)], 1)
    full_mask = np.concatenate([p_mask, np.asarray(out.mask)], 1)
    lp = sampling.token_logprobs(lm, params, full_ids, full_mask)
    return np.asarray(lp[:, -out.tokens.shape[1]:])


def test_sampled_logprobs_equal_teacher_forced_logprobs(toy):
    lm, params, ids, mask = toy
    out = sampling.generate(lm, params, ids, mask, key=jax.random.key(1), max_new_tokens=6, temperature=1.0)
    np.testing.assert_allclose(np.asarray(out.logprobs), _score_completion(lm, params, ids, mask, out),
                               rtol=1e-5, atol=1e-5)
    assert out.mask.min() == 1  # no EOS given: every token is live


def test_greedy_equals_top_k_one_and_step_by_step_argmax(toy):
    lm, params, ids, mask = toy
    greedy = sampling.generate(lm, params, ids, mask, key=jax.random.key(2), max_new_tokens=5, temperature=0.0)
    topk1 = sampling.generate(lm, params, ids, mask, key=jax.random.key(3), max_new_tokens=5,
                              temperature=0.7, top_k=1)
    np.testing.assert_array_equal(greedy.tokens, topk1.tokens)
    np.testing.assert_allclose(topk1.logprobs, 0.0, atol=1e-6)  # a point mass after top-k=1
    # re-running the full model without a cache, one token at a time, picks the same tokens
    seq, m = ids.copy(), mask.copy()
    for t in range(5):
        logits, _ = lm.forward(params, jnp.asarray(seq), jnp.asarray(m))
        nxt = np.asarray(jnp.argmax(logits[:, -1], -1))
        np.testing.assert_array_equal(nxt, np.asarray(greedy.tokens[:, t]))
        seq, m = np.concatenate([seq, nxt[:, None]], 1), np.concatenate([m, np.ones((2, 1), np.int32)], 1)


def test_each_row_stops_at_its_own_eos(toy):
    lm, params, ids, mask = toy
    free = sampling.generate(lm, params, ids, mask, key=jax.random.key(4), max_new_tokens=8, temperature=0.0)
    tokens = np.asarray(free.tokens)
    eos = int(tokens[0, 2])  # row 0 emits it at step 2 (or earlier); row 1 maybe never
    out = sampling.generate(lm, params, ids, mask, key=jax.random.key(4), max_new_tokens=8, temperature=0.0,
                            eos_token_id=[eos, V + 5], pad_token_id=0)
    for row in range(2):
        hits = np.flatnonzero(tokens[row] == eos)
        stop = hits[0] + 1 if hits.size else 8
        np.testing.assert_array_equal(out.mask[row, :stop], 1)
        np.testing.assert_array_equal(out.mask[row, stop:], 0)
        np.testing.assert_array_equal(out.tokens[row, :stop], tokens[row, :stop])
        np.testing.assert_array_equal(out.tokens[row, stop:], 0)
        np.testing.assert_array_equal(out.logprobs[row, stop:], 0.0)


def test_filter_logits_top_k_and_top_p_by_hand():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    k2 = np.exp(np.asarray(sampling.filter_logits(logits, 1.0, 2, None)))
    np.testing.assert_allclose(k2, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p = np.exp(np.asarray(sampling.filter_logits(logits, 1.0, None, 0.7)))  # 0.5 + 0.3 covers 0.7
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p_small = np.exp(np.asarray(sampling.filter_logits(logits, 1.0, None, 0.1)))  # top token always kept
    np.testing.assert_allclose(p_small, [[1, 0, 0, 0]], atol=1e-6)
    t2 = np.exp(np.asarray(sampling.filter_logits(logits, 2.0, None, None)))
    np.testing.assert_allclose(t2, [np.sqrt([0.5, 0.3, 0.15, 0.05]) / np.sqrt([0.5, 0.3, 0.15, 0.05]).sum()],
                               rtol=1e-5)


def test_top_p_sampling_never_leaves_the_nucleus(toy):
    lm, params, ids, mask = toy
    out = sampling.generate(lm, params, ids, mask, key=jax.random.key(5), max_new_tokens=6, temperature=1.0,
                            top_p=0.5)
    # nucleus renormalisation can only raise a kept token's log-prob above the model's own
    teacher = _score_completion(lm, params, ids, mask, out)
    assert np.all(np.asarray(out.logprobs) >= teacher - 1e-5)  # renormalising only raises log-probs
    assert np.any(np.asarray(out.logprobs) > teacher + 1e-3)


def test_same_bucket_reuses_one_compiled_program(toy):
    lm, params, _, _ = toy
    rng = np.random.default_rng(0)
    before = sampling.compiled_programs()
    for length in (5, 9, 16):  # all in the 16 bucket
        ids = rng.integers(1, V, (2, length)).astype(np.int32)
        sampling.generate(lm, params, ids, np.ones_like(ids), key=jax.random.key(0), max_new_tokens=3,
                          temperature=0.9, top_k=4)
    assert sampling.compiled_programs() - before == 1
    ids = rng.integers(1, V, (2, 17)).astype(np.int32)  # next bucket (32): one more program
    sampling.generate(lm, params, ids, np.ones_like(ids), key=jax.random.key(0), max_new_tokens=3,
                      temperature=0.9, top_k=4)
    assert sampling.compiled_programs() - before == 2
    assert sampling.bucket_length(17, [8, 24, 48]) == 24


def test_bad_input_is_refused_before_compiling(toy):
    lm, params, ids, mask = toy
    kw = dict(key=jax.random.key(0), max_new_tokens=2)
    with pytest.raises(ConfigError, match="temperature"):
        sampling.generate(lm, params, ids, mask, temperature=-1, **kw)
    with pytest.raises(ConfigError, match="top_p"):
        sampling.generate(lm, params, ids, mask, top_p=1.5, **kw)
    with pytest.raises(ConfigError, match="attention_mask"):
        sampling.generate(lm, params, ids, mask[:, :3], **kw)
    with pytest.raises(ConfigError, match="largest bucket"):
        sampling.generate(lm, params, ids, mask, buckets=[4], **kw)


# ----------------------------------------------------------------------------- parity with transformers


def _hf_tiny(kind: str):
    import transformers

    common = dict(vocab_size=61, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
    else:
        cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, **common)
    return cfg


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def hf_pair(request, tmp_path_factory):
    """A tiny random transformers model and the same weights loaded by jaxrl_hier.llm."""
    import torch
    import transformers

    from jaxrl_hier.llm import load_pretrained

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_hf_tiny(request.param)).eval()
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    lm = load_pretrained(str(path), dtype=jnp.float32)
    ids = np.array([[0, 0, 0, 11, 12, 13], [5, 6, 7, 8, 9, 10]], np.int64)
    mask = np.array([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int64)
    return torch, model, lm, ids, mask


def test_greedy_matches_transformers_generate(hf_pair):
    torch, model, lm, ids, mask = hf_pair
    n = 8
    with torch.no_grad():
        ref = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0)[:, ids.shape[1]:].numpy()
    out = sampling.generate(lm, lm.params, ids, mask, key=jax.random.key(0), max_new_tokens=n, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)


def test_teacher_forced_logprobs_match_transformers_and_cached_sampler(hf_pair):
    torch, model, lm, ids, mask = hf_pair
    out = sampling.generate(lm, lm.params, ids, mask, key=jax.random.key(1), max_new_tokens=6, temperature=1.0)
    np.testing.assert_allclose(np.asarray(out.logprobs), _score_completion(lm, lm.params, ids, mask, out),
                               rtol=1e-4, atol=1e-4)  # cached incremental decode == full forward
    full_ids = np.concatenate([ids, np.asarray(out.tokens)], 1)
    full_mask = np.concatenate([mask, np.ones_like(np.asarray(out.tokens))], 1)
    pos = np.maximum(full_mask.cumsum(-1) - 1, 0)
    with torch.no_grad():
        logits = model(torch.tensor(full_ids), attention_mask=torch.tensor(full_mask),
                       position_ids=torch.tensor(pos)).logits.float()
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(full_ids[:, 1:])[..., None])[..., 0]
    ref = ref.numpy() * full_mask[:, :-1] * full_mask[:, 1:]  # a real target with real context
    got = np.asarray(sampling.token_logprobs(lm, lm.params, full_ids, full_mask))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_eos_stops_rows_on_real_model(hf_pair):
    _, _, lm, ids, mask = hf_pair
    free = np.asarray(sampling.generate(lm, lm.params, ids, mask, key=jax.random.key(0), max_new_tokens=6,
                                        temperature=0.0).tokens)
    eos = int(free[1, 1])
    out = sampling.generate(lm, lm.params, ids, mask, key=jax.random.key(0), max_new_tokens=6, temperature=0.0,
                            eos_token_id=eos)
    stop = int(np.flatnonzero(free[1] == eos)[0]) + 1
    assert np.asarray(out.mask[1]).sum() == stop
    np.testing.assert_array_equal(np.asarray(out.tokens[1, stop:]), 0)


def test_learned_position_table_overflow_is_refused_and_first_real_token_scores_zero():
    import transformers

    from jaxrl_hier.llm import LanguageModel

    gpt2 = LanguageModel.random(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                        n_positions=16), jax.random.key(0))
    ids = np.array([[0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]], np.int32)
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)
    # 6 real tokens + 11 new = 17 positions > 16 rows: refused before anything compiles.
    with pytest.raises(ConfigError, match="max_position_embeddings=16"):
        sampling.generate(gpt2, gpt2.params, ids, mask, key=jax.random.key(1), max_new_tokens=11)
    assert sampling.generate(gpt2, gpt2.params, ids, mask, key=jax.random.key(1), max_new_tokens=10,
                             temperature=0.0).tokens.shape == (2, 10)
    lp = np.asarray(sampling.token_logprobs(gpt2, gpt2.params, ids, mask))
    assert lp[0, :2].tolist() == [0.0, 0.0]  # pads and the first real token (no real context)
    assert np.all(lp[0, 2:] < 0) and np.all(lp[1] < 0)


def test_grouped_sampling_of_a_model_without_a_decoder_cache_repeats_the_prompts(toy):
    lm, params, ids, mask = toy
    outs = [sampling.sample_tokens(lm, params, i, m, jax.random.key(2), max_new_tokens=4, temperature=1.0, group=g)
            for i, m, g in ((np.repeat(ids, 2, 0), np.repeat(mask, 2, 0), 1), (ids, mask, 2))]
    np.testing.assert_array_equal(np.asarray(outs[1].tokens), np.asarray(outs[0].tokens))
    np.testing.assert_array_equal(np.asarray(outs[1].logprobs), np.asarray(outs[0].logprobs))
