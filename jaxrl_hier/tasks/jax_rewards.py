"""Rewards on token ids in pure jax.numpy, so a whole GRPO step can be one compiled program.

They implement exactly the answer-line rule of `answers.extract_answer` (first "####", spaces,
optional sign, digits with ignored commas, optional ".digits", trailing text ignored, exact
decimal comparison) on token ids, for tokenizers that write each digit as one token (the char
tokenizer, where the agreement with the Python rewards is tested; `answer_token_spec` refuses
tokenizers that merge digits, such as GPT-2's and Llama-3's). Tokens made only of spaces are
spaces, a sign may carry the spaces before it (" -"), "," and "." count only alone; any other
token (EOS, other specials, multi-character tokens) ends a number.

Inputs, per batch of B completions of length L:
  tokens     int32 [B, L]  completion ids
  mask       [B, L]        1 up to and including EOS, 0 after (padding)
  answer_ids int32 [B, A]  each row's reference answer as ids, padded with -1 (`encode_answers`)
The completion's text is its tokens up to the first EOS or the first 0 in the mask, whichever
comes first; `decode_completions` gives the same texts for the Python rewards (specials inside
the text become one "\\ufffd" each, so lengths and positions line up).

Everything is vmap- and jit-friendly: no Python control flow on values. For Countdown the answer
line alone does not decide correctness (the expression must be checked): use the Python rewards
there (`task.answer_checkable_on_device` is False).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import MARKER, canonical_number
from jaxrl_hier.tasks.base import overlong_penalty

# Token kinds for the number grammar.
OTHER, DIGIT, SPACE, MINUS, PLUS, COMMA, DOT = range(7)
_KIND_OF_TEXT = {" ": SPACE, "-": MINUS, "+": PLUS, ",": COMMA, ".": DOT}
REPLACEMENT = "\ufffd"


class AnswerTokenSpec(NamedTuple):
    """What the on-device rewards need to know about a tokenizer (a pytree of arrays).

    kind: int32 [V+1], the grammar kind of each id (the extra last entry, OTHER, is where ids
    outside the vocabulary and -1 padding are looked up). digit: int32 [V+1], the digit value or
    -1. marker: int32 [M], the ids of "####". eos_id: int32 scalar.
    """

    kind: jax.Array
    digit: jax.Array
    marker: jax.Array
    eos_id: jax.Array


def _kind_of(text: str) -> tuple[int, int]:
    """(kind, digit value) of one token's text."""
    if len(text) == 1 and text in "0123456789":
        return DIGIT, int(text)
    stripped = text.lstrip(" ")
    if text and not stripped:
        return SPACE, -1  # any run of spaces
    if stripped in ("-", "+") or text in (",", "."):
        # a sign may carry the spaces before it (BPE merges " -"); "," and "." only alone
        return _KIND_OF_TEXT[stripped], -1
    return OTHER, -1


# Probes that must tokenize into the kinds the on-device parser reads (spaces collapsed).
_PROBES = ((" -1234567890.5", [MINUS] + [DIGIT] * 10 + [DOT, DIGIT]),
           (" 1,234 x", [DIGIT, COMMA, DIGIT, DIGIT, DIGIT]))


