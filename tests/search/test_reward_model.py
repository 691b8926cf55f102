"""The PGTS reward model: paths cut into steps as the env cuts them, the training loss falls, AUC."""

import itertools

import jax
import numpy as np
import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import LanguageModel
from jaxrl_hier.llm_rl.data import encode_prompts
from jaxrl_hier.llm_rl.model_setup import tiny_qwen2_config
from jaxrl_hier.search.reward_model import (LikelihoodVerifier, RewardModel, auc, build_path_data, evaluate_reward_model, split_steps,
                                            train_reward_model)
from jaxrl_hier.tasks import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_split_steps_and_layout(tok):
    nl = tok.convert_tokens_to_ids("\n")
    ids = tok("1+2=3\n3+4=7\n#### 7", add_special_tokens=False)["input_ids"] + [2, 0, 0]
    steps = split_steps(ids, nl, 2, step_tokens=5)
    assert [tok.decode(s) for s in steps] == ["1+2=3", "\n", "3+4=7", "\n", "#### ", "7<eos>"]
    steps = split_steps(ids, nl, 2, step_tokens=10)
    assert [tok.decode(s) for s in steps] == ["1+2=3\n", "3+4=7\n", "#### 7<eos>"]
    p = encode_prompts(tok, ["1+2+4="], 8)
    data = build_path_data(p.ids, p.mask, [ids[:-2]], [True], delimiter_id=nl, eos_id=2, pad_id=0, step_tokens=10,
                           max_depth=2)
    assert data.ids.shape == (2, 8 + 20) and data.steps.tolist() == [1, 2] and data.label.tolist() == [1.0, 1.0]
    real = data.ids[1][data.mask[1] > 0].tolist()
    assert tok.decode(real) == "<bos>1+2+4=1+2=3\n3+4=7\n" and data.mask[1][0] == 0  # left-padded, 2 steps kept
    assert data.prompt_tokens.tolist() == [7, 7]  # BOS + "1+2+4="


def test_process_labels_mark_every_prefix_from_the_first_wrong_step(tok):
    from jaxrl_hier.tasks import ArithmeticTask, Problem

    task = ArithmeticTask(steps=2, digits=1, worked=True)
    problem = Problem("1+2+4=", "7", "1+2=3\n3+4=7\n#### 7", {})
    assert task.steps_correct(problem, ["1+2=3\n", "3+4=7\n", "#### 7"]) == [True, True, True]
    assert task.steps_correct(problem, ["1+2=3\n", "3+4=8\n", "#### 7"]) == [True, False, False]
    assert task.steps_correct(problem, ["1+2=4\n", "4+4=8\n", "#### 8"]) == [False, False, False]
    assert task.steps_correct(problem, ["1+2=3\n", "3+4=7\n", "7+0=7\n"]) == [True, True, False]  # past the end
    nl = tok.convert_tokens_to_ids("\n")
    ids = tok("1+2=3\n3+4=8\n#### 8", add_special_tokens=False)["input_ids"] + [2]
    p = encode_prompts(tok, ["1+2+4="], 8)
    data = build_path_data(p.ids, p.mask, [ids], [False], delimiter_id=nl, eos_id=2, pad_id=0, step_tokens=10,
                           max_depth=3, prefix_labels=[[True, False, False]])
    assert data.label.tolist() == [1.0, 0.0, 0.0] and data.steps.tolist() == [1, 2, 3]


def test_auc_matches_pair_count():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 40).astype(float)
    y = rng.integers(0, 2, 40)
    pairs = [(a, b) for a, b in itertools.product(s[y == 1], s[y == 0])]
    brute = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert auc(s, y) == pytest.approx(brute)
    assert np.isnan(auc(s, np.ones(40)))


def test_training_loss_falls(tok):
    hf = tiny_qwen2_config(len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    lm = LanguageModel.random(hf, jax.random.key(0), tokenizer=tok)
    rm = RewardModel(lm)
    params = rm.init(jax.random.key(1), lm.params)
    nl = tok.convert_tokens_to_ids("\n")
    # a path is "right" when its first step's result is even: a pattern the model must read off the tokens
    rng = np.random.default_rng(0)
    completions, labels = [], []
    for _ in range(64):
        a, b = rng.integers(0, 5, 2)
        completions.append(tok(f"{a}+{b}={a + b}\n#### {a + b}", add_special_tokens=False)["input_ids"] + [2])
        labels.append((a + b) % 2 == 0)
    p = encode_prompts(tok, ["1+1="] * 64, 6)
    data = build_path_data(p.ids, p.mask, completions, labels, delimiter_id=nl, eos_id=2, pad_id=0, step_tokens=8,
                           max_depth=2)
    before = evaluate_reward_model(rm, params, data)
    params, losses = train_reward_model(rm, params, data, steps=60, batch_size=32, learning_rate=3e-3)
    after = evaluate_reward_model(rm, params, data)
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    assert after["loss"] < before["loss"] and after["auc"] > 0.7
    with pytest.raises(ConfigError, match="steps"):
        train_reward_model(rm, params, data, steps=0, batch_size=4, learning_rate=1e-3)


def test_likelihood_verifier_scores_the_least_likely_step_token(tok):
    """exp(min log p) over the step tokens only, by hand from token_logprobs; a path whose worst
    token is a prompt token is not penalised for it; it is measured like the classifier."""
    from jaxrl_hier.llm.sampling import token_logprobs

    hf = tiny_qwen2_config(len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    lm = LanguageModel.random(hf, jax.random.key(3), tokenizer=tok)
    lm.params = jax.tree_util.tree_map(lambda x: x * 8 if x.ndim == 2 else x, lm.params)  # peaked distributions
    nl = tok.convert_tokens_to_ids("\n")
    completions = [tok(t, add_special_tokens=False)["input_ids"] + [2] for t in ("1+2=3\n#### 3", "9-9=5\n#### 5")]
    p = encode_prompts(tok, ["1+2=", "9-9="], 6)
    data = build_path_data(p.ids, p.mask, completions, [True, False], delimiter_id=nl, eos_id=2, pad_id=0,
                           step_tokens=8, max_depth=2)
    verifier = LikelihoodVerifier(lm)
    got = np.asarray(jax.jit(verifier.score)(lm.params, data.ids, data.mask, data.prompt_tokens))
    lp = np.asarray(token_logprobs(lm, lm.params, data.ids, data.mask))
    for row in range(len(got)):
        real = np.flatnonzero(data.mask[row])  # positions of the real tokens
        targets = real[data.prompt_tokens[row]:]  # the step tokens
        assert np.exp(lp[row, targets - 1].min()) == pytest.approx(got[row], rel=1e-4)
        with_prompt = np.exp(lp[row, real[1:] - 1].min())
        assert with_prompt <= got[row] * (1 + 1e-5)
    assert (got > 0).all() and (got <= 1).all()
    assert evaluate_reward_model(verifier, lm.params, data)["examples"] == len(got)
