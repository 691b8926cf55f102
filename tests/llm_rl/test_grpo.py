"""The GRPO trainer on a tiny model: co-location (ratio 1, zero copies), learning, DAPO/Dr.GRPO/LoRA paths."""

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_hier  # noqa: F401  (XLA CPU flags)
from jaxrl_hier.llm import LanguageModel
from jaxrl_hier.llm_rl.config import GRPOConfig
from jaxrl_hier.llm_rl import losses
from jaxrl_hier.llm_rl.grpo import evaluate_policy, make_train
from jaxrl_hier.llm_rl.model_setup import build_lora, build_policy
from jaxrl_hier.llm_rl.sft import SFT, train_sft
from jaxrl_hier.tasks import build_char_tokenizer, make_task
from jaxrl_hier.tasks.jax_rewards import decode_completions

BASE = GRPOConfig(task_operators="+", task_digits=1, task_steps=1, model_hidden_size=32, model_layers=1,
                  model_heads=2, model_kv_heads=1, model_intermediate_size=64, max_prompt_length=6,
                  max_new_tokens=8, prompts_per_step=8, num_generations=4, learning_rate=3e-3, beta=0.0,
                  temperature=1.0)


@pytest.fixture(scope="module")
def warm():
    """A tiny model after a short SFT: it writes answer lines and is right sometimes."""
    tok = build_char_tokenizer()
    task = make_task("arithmetic", operators="+", digits=1, steps=1)
    lm, tok = build_policy(BASE, tok)
    sft = SFT(lm, tok, task, steps=80, batch_size=32, learning_rate=1e-2, warmup_steps=5,
              max_prompt_length=BASE.max_prompt_length, max_new_tokens=BASE.max_new_tokens)
    state = train_sft(sft, sft.init(), 80)
    params, _ = sft.params_and_lora(state)
    return lm.config, lm.hf_config, params, tok, task


def fresh_model(warm):
    """A LanguageModel with its own copy of the warm params (full fine-tuning consumes its arrays)."""
    config, hf, params, tok, _ = warm
    return LanguageModel(config, jax.tree.map(jnp.copy, params), hf_config=hf, tokenizer=tok)


def pointers(tree):
    return [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]


def test_colocated_step_ratio_one_zero_copies(warm):
    lm = fresh_model(warm)
    trainer = make_train(BASE, lm, warm[3], warm[4])
    state = trainer.init(jax.random.key(0))
    # the trainable tree is the model's own arrays, not a copy
    assert pointers(state.trainable) == pointers(lm.params)
    sampled = []  # buffer pointers of the weights each rollout reads
    rollout = trainer._rollout
    trainer._rollout = lambda trainable, *a: (sampled.append(pointers(trainable)), rollout(trainable, *a))[1]
    before_val = jax.device_get(state.trainable)
    with jax.transfer_guard("disallow"):  # only explicit host<->device transfers (prompts in, metrics out)
        state, metrics, _ = trainer.step(state)
        written = pointers(state.trainable)
        state, _, _ = trainer.step(state)
    # same params sampled and scored: the importance ratio is exactly 1 on the first pass
    assert metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_frac"] == 0.0
    # the next rollout read exactly the buffers the optimiser wrote: no copy, no transfer between roles
    assert sampled[1] == written
    # without a mesh, init commits the state to the device as the update returns it: each stage
    # compiled once, not again at the second step
    assert rollout._cache_size() == 1 and trainer._update._cache_size() == 1
    after = jax.device_get(state.trainable)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before_val)))
    for key in ("reward", "reward/correct", "reward/format", "accuracy", "completion_length", "entropy", "kl",
                "time/generation", "time/scoring", "time/update", "tokens_per_s", "groups_dropped", "update_skipped"):
        assert key in metrics and np.isfinite(metrics[key]), key
    assert metrics["update_skipped"] == 0.0


