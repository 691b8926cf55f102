"""Text <-> token arrays for prompt/completion training, shared by SFT, GRPO and the later agents.

Every sequence has one static layout: the prompt left-padded to `max_prompt_length`, then the
completion right-padded to `max_new_tokens`:

    [pad pad <bos> p1 .. pk | c1 c2 .. cm <eos> pad pad]
     <---- max_prompt_length -><------ max_new_tokens ----->

so teacher-forced log-probs of completion token i sit at entry `max_prompt_length - 1 + i` of
`token_logprobs` ([B, T - 1], entry j scores token j + 1), whatever the prompt's length, and one
compiled program serves every batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from jaxrl_hier.config import ConfigError


class PromptBatch(NamedTuple):
    ids: np.ndarray   # [B, max_prompt_length] int32, left-padded
    mask: np.ndarray  # [B, max_prompt_length] int32


def special_ids(tokenizer: Any) -> tuple[int, int | None, int]:
    """(pad, bos or None, eos) token ids; a tokenizer without pad or eos is refused."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("the tokenizer has no eos_token: completions could never end. Set eos_token in its "
                          "tokenizer_config.json.")
    if pad is None:
        pad = eos
    return int(pad), (None if tokenizer.bos_token_id is None else int(tokenizer.bos_token_id)), int(eos)


def _ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


#: problems drawn per split to check a procedural task (arithmetic, Countdown), whose pool is too large to list
CHECK_SAMPLE = 1024


def input_pool(task: Any, split: str, seed: int) -> list:
    """Every problem of `split` when the task's pool is finite (`task.size(split)`: GSM8K files), else
    CHECK_SAMPLE seeded draws."""
    size = getattr(task, "size", None)
    return task.problems(split, size(split) if callable(size) else CHECK_SAMPLE, seed)


def evaluation_problems(task: Any, n: int, seed: int, split: str = "test") -> list:
    """The distinct problems an evaluation uses (`tasks.base.distinct_problems`), and a log line
    with their count: a split with repeats would count a problem several times and overstate how
    many were seen, so a split holding fewer than n gives all of its problems, and says so."""
    from jaxrl_hier.runs import log
    from jaxrl_hier.tasks.base import distinct_problems

    problems = distinct_problems(task, split, n, seed)
    short = f"; the split holds only {len(problems)}, all used" if len(problems) < n else ""
    log(f"evaluation: {len(problems)} distinct {split} problems (asked for {n}{short})")
    return problems


def held_out_row(i: int, every: int, total: int, validation: Callable[[], dict], test: Callable[[], dict]) -> dict:
    """Step i's held-out evaluations, as metrics keys. The validation split (`eval/<k>`) at step 0, every
    `every` steps and at the last (`every` 0: step 0 only): the curve to watch, and to choose settings
    by. The test split (`test/<k>`) at step 0 and at the last step only: the two figures a run reports
    (its warm-start and its trained policy), so no choice made by watching a curve has seen test."""
    rec: dict = {}
    if i == 0 or (every and (i % every == 0 or i == total)):
        rec.update({f"eval/{k}": v for k, v in validation().items()})
    if i in (0, total):
        rec.update({f"test/{k}": v for k, v in test().items()})
    return rec


def refuse_longer(problems: list, lengths: np.ndarray, limit: int, what: str, key: str) -> None:
    """ConfigError naming how many of `problems` exceed `limit`, the longest one, and the fix."""
    over = int((lengths > limit).sum())
    if over:
        i = int(lengths.argmax())
        meta = problems[i].meta
        where = f"{meta['file']}:{meta['line']}" if "file" in meta else repr(problems[i].prompt[:60])
        raise ConfigError(f"{over} of {len(problems)} {what} are longer than {key}={limit}; the longest ({where}) "
                          f"has {lengths[i]} tokens: raise {key} to {lengths[i]}.")


def prompt_lengths(tokenizer: Any, prompts: Sequence[str]) -> np.ndarray:
    """Each prompt's token count as `encode_prompts` lays it out (BOS included when the tokenizer has one)."""
    _, bos, _ = special_ids(tokenizer)
    return np.array([len(ids) + (bos is not None) for ids in _ids(tokenizer, prompts)], np.int64)


def completion_lengths(tokenizer: Any, completions: Sequence[str], add_eos: bool = True) -> np.ndarray:
    """Each completion's token count as `encode_completions` lays it out before truncation (EOS included)."""
    return np.array([len(ids) + add_eos for ids in _ids(tokenizer, completions)], np.int64)


def encode_prompts(tokenizer: Any, prompts: Sequence[str], max_length: int) -> PromptBatch:
    """Left-padded prompt ids (with BOS when the tokenizer has one); a prompt too long is refused."""
    pad, bos, _ = special_ids(tokenizer)
    rows = [([bos] if bos is not None else []) + ids for ids in _ids(tokenizer, prompts)]
    longest = max(len(r) for r in rows)
    if longest > max_length:
        raise ConfigError(f"a prompt has {longest} tokens but max_prompt_length is {max_length}; raise "
                          "max_prompt_length or shorten the task's prompts.")
    ids = np.full((len(rows), max_length), pad, np.int32)
    mask = np.zeros((len(rows), max_length), np.int32)
    for i, r in enumerate(rows):
        if r:
            ids[i, max_length - len(r):] = r
            mask[i, max_length - len(r):] = 1
    return PromptBatch(ids, mask)


def encode_completions(tokenizer: Any, completions: Sequence[str], max_new_tokens: int,
                       add_eos: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Right-padded completion ids + EOS, their mask, and how many had to be truncated."""
    pad, _, eos = special_ids(tokenizer)
    ids = np.full((len(completions), max_new_tokens), pad, np.int32)
    mask = np.zeros_like(ids)
    truncated = 0
    for i, row in enumerate(_ids(tokenizer, completions)):
        row = row + ([eos] if add_eos else [])
        if len(row) > max_new_tokens:
            truncated += 1
            row = row[:max_new_tokens]
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return ids, mask, truncated


def fixed_batches(batch_size: int, *arrays: Any) -> Iterator[tuple[int, int, tuple[np.ndarray, ...]]]:
    """Rows of `arrays` in batches of exactly `batch_size`, so a compiled function over them has one
    shape: yields (start, real rows, the batch's arrays), the last batch filled by repeating its first
    row. Keep the first `real` rows of what the function returns."""
    for start in range(0, len(arrays[0]), batch_size):
        part = tuple(np.asarray(x[start:start + batch_size]) for x in arrays)
        fill = batch_size - len(part[0])
        if fill:
            part = tuple(np.concatenate([x, np.repeat(x[:1], fill, axis=0)]) for x in part)
        yield start, batch_size - fill, part


__all__ = ["CHECK_SAMPLE", "PromptBatch", "fixed_batches", "special_ids", "input_pool", "evaluation_problems", "held_out_row", "refuse_longer", "prompt_lengths",
           "completion_lengths", "encode_prompts", "encode_completions"]