def answer_token_spec(tokenizer: Any, marker: str = MARKER) -> AnswerTokenSpec:
    """Build the spec from a Hugging Face tokenizer.

    ConfigError if it has no EOS, cannot encode the marker reversibly, or does not write an
    answer line ("1\n#### -1234567890.5", "1\n#### 1,234") as the marker's ids followed by one
    token per digit, sign, comma and dot (GPT-2 and Llama-3 merge digits, for instance)."""
    if tokenizer.eos_token_id is None:
        raise ConfigError("answer_token_spec: the tokenizer has no eos_token; set one.")
    size = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    kind = np.full(size + 1, OTHER, np.int32)
    digit = np.full(size + 1, -1, np.int32)
    for i, text in enumerate(texts):
        if i not in special:
            kind[i], digit[i] = _kind_of(text)
    marker_ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
    if not marker_ids or tokenizer.decode(marker_ids) != marker:
        raise ConfigError(f"answer_token_spec: the tokenizer does not encode {marker!r} reversibly.")
    for line, expected in _PROBES:
        ids = tokenizer(f"1\n{marker}{line}", add_special_tokens=False)["input_ids"]
        at = [k for k in range(len(ids)) if ids[k:k + len(marker_ids)] == marker_ids]
        kinds = [int(kind[i]) if 0 <= i < size else OTHER for i in ids[at[0] + len(marker_ids):]] if at else []
        while kinds and kinds[0] == SPACE:
            kinds.pop(0)
        if kinds[:len(expected)] != expected:
            raise ConfigError(f"answer_token_spec: the tokenizer does not write the answer line {marker + line!r} "
                              "as the marker's ids and one token per digit, sign, comma and dot (it merges "
                              "digits, or the marker, with neighbours); use the Python rewards.")
    return AnswerTokenSpec(jnp.asarray(kind), jnp.asarray(digit), jnp.asarray(marker_ids, jnp.int32),
                           jnp.asarray(tokenizer.eos_token_id, jnp.int32))


def encode_answers(tokenizer: Any, answers: Sequence[str], width: int | None = None) -> np.ndarray:
    """Reference answers as int32 [B, width] ids padded with -1 (width: the longest, by default).

    Each answer is put in canonical form first ("1,234.50" -> "1234.5")."""
    rows = []
    for answer in answers:
        canonical = canonical_number(str(answer))
        if canonical is None:
            raise ConfigError(f"encode_answers: {answer!r} is not a number.")
        rows.append(tokenizer(canonical, add_special_tokens=False)["input_ids"])
    longest = max((len(r) for r in rows), default=0)
    width = max(longest, 1) if width is None else width
    if longest > width:
        raise ConfigError(f"encode_answers: an answer needs {longest} tokens but width={width}; raise width.")
    out = np.full((len(rows), width), -1, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def decode_completions(tokenizer: Any, tokens: Any, mask: Any) -> list[str]:
    """The texts the on-device rewards see: each row cut at its first EOS or first 0 in the mask,
    special (or out-of-vocabulary) ids rendered as one U+FFFD each, the rest decoded."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    special = set(tokenizer.all_special_ids)
    size, eos = len(tokenizer), tokenizer.eos_token_id
    texts = []
    for row, row_mask in zip(tokens, mask):
        keep = np.cumprod((row_mask != 0) & (row != eos)).astype(bool)
        pieces, run = [], []
        for i in row[keep].tolist():
            if i in special or not 0 <= i < size:
                pieces.append(tokenizer.decode(run, clean_up_tokenization_spaces=False) + REPLACEMENT)
                run = []
            else:
                run.append(i)
        pieces.append(tokenizer.decode(run, clean_up_tokenization_spaces=False))
        texts.append("".join(pieces))
    return texts


# ----------------------------------------------------------------------------- one row


def _lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
    size = table.shape[0] - 1
    return table[jnp.where((ids >= 0) & (ids < size), ids, size)]


def _first(flags: jax.Array) -> jax.Array:
    """Index of the first True in a row, or the row's length. (Reductions like this compile far
    faster on XLA:CPU than cumulative sums, which matters for tests and small hosts.)"""
    return jnp.min(jnp.where(flags, jnp.arange(flags.shape[0]), flags.shape[0]))


def _at(flags: jax.Array, i: jax.Array) -> jax.Array:
    """flags[i], False when i is past the end."""
    return jnp.any(flags & (jnp.arange(flags.shape[0]) == i))


def _text_mask(tokens: jax.Array, mask: jax.Array, eos_id: jax.Array) -> jax.Array:
    """True on the completion's text: before the first EOS and before the first 0 in the mask."""
    return jnp.arange(tokens.shape[0]) < _first((mask == 0) | (tokens == eos_id))