def test_full_finetuning_reference_is_a_fused_frozen_copy(warm):
    """Full fine-tuning with beta > 0 scores the KL against a copy of the starting weights, laid out
    for scoring (q|k|v and gate|up fused: `LanguageModel.frozen_copy`): it shares no buffer with the
    trained weights, gives the policy's own log-probs before the first update (KL 0), and stays put."""
    lm = fresh_model(warm)
    trainer = make_train(dataclasses.replace(BASE, beta=0.04), lm, warm[3], warm[4])
    ref = trainer.ref_params
    assert {"qkv_proj", "gate_up_proj"} <= set(ref["layers"]) and "q_proj" not in ref["layers"]
    assert not set(pointers(ref)) & set(pointers(lm.params))
    start = jax.device_get(ref)
    state = trainer.init(jax.random.key(0))
    state, metrics, _ = trainer.step(state)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6) and metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(trainer.ref_params)), jax.tree.leaves(start)):
        np.testing.assert_array_equal(a, b)


def test_reward_rises_under_grpo(warm):
    """A trivially learnable reward (well-formed answer line) climbs within a few dozen steps."""
    cfg = dataclasses.replace(BASE, reward_correct=0.0, reward_format=1.0, prompts_per_step=8, num_generations=8,
                              learning_rate=1e-2, temperature=1.5, fused_step=True)
    trainer = make_train(cfg, fresh_model(warm), warm[3], warm[4])
    state = trainer.init(jax.random.key(1))
    rewards = []
    for _ in range(30):
        state, metrics, _ = trainer.step(state)
        rewards.append(metrics["reward"])
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.15, (first, last, rewards)


def test_dapo_dynamic_sampling_with_lora_reference(warm):
    cfg = dataclasses.replace(BASE, loss_type="dapo", lora_rank=4, beta=0.04, max_sampling_rounds=2)
    lm = fresh_model(warm)
    base_before = jax.device_get(lm.params)
    trainer = make_train(cfg, lm, warm[3], warm[4], lora=build_lora(cfg, lm))
    c = trainer.config
    assert (c.eps_high, c.dynamic_sampling, c.overlong_filter) == (0.28, True, True)
    assert trainer.ref_params is None  # the reference is the base with the adapter off: no copy
    state = trainer.init(jax.random.key(2))
    state, metrics, _ = trainer.step(state)
    assert 0.0 <= metrics["groups_dropped"] <= 1.0
    assert np.isfinite(metrics["kl"]) and metrics["kl"] >= -1e-6  # adapter starts at identity: KL ~ 0
    for a, b in zip(jax.tree.leaves(jax.device_get(lm.params)), jax.tree.leaves(base_before)):
        np.testing.assert_array_equal(a, b)  # the frozen base is untouched
    assert any(float(jnp.abs(x["b"]).max()) > 0 for x in state.trainable.params["layers"].values())


def test_dr_grpo_with_host_rewards_matches_device_rewards(warm):
    cfg = dataclasses.replace(BASE, loss_type="dr_grpo")
    trainer = make_train(cfg, fresh_model(warm), warm[3], warm[4])
    assert trainer.config.scale_rewards == "none"
    state = trainer.init(jax.random.key(3))
    problems, rollout, total, parts, _, _ = trainer._sample_and_score(state, 0, 0, jax.random.key(4))
    host_total, host_parts = trainer._host_rewards(problems, rollout)
    np.testing.assert_allclose(np.asarray(total), np.asarray(host_total))
    # the host-reward trainer also decodes with the layer scan (`unroll_decode: false`): the same rollout
    host_cfg = dataclasses.replace(cfg, jax_rewards=False, unroll_decode=False)
    host = make_train(host_cfg, fresh_model(warm), warm[3], warm[4])
    assert host.lm.config.unroll_decode is False and trainer.lm.config.unroll_decode is None
    state = host.init(jax.random.key(3))
    scan_rollout = host._sample_and_score(state, 0, 0, jax.random.key(4))[1]
    np.testing.assert_array_equal(np.asarray(scan_rollout.tokens), np.asarray(rollout.tokens))
    state, metrics, _ = host.step(state)
    assert np.isfinite(metrics["loss"])


