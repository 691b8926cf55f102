"""The GRPO trainer on a tiny model: co-location (ratio 1, zero copies), learning, DAPO/Dr.GRPO/LoRA paths."""

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_hier  # noqa: F401  (XLA CPU flags)
from jaxrl_hier.llm import LanguageModel
from jaxrl_hier.llm_rl.config import GRPOConfig, ModelSection
from jaxrl_hier.llm_rl import losses
from jaxrl_hier.llm_rl.grpo import evaluate_policy, make_train
from jaxrl_hier.llm_rl.model_setup import build_lora, build_policy
from jaxrl_hier.llm_rl.rollout import Rollout
from jaxrl_hier.llm_rl.sft import SFT, train_sft
from jaxrl_hier.tasks import build_char_tokenizer, make_task
from jaxrl_hier.tasks.jax_rewards import decode_completions

BASE = GRPOConfig(task_operators="+", task_digits=1, task_steps=1,
                  model=ModelSection(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64),
                  max_prompt_length=6, max_new_tokens=8, prompts_per_step=8, num_generations=4, learning_rate=3e-3, beta=0.0,
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
    # lr 3e-3: at 1e-2 the first update wrecked the format at every seed tried (0.78 -> 0.0-0.06; at key 1
    # it never came back) once the warm start's SFT data lost the validation split; at 3e-3 the reward
    # climbed from 0.78-0.82 to 0.97-0.98 at keys 1, 2 and 3
    cfg = dataclasses.replace(BASE, reward_correct=0.0, reward_format=1.0, prompts_per_step=8, num_generations=8,
                              learning_rate=3e-3, temperature=1.5, fused_step=True)
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


# ---------------------------------------------------------------- DAPO's host-side pieces, by hand

@pytest.fixture(scope="module")
def untrained():
    """A random tiny policy: enough to build trainers whose host logic is tested without compiling."""
    tok = build_char_tokenizer()
    lm, tok = build_policy(BASE, tok)
    return lm, tok, make_task("arithmetic", operators="+", digits=1, steps=1)


def fake_rounds(trainer, rewards_by_round):
    """Replace sampling by hand-made rounds: round r's row i has every token 10 + r * 100 + i (no special
    token) and its problems are named "r<r>p<j>"; returns the list of (step, round) sampled."""
    calls = []

    def sample_and_score(state, step, round_, key, problems=None):
        calls.append((step, round_))
        total = np.asarray(rewards_by_round[round_], np.float32).reshape(-1)
        rows = np.repeat((10 + round_ * 100 + np.arange(len(total)))[:, None], 3, axis=1).astype(np.int32)
        zeros = np.zeros_like(rows)
        rollout = Rollout(zeros, zeros, rows, zeros.astype(np.float32), np.ones_like(rows))
        names = [f"r{round_}p{j}" for j in range(len(total) // trainer.config.num_generations)]
        return names, rollout, jnp.asarray(total), {"correct": jnp.asarray(total)}, 0.0, 0.0

    trainer._sample_and_score = sample_and_score
    return calls


def test_dynamic_sampling_drops_equal_groups_and_draws_until_the_batch_is_full(untrained):
    """3 prompts x 2 completions: groups whose rewards are all equal are dropped, and rounds are drawn
    until 3 groups are kept; the fourth round allowed is never drawn."""
    lm, tok, task = untrained
    cfg = dataclasses.replace(BASE, loss_type="dapo", prompts_per_step=3, num_generations=2, max_sampling_rounds=4)
    trainer = make_train(cfg, lm, tok, task)
    calls = fake_rounds(trainer, [[[1, 1], [0, 1], [0, 0]],          # keeps r0p1
                                  [[0.5, 0.2], [1, 1], [0.3, 0.3]],  # keeps r1p0
                                  [[0, 1], [1, 0], [2, 2]]])         # keeps r2p0: full (r2p1 is not needed)
    problems, rollout, total, parts, valid, dropped, _, _ = trainer._dynamic(None, 5, jax.random.key(0))
    assert calls == [(5, 0), (5, 1), (5, 2)]
    assert problems == ["r0p1", "r1p0", "r2p0"]
    np.testing.assert_allclose(np.asarray(total), [0, 1, 0.5, 0.2, 0, 1])
    np.testing.assert_allclose(np.asarray(parts["correct"]), [0, 1, 0.5, 0.2, 0, 1])
    np.testing.assert_array_equal(np.asarray(rollout.tokens)[:, 0], [12, 13, 110, 111, 210, 211])  # kept rows
    np.testing.assert_array_equal(np.asarray(valid), np.ones(6))
    assert dropped == pytest.approx(5 / 9)  # 2 + 2 + 1 equal groups of the 9 sampled


def test_dynamic_sampling_pads_a_short_batch_with_invalid_rows(untrained):
    """The rounds run out with one group kept: the batch is filled with copies of it marked invalid,
    which get advantage 0 and no token in the loss."""
    lm, tok, task = untrained
    cfg = dataclasses.replace(BASE, loss_type="dapo", prompts_per_step=3, num_generations=2, max_sampling_rounds=2,
                              overlong_filter=False)  # the fake rows have no EOS
    trainer = make_train(cfg, lm, tok, task)
    calls = fake_rounds(trainer, [[[1, 1], [0, 1], [0, 0]], [[1, 1], [0, 0], [3, 3]]])
    problems, rollout, total, _, valid, dropped, _, _ = trainer._dynamic(None, 0, jax.random.key(0))
    assert calls == [(0, 0), (0, 1)] and problems == ["r0p1"] * 3
    np.testing.assert_allclose(np.asarray(total), [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(np.asarray(valid), [1, 1, 0, 0, 0, 0])
    assert dropped == pytest.approx(5 / 6)
    batch = trainer._batch(rollout, total, valid)
    a = 0.5 / (np.sqrt(0.5) + losses.STD_EPS)  # group [0, 1]: centred -+0.5, unbiased std sqrt(0.5)
    np.testing.assert_allclose(np.asarray(batch.advantages), [-a, a, 0, 0, 0, 0], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(batch.loss_mask).sum(axis=1), [3, 3, 0, 0, 0, 0])


def test_overlong_filter_takes_truncated_completions_out_of_the_loss_only(untrained):
    """A completion without EOS (cut at max_new_tokens) leaves the loss under overlong_filter, yet still
    counts in its group's advantage baseline; without the filter its tokens stay in."""
    lm, tok, task = untrained
    eos = tok.eos_token_id
    tokens = np.array([[5, 6, eos, 0], [5, 6, 7, 8], [eos, 0, 0, 0], [5, 5, 5, 5]], np.int32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]], np.int32)
    zeros = np.zeros_like(tokens)
    rollout = Rollout(zeros, zeros, tokens, zeros.astype(np.float32), mask)
    total = jnp.array([1.0, 0.0, 0.2, 1.0])
    # group 0: centred [0.5, -0.5], std sqrt(0.5); group 1: centred [-0.4, 0.4], std sqrt(0.32) (unbiased)
    adv = [0.5 / (np.sqrt(0.5) + 1e-4), -0.5 / (np.sqrt(0.5) + 1e-4), -0.4 / (np.sqrt(0.32) + 1e-4),
           0.4 / (np.sqrt(0.32) + 1e-4)]
    for overlong_filter, kept in ((True, [1, 0, 1, 0]), (False, [1, 1, 1, 1])):
        cfg = dataclasses.replace(BASE, loss_type="dapo", prompts_per_step=2, num_generations=2,
                                  overlong_filter=overlong_filter)
        batch = make_train(cfg, lm, tok, task)._batch(rollout, total, None)
        np.testing.assert_array_equal(np.asarray(batch.loss_mask), mask * np.array(kept)[:, None])
        np.testing.assert_allclose(np.asarray(batch.advantages), adv, rtol=1e-5)


def test_soft_overlong_penalty_in_the_rewards(untrained):
    """reward = correct + 0.1 well-formed + length, length 0 up to max_new_tokens - overlong_buffer = 4
    tokens before EOS, then down to -overlong_penalty = -0.5 at 8: the same on the device and the host."""
    from jaxrl_hier.llm_rl.data import encode_completions
    from jaxrl_hier.llm_rl.rewards import make_reward_spec

    _, tok, task = untrained
    cfg = dataclasses.replace(BASE, overlong_buffer=4, overlong_penalty=0.5).resolved()
    spec = make_reward_spec(cfg, task, tok)
    assert spec.names == ("correct", "format", "length")
    problem = task.make_problem([3, 4], ["+"])  # 3+4=7
    texts = ["77", "####", "#### 7", "#### 8", "#### 777"]  # 2, 4, 6, 6 and 8 tokens (the last without EOS)
    length = [0.0, 0.0, -0.25, -0.25, -0.5]
    total = [0.0, 0.0, 1 + 0.1 - 0.25, 0.1 - 0.25, 0.1 - 0.5]
    ids, mask, truncated = encode_completions(tok, texts, cfg.max_new_tokens)
    assert truncated == 1
    answers = spec.encode_answers([problem] * len(texts))
    dev_total, dev_parts = jax.jit(spec.jax_fn)(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(answers))
    host_total, host_parts = spec.py_fn([problem] * len(texts), texts, np.array([2, 4, 6, 6, 8]))
    for t, parts in ((dev_total, dev_parts), (host_total, host_parts)):
        np.testing.assert_allclose(np.asarray(parts["length"]), length, atol=1e-6)
        np.testing.assert_allclose(np.asarray(t), total, atol=1e-6)
    # DAPO's default buffer (-1) is a quarter of max_new_tokens: 2, so 7 tokens score -0.5 * (7 - 6) / 2
    dapo = dataclasses.replace(BASE, loss_type="dapo").resolved()
    assert dapo.overlong_buffer == 2
    np.testing.assert_allclose(np.asarray(make_reward_spec(dapo, task, tok)._length(jnp.array([6.0, 7.0]), jnp)),
                               [0.0, -0.5])


def test_sft_counts_truncated_targets(untrained):
    """Each SFT step reports how many of its targets (EOS included) exceed max_new_tokens = 8, instead of
    dropping the count: "#### 1" (7) and "#### 12" (8) fit, "#### 123" (9) and "1+2=3\\n#### 3" (13) do not."""
    from jaxrl_hier.tasks import Problem

    class Targets:
        def problems(self, split, n, seed):
            return [Problem("1+2=", "3", t) for t in ("#### 1", "#### 12", "#### 123", "1+2=3\n#### 3")] * (n // 4)

    lm, tok, _ = untrained
    sft = SFT(lm, tok, Targets(), steps=2, batch_size=8, learning_rate=1e-3, warmup_steps=0,
              max_prompt_length=BASE.max_prompt_length, max_new_tokens=BASE.max_new_tokens)
    sft.step = lambda state, batch: (state.replace(step=state.step + 1), {"loss": 0.0})  # the update is not tested here
    seen = []
    train_sft(sft, sft.init(), 2, on_step=lambda state, metrics: seen.append(metrics))
    assert [m["truncated_targets"] for m in seen] == [4.0, 4.0]
