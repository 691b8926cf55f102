"""On-device rewards on token ids agree with the Python rewards on random completions."""

import jax
import numpy as np
import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks import ArithmeticTask, Problem, build_char_tokenizer, length_penalty
from jaxrl_hier.tasks import jax_rewards as jr

L, A = 32, 8
TASK = ArithmeticTask()


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _random_answer(rng):
    whole = str(int(rng.integers(0, 10 ** rng.integers(1, 4))))
    frac = "".join(str(d) for d in rng.integers(1, 10, rng.integers(1, 3))) if rng.random() < 0.3 else ""
    sign = "-" if rng.random() < 0.3 and whole + frac != "0" else ""
    return sign + whole + ("." + frac if frac else "")


def _write_number(rng, answer):
    """The answer written correctly in a non-canonical way, or a wrong / broken number."""
    neg, body = answer.startswith("-"), answer.lstrip("-")
    whole, _, frac = body.partition(".")
    r = rng.random()
    if r < 0.15:  # commas
        whole = ",".join(whole[max(i - 3, 0):i] for i in range(len(whole), 0, -3)[::-1])
    elif r < 0.3:
        whole = "0" * int(rng.integers(1, 3)) + whole
    elif r < 0.4:
        frac = frac + "0" * int(rng.integers(1, 3))
    elif r < 0.55:  # wrong digit
        k = int(rng.integers(len(whole)))
        whole = whole[:k] + str((int(whole[k]) + 1) % 10) + whole[k + 1:]
    elif r < 0.6:
        neg = not neg
    elif r < 0.65:
        return rng.choice(["", "- 3", "+", ".5", ",1", "x1"])
    text = whole + ("." + frac if frac else "")
    sign = "-" if neg else ("+" if rng.random() < 0.1 else "")
    text = sign + text
    if rng.random() < 0.1:
        text += "."  # trailing dot
    return text


def _random_row(rng, tok, answer):
    alphabet = "0123456789#- .,+\nab*="
    noise = lambda n: "".join(rng.choice(list(alphabet), n))  # noqa: E731
    marker = rng.choice(["####", "####", "####", "###", "#####", ""])
    text = noise(int(rng.integers(0, 6))) + marker + " " * int(rng.integers(0, 3)) + _write_number(rng, answer)
    text += rng.choice(["", "", "\n", " apples", "1", ".5", ",", "\n#### 7"]) + noise(int(rng.integers(0, 4)))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if rng.random() < 0.15:  # a stray special token inside the text
        ids.insert(int(rng.integers(len(ids) + 1)), int(rng.choice([tok.bos_token_id, tok.unk_token_id, tok.pad_token_id])))
    ids = ids[:L]
    cut = len(ids)
    if rng.random() < 0.75 and cut < L:
        ids.append(tok.eos_token_id)
        cut += 1
    if rng.random() < 0.15:  # generation stopped early: the mask ends before the text does
        cut = int(rng.integers(0, cut + 1))
    tokens = np.full(L, tok.pad_token_id, np.int32)
    tokens[:len(ids)] = ids
    if len(ids) < L and rng.random() < 0.2:  # junk after EOS, hidden by the mask
        tokens[len(ids):] = rng.integers(4, len(tok), L - len(ids))
    mask = (np.arange(L) < cut).astype(np.int32)
    if rng.random() < 0.1:  # a mask that runs past EOS: the text still ends at EOS
        mask[:] = 1
    return tokens, mask


KNOWN = [("3*4=12\n#### 17", "17", 1, 1), ("#### 1,7 apples", "17", 1, 1), ("####  -17.00", "-17", 1, 1),
         ("#### -0", "0", 1, 1), ("17", "17", 0, 0), ("##### 17", "17", 0, 0), ("#### 0017", "17", 1, 1),
         ("#### 18", "17", 0, 1), ("#### 170", "17", 0, 1), ("#### 1.7", "17", 0, 1)]
# SFT targets (worked solutions) must score as correct on device too
KNOWN += [(p.target, p.answer, 1, 1) for p in ArithmeticTask(digits=1, steps=2, worked=True).problems("train", 14, 0)]
GROUPS = 4