def _find_marker(tokens: jax.Array, text: jax.Array, marker: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(found, index just after the first marker) for one row."""
    length, width = tokens.shape[0], marker.shape[0]
    tok = jnp.concatenate([tokens, jnp.full(width, -1, tokens.dtype)])
    ok = jnp.concatenate([text, jnp.zeros(width, bool)])
    hit = jnp.ones(length, bool)
    for k in range(width):  # static, len("####") steps
        hit &= (tok[k:k + length] == marker[k]) & ok[k:k + length]
    return hit.any(), _first(hit) + width


def _parse_number(kind: jax.Array, digit: jax.Array, width: int):
    """Parse `" "* sign? digit (digit|",")* ("." digit+)?` at the start of one row of kinds.

    Returns (ok, negative, integer digits right-aligned [width], fraction digits left-aligned
    [width], overflow); zero-filled alignment makes the comparison ignore leading and trailing
    zeros, and `overflow` says a nonzero digit fell outside the `width` kept."""
    pos = jnp.arange(kind.shape[0])
    is_digit = kind == DIGIT
    start = _first(kind != SPACE)
    signed = _at((kind == MINUS) | (kind == PLUS), start)
    negative = _at(kind == MINUS, start)
    start = start + signed
    ok = _at(is_digit, start)
    end = _first((pos >= start) & ~(is_digit | (kind == COMMA)))
    has_frac = ok & _at(kind == DOT, end) & _at(is_digit, end + 1)
    frac = has_frac & (pos > end) & (pos < _first((pos > end) & ~is_digit))
    whole = ok & (pos >= start) & (pos < end) & is_digit
    rank = jnp.sum(whole) - jnp.cumsum(whole)  # digits to the right of each position
    frac_rank = pos - end - 1
    slot = jnp.arange(width)[:, None]
    int_digits = jnp.sum(jnp.where(whole & (rank == slot), digit, 0), axis=1)
    frac_digits = jnp.sum(jnp.where(frac & (frac_rank == slot), digit, 0), axis=1)
    nonzero_digit = digit > 0
    overflow = jnp.any(nonzero_digit & ((whole & (rank >= width)) | (frac & (frac_rank >= width))))
    negative &= jnp.any(nonzero_digit & (whole | frac))  # -0 is 0
    return ok, negative, int_digits, frac_digits, overflow


def _row(tokens, mask, answer_ids, spec: AnswerTokenSpec):
    length, width = tokens.shape[0], answer_ids.shape[0]
    text = _text_mask(tokens, mask, spec.eos_id)
    found, after = _find_marker(tokens, text, spec.marker)
    idx = after + jnp.arange(length)
    inside = (idx < length) & text[jnp.minimum(idx, length - 1)]
    window = tokens[jnp.minimum(idx, length - 1)]
    kind = jnp.where(inside, _lookup(spec.kind, window), OTHER)
    ok, neg, whole, frac, overflow = _parse_number(kind, _lookup(spec.digit, window), width)
    ok &= found
    a_ok, a_neg, a_whole, a_frac, a_overflow = _parse_number(
        _lookup(spec.kind, answer_ids), _lookup(spec.digit, answer_ids), width)
    correct = (ok & a_ok & ~overflow & ~a_overflow & (neg == a_neg)
               & jnp.all(whole == a_whole) & jnp.all(frac == a_frac))
    return correct.astype(jnp.float32), ok.astype(jnp.float32), jnp.sum(text).astype(jnp.int32)


# ----------------------------------------------------------------------------- batched API


def answer_rewards(tokens: jax.Array, mask: jax.Array, answer_ids: jax.Array,
                   spec: AnswerTokenSpec) -> dict[str, jax.Array]:
    """Per row: "correct" float32 [B] (1.0 when the answer line's number equals the reference),
    "well_formed" float32 [B] (1.0 when the answer line holds a number, as
    `extract_answer(text) is not None`), and "length" int32 [B] (tokens before EOS)."""
    correct, well_formed, length = jax.vmap(_row, in_axes=(0, 0, 0, None))(
        jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(answer_ids), spec)
    return {"correct": correct, "well_formed": well_formed, "length": length}


def length_penalty(lengths: jax.Array, max_len: int, buffer: int | None = None, penalty: float = 1.0) -> jax.Array:
    """The on-device twin of `base.length_penalty` (same formula, same defaults) on lengths [B]."""
    buffer = max_len // 4 if buffer is None else buffer
    return overlong_penalty(jnp.asarray(lengths, jnp.float32), max_len, buffer, penalty, xp=jnp)
