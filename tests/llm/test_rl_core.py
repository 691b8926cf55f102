"""The LLM core as an RL loop uses it: the traceable sampler (`sample_tokens` inside jit/vmap/scan,
hidden states), the sampler/trainer log-prob match under temperature and top-p (importance ratio 1),
chunked scoring (values, gradients, entropy), and meshes with Explicit axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import LanguageModel, decoder, sampling
from jaxrl_hier.llm.sampling import sample_tokens, token_logprobs

V = 29
IDS = np.array([[0, 0, 5, 7, 9, 3], [3, 4, 5, 6, 2, 8]], np.int32)
MASK = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)
N = 5


@pytest.fixture(scope="module")
def lm():
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    model = LanguageModel.random(cfg, jax.random.key(0))
    # larger logits than N(0, 0.02) weights give, so temperature and top-p change the distribution
    model.params = jax.tree_util.tree_map(lambda x: x * 6 if x.ndim == 2 else x, model.params)
    return model


def _full(out):
    """Prompt + completion, as the trainer scores it."""
    return (np.concatenate([IDS, np.asarray(out.tokens)], 1), np.concatenate([MASK, np.asarray(out.mask)], 1))


@pytest.fixture(scope="module")
def sample_fn(lm):
    def fn(params, ids, mask, key, temperature, top_p):
        return sample_tokens(lm, params, ids, mask, key, max_new_tokens=N, temperature=temperature, top_k=None,
                             top_p=top_p, eos_ids=(), pad_token_id=0, return_hidden=True)
    return fn


def test_importance_ratio_is_one_at_temperature_and_top_p(lm):
    out = sampling.generate(lm, lm.params, IDS, MASK, key=jax.random.key(3), max_new_tokens=N, temperature=0.7,
                            top_p=0.95, buckets=[IDS.shape[1]])
    ids, mask = _full(out)
    lp = np.asarray(token_logprobs(lm, lm.params, ids, mask, temperature=0.7, top_p=0.95))[:, -N:]
    np.testing.assert_allclose(lp, np.asarray(out.logprobs), atol=1e-5, rtol=0)
    plain = np.asarray(token_logprobs(lm, lm.params, ids, mask))[:, -N:]
    assert np.abs(plain - lp).max() > 1e-2  # the settings matter: the model's own log-probs differ


def test_suppressed_tokens_are_never_sampled_and_score_alike(lm):
    suppress = tuple(range(1, 12))
    out = jax.jit(lambda p, k: sample_tokens(lm, p, IDS, MASK, k, max_new_tokens=N, temperature=1.5, top_k=20,
                                             suppress_tokens=suppress))(lm.params, jax.random.key(4))
    assert not np.isin(np.asarray(out.tokens), suppress).any()
    ids, mask = _full(out)
    lp = token_logprobs(lm, lm.params, ids, mask, temperature=1.5, top_k=20, suppress_tokens=suppress)
    np.testing.assert_allclose(np.asarray(lp)[:, -N:], np.asarray(out.logprobs), atol=1e-5, rtol=0)


def test_greedy_logprobs_are_the_models_own(lm):
    out = sampling.generate(lm, lm.params, IDS, MASK, key=jax.random.key(0), max_new_tokens=N, temperature=0.0,
                            buckets=[IDS.shape[1]])
    ids, mask = _full(out)
    for lp in (token_logprobs(lm, lm.params, ids, mask), token_logprobs(lm, lm.params, ids, mask, temperature=0)):
        np.testing.assert_allclose(np.asarray(lp)[:, -N:], np.asarray(out.logprobs), atol=1e-5, rtol=0)


def test_chunked_scores_equal_full_logits_with_gradients_and_entropy(lm):
    ids = np.concatenate([IDS, IDS[:, ::-1]], 1)
    mask = np.concatenate([MASK, np.ones_like(MASK)], 1)
    valid = (mask[:, :-1] * mask[:, 1:]).astype(bool)

    def reference(params):  # the old way: [B, T, V] logits at once
        logits = lm.forward(params, jnp.asarray(ids), jnp.asarray(mask))[0][:, :-1]
        logp = sampling.filter_logits(logits, 0.8, None, 0.9)
        picked = jnp.take_along_axis(logp, jnp.asarray(ids[:, 1:, None]), -1)[..., 0]
        ent = -jnp.sum(jnp.where(jnp.isfinite(logp), jnp.exp(logp) * logp, 0), -1)
        return jnp.where(valid, picked, 0), jnp.where(valid, ent, 0)

    def chunked(params):  # 11 positions in chunks of 4: the last chunk is padded
        return token_logprobs(lm, params, ids, mask, temperature=0.8, top_p=0.9, chunk_size=4, return_entropy=True)

    def loss(score):  # the summed finite log-probs; values ride along as aux (one compile per scorer)
        def f(params):
            lp, ent = score(params)
            return jnp.sum(jnp.where(jnp.isfinite(lp), lp, 0)), (lp, ent)
        return jax.jit(jax.grad(f, has_aux=True))(lm.params)

    (g_r, (lp_r, ent_r)), (g_c, (lp_c, ent_c)) = loss(reference), loss(chunked)
    np.testing.assert_allclose(np.asarray(lp_c), np.asarray(lp_r), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent_r), atol=1e-5)
    assert np.all(np.asarray(ent_c)[valid] > 0) and np.all(np.asarray(ent_c)[~valid] == 0)
    for a, b in zip(jax.tree_util.tree_leaves(g_r), jax.tree_util.tree_leaves(g_c)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)
    assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(g_c)) > 0


def test_chunks_over_the_logit_budget_split_the_rows_with_the_same_values_and_gradients(lm, monkeypatch):
    """A chunk whose [rows, positions, vocab] logits would pass MAX_CHUNK_LOGITS is scored in blocks of
    rows (3 rows -> blocks of 2, the last padded): the same log-probs, entropies and gradients."""
    ids = np.concatenate([IDS, IDS[:1, ::-1]], 0)
    mask = np.concatenate([MASK, np.ones_like(MASK[:1])], 0)

    def grads():
        def f(params):
            lp, ent = token_logprobs(lm, params, ids, mask, temperature=0.8, top_p=0.9, chunk_size=4,
                                     return_entropy=True)
            return jnp.sum(jnp.where(jnp.isfinite(lp), lp, 0)), (lp, ent)
        return jax.jit(jax.grad(f, has_aux=True))(lm.params)

    whole = grads()
    monkeypatch.setattr(sampling, "MAX_CHUNK_LOGITS", 2 * 4 * V)  # two rows of a 4-position chunk
    calls = []
    real = sampling._row_blocks
    monkeypatch.setattr(sampling, "_row_blocks", lambda *a: calls.append(a[-2]) or real(*a))
    blocked = grads()
    assert calls == [2]  # the row-block path ran, with blocks of 2 rows
    for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(blocked)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)


def test_remat_gives_the_same_gradients_with_less_compiled_memory(lm):
    """`with_remat(True)` shares the arrays, recomputes each layer in the backward pass (the same
    log-probs and gradients) and keeps only layer inputs: XLA's temporary memory for the gradient
    program falls; generation with a KV cache is unaffected."""
    ids = np.tile(np.concatenate([IDS, IDS[:, ::-1], IDS], 1), (4, 1))
    mask = np.tile(np.concatenate([MASK, np.ones_like(MASK), np.ones_like(MASK)], 1), (4, 1))
    remat = lm.with_remat(True)
    assert remat.params is lm.params and remat.config.remat and not lm.config.remat
    assert lm.with_remat(False) is lm

    def grad_program(model):
        def f(params):
            lp = token_logprobs(model, params, ids, mask)
            return jnp.sum(lp), lp
        return jax.jit(jax.grad(f, has_aux=True)).lower(lm.params).compile()

    plain_c, remat_c = grad_program(lm), grad_program(remat)
    (g_p, lp_p), (g_r, lp_r) = plain_c(lm.params), remat_c(lm.params)
    np.testing.assert_allclose(np.asarray(lp_r), np.asarray(lp_p), atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(g_p), jax.tree_util.tree_leaves(g_r)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)
    temp = lambda c: c.memory_analysis().temp_size_in_bytes  # noqa: E731
    assert temp(remat_c) < 0.7 * temp(plain_c), (temp(remat_c), temp(plain_c))
    # these shapes are small enough that remat keeps the projections' outputs (decoder.saves_dots);
    # keeping only the layer inputs gives the same gradients in less memory still
    assert decoder.saves_dots(remat.config, ids.size, 4)
    assert not decoder.saves_dots(remat.config, ids.size * 10**5, 4)
    inputs_only = lm.with_remat(True, save_dots=False)
    inputs_c = grad_program(inputs_only)
    g_i, lp_i = inputs_c(lm.params)
    for a, b in zip(jax.tree_util.tree_leaves(g_p), jax.tree_util.tree_leaves(g_i)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)
    assert temp(inputs_c) < temp(remat_c), (temp(inputs_c), temp(remat_c))
    key = jax.random.key(5)
    outs = [sampling.generate(m, lm.params, IDS, MASK, key=key, max_new_tokens=N, buckets=[IDS.shape[1]])
            for m in (lm, remat)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))


def test_shared_prefix_scores_equal_the_repeated_prompts(lm):
    """G completions per prompt scored with each prompt run once (keys and values shared) give the
    log-probs, entropies and gradients of the prompts repeated G times: left-padded prompts, a
    completion cut by its mask, temperature and top-p, with and without remat, and through LoRA."""
    from jaxrl_hier.llm import LoraConfig, init_lora
    from jaxrl_hier.llm_rl.rollout import completion_logprobs

    g = 3
    prompts, prompt_mask = np.repeat(IDS, g, 0), np.repeat(MASK, g, 0)
    tokens = np.random.default_rng(0).integers(3, V, (2 * g, 4)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, 2:] = 0
    mask[4, 1:] = 0
    lora = init_lora(lm.config, LoraConfig(rank=2), jax.random.key(1))
    lora = jax.tree_util.tree_map(lambda x: x + 0.1, lora)  # a non-zero adapter, so its gradient path is exercised

    def scores(model, group, with_lora):
        def f(trainable):
            params, adapter = (lm.params, trainable) if with_lora else (trainable, None)
            lp, ent = completion_logprobs(model, params, adapter, prompts, prompt_mask, tokens, mask, temperature=0.8,
                                          top_p=0.9, return_entropy=True, group=group)
            return jnp.sum(jnp.where(jnp.isfinite(lp), lp, 0)), (lp, ent)
        return jax.jit(jax.grad(f, has_aux=True))(lora if with_lora else lm.params)

    for model, with_lora in ((lm, False), (lm.with_remat(True), False), (lm, True)):
        (g_1, (lp_1, ent_1)), (g_g, (lp_g, ent_g)) = scores(model, 1, with_lora), scores(model, g, with_lora)
        np.testing.assert_allclose(np.asarray(lp_g), np.asarray(lp_1), atol=1e-5)
        np.testing.assert_allclose(np.asarray(ent_g), np.asarray(ent_1), atol=1e-5)
        assert np.all(np.asarray(lp_g)[mask == 0] == 0) and np.isfinite(np.asarray(lp_g)[0]).any()
        for a, b in zip(jax.tree_util.tree_leaves(g_1), jax.tree_util.tree_leaves(g_g)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4, rtol=1e-4)


def test_grouped_sampling_equals_the_repeated_prompts(lm):
    """`sample_tokens(group=G)` runs each (left-padded) prompt through the model once and shares
    its cache with its G samples: the tokens and log-probs of the prompts repeated G times, with a
    LoRA adapter and per-row greedy flags (test_sampling: a model without a decoder KVCache)."""
    from jaxrl_hier.llm import LoraConfig, init_lora

    g = 3
    lora = jax.tree_util.tree_map(lambda x: x + 0.1, init_lora(lm.config, LoraConfig(rank=2), jax.random.key(1)))
    greedy = np.array([True, False, False, False, True, False])
    outs = [jax.jit(lambda p, a, k, ids=ids, mask=mask, grp=grp: sample_tokens(
        lm, p, ids, mask, k, max_new_tokens=N, temperature=0.9, lora=a, greedy=greedy, group=grp))(
        lm.params, lora, jax.random.key(6)) for ids, mask, grp in ((np.repeat(IDS, g, 0), np.repeat(MASK, g, 0), 1),
                                                                     (IDS, MASK, g))]
    assert outs[1].tokens.shape == (2 * g, N)
    np.testing.assert_array_equal(np.asarray(outs[1].tokens), np.asarray(outs[0].tokens))
    np.testing.assert_allclose(np.asarray(outs[1].logprobs), np.asarray(outs[0].logprobs), atol=1e-6)
    assert len({tuple(r) for r in np.asarray(outs[1].tokens)[1:3]}) == 2  # a prompt's samples are drawn apart
    with pytest.raises(ConfigError, match="group"):
        sample_tokens(lm, lm.params, IDS, MASK, jax.random.key(0), max_new_tokens=N, group=0)


def test_per_row_greedy_flag_equals_the_greedy_and_the_sampled_call(lm):
    """A traced greedy flag per row: greedy rows equal greedy=True's, the others the sampled call's
    with the same key (tokens, log-probs, hidden states), in one program."""
    key = jax.random.key(7)

    def run(greedy):
        return sample_tokens(lm, lm.params, IDS, MASK, key, max_new_tokens=N, temperature=1.3, top_p=0.9,
                             return_hidden=True, greedy=greedy)

    greedy_out, sampled_out = run(True), run(False)
    mixed = jax.jit(run)(jnp.array([True, False]))
    for field in ("tokens", "logprobs", "mask", "hidden"):
        np.testing.assert_allclose(np.asarray(getattr(mixed, field))[0], np.asarray(getattr(greedy_out, field))[0],
                                   atol=1e-5)
        np.testing.assert_allclose(np.asarray(getattr(mixed, field))[1], np.asarray(getattr(sampled_out, field))[1],
                                   atol=1e-5)
    assert not np.array_equal(np.asarray(greedy_out.tokens)[1], np.asarray(sampled_out.tokens)[1])
    # a traced scalar applies to every row (what the search env passes under vmap)
    np.testing.assert_array_equal(np.asarray(jax.jit(run)(jnp.bool_(True)).tokens), np.asarray(greedy_out.tokens))


def test_sample_tokens_inside_jit_vmap_and_scan_equals_direct_call(lm, sample_fn):
    keys = jax.random.split(jax.random.key(7), 2)
    temps, top_ps = jnp.array([0.7, 1.3]), jnp.array([0.9, 1.0])
    ids2, mask2 = jnp.stack([IDS, IDS[::-1]]), jnp.stack([MASK, MASK[::-1]])
    direct = [jax.jit(sample_fn)(lm.params, ids2[i], mask2[i], keys[i], temps[i], top_ps[i]) for i in range(2)]
    vmapped = jax.jit(jax.vmap(sample_fn, in_axes=(None, 0, 0, 0, 0, 0)))(lm.params, ids2, mask2, keys, temps, top_ps)

    def body(carry, xs):
        return carry, sample_fn(lm.params, *xs)

    _, scanned = jax.jit(lambda xs: jax.lax.scan(body, 0, xs))((ids2, mask2, keys, temps, top_ps))
    for i in range(2):
        for got in (vmapped, scanned):
            np.testing.assert_array_equal(np.asarray(got.tokens[i]), np.asarray(direct[i].tokens))
            np.testing.assert_allclose(np.asarray(got.logprobs[i]), np.asarray(direct[i].logprobs), atol=1e-5)
            np.testing.assert_allclose(np.asarray(got.hidden[i]), np.asarray(direct[i].hidden), atol=1e-5)
    assert not np.array_equal(np.asarray(direct[0].tokens), np.asarray(direct[1].tokens))


def test_hidden_is_the_final_norm_state_at_each_generated_position(lm, sample_fn):
    out = jax.jit(sample_fn)(lm.params, IDS, MASK, jax.random.key(1), jnp.float32(1.0), jnp.float32(1.0))
    assert out.hidden.shape == (2, N, 32)
    ids, mask = _full(out)
    full = lm.hidden_states(lm.params, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out.hidden), np.asarray(full[:, -N:]), atol=1e-5)


def test_bad_settings_are_config_errors(lm):
    with pytest.raises(ConfigError, match="chunk_size"):
        token_logprobs(lm, lm.params, IDS, MASK, chunk_size=0)
    with pytest.raises(ConfigError, match="top_p"):
        token_logprobs(lm, lm.params, IDS, MASK, top_p=0.0)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        sample_tokens(lm, lm.params, IDS, MASK, jax.random.key(0), max_new_tokens=0)


def test_explicit_axes_mesh_is_refused_at_load_and_auto_mesh_works(lm, tmp_path):
    from jaxrl_hier.llm import load_pretrained, make_mesh, save_pretrained
    from jaxrl_hier.llm.sharding import AXES

    explicit = jax.make_mesh((1, 1, 1), AXES)  # Explicit axes by default in this JAX
    assert jax.sharding.AxisType.Explicit in explicit.axis_types
    save_pretrained(lm, lm.params, tmp_path)
    for load in (lambda: load_pretrained(tmp_path, mesh=explicit),
                 lambda: LanguageModel.random(lm.hf_config, jax.random.key(0), mesh=explicit)):
        with pytest.raises(ConfigError, match=r"jaxrl_hier\.llm\.make_mesh.*AxisType\.Auto"):
            load()
    auto = load_pretrained(tmp_path, mesh=make_mesh())
    np.testing.assert_allclose(np.asarray(auto.logits(auto.params, IDS, MASK)),
                               np.asarray(lm.logits(lm.params, IDS, MASK)), atol=1e-5)


def test_forced_first_token_continues_as_if_it_were_in_the_prompt(lm):
    """`first_tokens` forces the first new token (scored by the model's own distribution) and the
    rest continue greedily as from the prompt extended by it; `return_runner_up` gives the model's
    second choice and its margin, so forcing the runner-up costs exactly that margin in log-prob."""
    greedy = sample_tokens(lm, lm.params, IDS, MASK, jax.random.key(0), max_new_tokens=N, greedy=True,
                           return_runner_up=True)
    runner_up, margin = np.asarray(greedy.runner_up), np.asarray(greedy.margin)
    assert (margin >= 0).all() and (runner_up != np.asarray(greedy.tokens)).all()
    first = jnp.array([runner_up[0, 0], -1])  # row 1 is not forced
    forced = jax.jit(lambda p, f: sample_tokens(lm, p, IDS, MASK, jax.random.key(0), max_new_tokens=N, greedy=True,
                                                first_tokens=f, return_hidden=True))(lm.params, first)
    tokens = np.asarray(forced.tokens)
    assert tokens[0, 0] == runner_up[0, 0]
    np.testing.assert_allclose(np.asarray(forced.logprobs)[0, 0], np.asarray(greedy.logprobs)[0, 0] - margin[0, 0],
                               atol=1e-5)
    np.testing.assert_array_equal(tokens[1], np.asarray(greedy.tokens)[1])
    ext_ids = np.concatenate([IDS[:1], tokens[:1, :1]], 1)
    ext = sample_tokens(lm, lm.params, ext_ids, np.ones_like(ext_ids) * np.concatenate([MASK[:1], [[1]]], 1),
                        jax.random.key(0), max_new_tokens=N - 1, greedy=True, return_hidden=True)
    np.testing.assert_array_equal(tokens[0, 1:], np.asarray(ext.tokens)[0])
    np.testing.assert_allclose(np.asarray(forced.logprobs)[0, 1:], np.asarray(ext.logprobs)[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(forced.hidden)[0, 1:], np.asarray(ext.hidden)[0], atol=1e-4)