@pytest.fixture(scope="module")
def batch(tok):
    """Random rows plus KNOWN rows, scored once by one compiled program vmapped over groups (as a
    GRPO step would call it), so every test here shares a single compile."""
    rng = np.random.default_rng(0)
    answers = [_random_answer(rng) for _ in range(1600 - len(KNOWN))]
    rows = [_random_row(rng, tok, a) for a in answers]
    for text, answer, _, _ in KNOWN:
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        tokens = np.full(L, tok.pad_token_id, np.int32)
        tokens[:len(ids)] = ids
        rows.append((tokens, (np.arange(L) < len(ids)).astype(np.int32)))
        answers.append(answer)
    tokens, mask = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    answer_ids = jr.encode_answers(tok, answers, A)
    spec = jr.answer_token_spec(tok)
    grouped = jax.jit(jax.vmap(jr.answer_rewards, in_axes=(0, 0, 0, None)))
    shape = (GROUPS, len(rows) // GROUPS)
    out = grouped(tokens.reshape(*shape, L), mask.reshape(*shape, L), answer_ids.reshape(*shape, A), spec)
    out = {k: np.asarray(v).reshape(len(rows)) for k, v in out.items()}
    return tokens, mask, answers, out


def test_jax_rewards_equal_python_rewards(tok, batch):
    tokens, mask, answers, out = batch
    texts = jr.decode_completions(tok, tokens, mask)
    problems = [Problem(prompt="", answer=a, target="") for a in answers]
    correct = np.array([TASK.is_correct(p, t) for p, t in zip(problems, texts)], np.float32)
    formed = np.array([TASK.is_well_formed(p, t) for p, t in zip(problems, texts)], np.float32)
    bad = np.flatnonzero((out["correct"] != correct) | (out["well_formed"] != formed))
    assert not bad.size, [(texts[i], answers[i], out["correct"][i], correct[i]) for i in bad[:5]]
    np.testing.assert_array_equal(out["length"], [len(t) for t in texts])
    # the cases are varied enough for the comparison to mean something
    assert 0.2 < correct.mean() < 0.6 and (formed > correct).sum() > 200 and (formed == 0).sum() > 200
    assert (mask.sum(1) == L).sum() > 50
    python_len = length_penalty(24, buffer=8)(problems, texts)
    np.testing.assert_allclose(jr.length_penalty(out["length"], 24, buffer=8), python_len, rtol=1e-6)


def test_known_rows(batch):
    _, _, _, out = batch
    n = len(KNOWN)
    np.testing.assert_array_equal(out["correct"][-n:], [k[2] for k in KNOWN])
    np.testing.assert_array_equal(out["well_formed"][-n:], [k[3] for k in KNOWN])
    np.testing.assert_array_equal(out["length"][-n:], [len(k[0]) for k in KNOWN])


def test_decode_completions_cuts_at_eos_and_mask(tok):
    ids = tok("#### 12", add_special_tokens=False)["input_ids"]
    tokens = np.array([ids + [tok.eos_token_id, 5], ids[:2] + [tok.bos_token_id] + ids[2:] + [5]])
    mask = np.array([[1] * 9, [1] * 6 + [0] * 3])
    assert jr.decode_completions(tok, tokens, mask) == ["#### 12", "##\ufffd## "]


def test_encode_answers_and_spec_errors(tok):
    np.testing.assert_array_equal(jr.encode_answers(tok, ["1,200.50", "-3"]),
                                  [tok("1200.5")["input_ids"], tok("-3")["input_ids"] + [-1] * 4])
    with pytest.raises(ConfigError, match="width"):
        jr.encode_answers(tok, ["12345"], width=3)
    with pytest.raises(ConfigError, match="not a number"):
        jr.encode_answers(tok, ["twelve"])
    with pytest.raises(ConfigError, match="one token per digit"):
        jr.answer_token_spec(build_char_tokenizer("0123#- "))


def test_spec_refuses_tokenizers_that_merge_digits():
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[EOS]", "####", *"0123456789", "-", "+", ".", ","]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()  # "1234567890" becomes one (unknown) token
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                                eos_token="[EOS]")
    with pytest.raises(ConfigError, match="one token per digit"):
        jr.answer_token_spec(fast)


def test_spec_accepts_sign_tokens_that_carry_a_space():
    """BPE tokenizers (Qwen's) write " -5" as " -", "5": the sign keeps the space before it."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", " -", "  ", *"0123456789#-+., \nx"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r" -|  |[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")
    spec = jr.answer_token_spec(fast)
    assert fast("#### -5", add_special_tokens=False)["input_ids"][4] == vocab[" -"]
    assert spec.kind[vocab[" -"]] == jr.MINUS and spec.kind[vocab["  "]] == jr.SPACE
    assert spec.kind[vocab["7"]] == jr.DIGIT and spec.digit[vocab["7"]] == 7 and spec.kind[vocab["x"]] == jr.OTHER