def test_reference_scored_without_the_samplers_top_k(warm):
    """beta > 0 with top_k: through the sampler's filter, a sampled token outside the reference's own
    top k would score -inf and the KL be +inf. Scored under the temperature alone, the KL is finite and
    is k3 of the sampler's log-probs against the reference's tempered ones, computed here by hand."""
    cfg = dataclasses.replace(BASE, beta=0.04, temperature=0.7, top_k=2)
    ref_lm, _ = build_policy(BASE, warm[3])  # untrained: its top 2 seldom hold the warm policy's tokens
    trainer = make_train(cfg, fresh_model(warm), warm[3], warm[4], ref_params=ref_lm.params)
    _, metrics, samples = trainer.step(trainer.init(jax.random.key(5)))
    r = jax.device_get(samples["rollout"])
    ids, mask = np.concatenate([r.prompt_ids, r.tokens], 1), np.concatenate([r.prompt_mask, r.mask], 1)
    # completion token j is predicted at the position before it
    logits = np.asarray(ref_lm.logits(ref_lm.params, ids, mask), np.float64)[:, r.prompt_ids.shape[1] - 1:-1]
    logits = logits / cfg.temperature
    picked = np.take_along_axis(logits, r.tokens[..., None].astype(np.int64), -1)[..., 0]
    outside = (logits > picked[..., None]).sum(-1) >= cfg.top_k
    assert np.any(outside & (r.mask > 0))  # the filtered reference would give -inf
    top = logits.max(-1)
    ref = picked - top - np.log(np.exp(logits - top[..., None]).sum(-1))
    d = ref - r.logprobs
    w = np.asarray(losses.token_weights(jnp.asarray(r.mask), cfg.loss_type, cfg.max_new_tokens))
    assert np.isfinite(metrics["kl"])
    np.testing.assert_allclose(metrics["kl"], np.sum(w * (np.exp(d) - d - 1)) / w.sum(), rtol=1e-4)


def test_accuracy_is_the_share_of_correct_completions(warm):
    """reward/correct is the 0/1 part, unweighted: accuracy is it, whatever reward_correct weighs it by."""
    cfg = dataclasses.replace(BASE, reward_correct=2.0)
    trainer = make_train(cfg, fresh_model(warm), warm[3], warm[4])
    _, metrics, samples = trainer.step(trainer.init(jax.random.key(6)))
    r = samples["rollout"]
    problems = [p for p in samples["problems"] for _ in range(cfg.num_generations)]
    share = np.mean([warm[4].is_correct(p, t) for p, t in zip(problems, decode_completions(warm[3], r.tokens, r.mask))])
    assert share > 0
    assert metrics["accuracy"] == pytest.approx(share) and metrics["accuracy"] == metrics["reward/correct"]


def test_no_update_when_every_group_is_dropped(warm):
    """Every reward equal: dynamic sampling drops every group, and the step leaves the weights and the
    AdamW state bit-identical (an update on the zero gradient would still move them by its momentum)."""
    cfg = dataclasses.replace(BASE, loss_type="dapo", reward_correct=0.0, reward_format=0.0, overlong_buffer=0,
                              max_sampling_rounds=1)
    trainer = make_train(cfg, fresh_model(warm), warm[3], warm[4])
    state = trainer.init(jax.random.key(7))
    # momentum, as earlier steps leave it
    ones = jax.tree.map(jnp.ones_like, state.trainable)
    state = state.replace(opt_state=trainer.optimizer.update(ones, state.opt_state, state.trainable)[1])
    before = jax.device_get((state.trainable, state.opt_state))
    state, metrics, _ = trainer.step(state)
    assert metrics["groups_dropped"] == 1.0 and metrics["update_skipped"] == 1.0
    after = jax.device_get((state.trainable, state.opt_state))
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    assert int(state.step) == 1


def test_evaluation_decodes_with_the_runs_suppressed_tokens(warm):
    """The greedy evaluation suppresses what the run's sampler does: the policy's most frequent
    character, suppressed, never appears in the evaluation's completions."""
    lm, tok, task = fresh_model(warm), warm[3], warm[4]
    problems = task.problems("test", 8, 0)
    plain = evaluate_policy(lm, lm.params, None, tok, task, problems, max_prompt_length=BASE.max_prompt_length,
                            max_new_tokens=BASE.max_new_tokens, batch_size=8)["completions"]
    char = Counter("".join(plain).replace(" ", "").replace("\n", "")).most_common(1)[0][0]
    cfg = dataclasses.replace(BASE, suppress_tokens=(tok.convert_tokens_to_ids(char),))
    trainer = make_train(cfg, lm, tok, task)
    out = trainer.evaluate(trainer.init(jax.random.key(0)), problems, batch_size=8)["completions"]
    assert out != plain and not any(char in t for t in out)
