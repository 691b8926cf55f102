"""The task protocol, problems, reward functions and their weighted combination.

A `Task` hands out `Problem`s (prompt, reference answer, SFT target) and judges completions.
Reward functions follow TRL's `reward_funcs` convention: called on a batch of problems and their
completions, they return one float per row, NaN where the function does not apply to that row
(for instance a task's correctness reward on a problem of another task in a mixed batch).
`CombinedReward` adds them with weights, as TRL's `reward_weights` do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from jaxrl_hier.config import ConfigError

# validation is for choosing settings (sweeps, model selection), test for reporting a chosen one once
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem.

    prompt: the text the model continues. answer: the reference answer in canonical form
    (see `answers.canonical_number`). target: a full SFT completion for the prompt (worked
    solution if the task was asked for one, then the answer line "#### <answer>"), without EOS.
    meta: task-specific facts; every task sets meta["task"] (the task name) and meta["split"].
    """

    prompt: str
    answer: str
    target: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    """What a trainer needs from a task.

    `problems(split, n, seed)` is deterministic in `seed`; the train, validation and test splits
    never share a problem. `is_well_formed` checks the format only (answer line present and parseable, plus
    any task-specific syntax); `is_correct` implies `is_well_formed`.
    Tasks also say whether the on-device reward (`jax_rewards`, which compares the answer line
    with `problem.answer`) judges them fully: `answer_checkable_on_device`.
    """

    name: str

    def problems(self, split: str, n: int, seed: int) -> list[Problem]: ...

    def is_correct(self, problem: Problem, completion: str) -> bool: ...

    def is_well_formed(self, problem: Problem, completion: str) -> bool: ...


RewardFn = Callable[[Sequence[Problem], Sequence[str]], np.ndarray]


# ----------------------------------------------------------------------------- split helpers


def check_split_args(split: str, n: int, seed: int) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {list(SPLITS)}, got {split!r}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n (the number of problems) must be an integer >= 0, got {n!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}.")


def check_fractions(name: str, test_fraction: Any, validation_fraction: Any) -> None:
    """The hashed shares of the test and validation splits: each in (0, 1), together below 1 (train keeps the rest)."""
    for key, value in (("test_fraction", test_fraction), ("validation_fraction", validation_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ConfigError(f"{name}: {key} must be in (0, 1), got {value!r}.")
    if test_fraction + validation_fraction >= 1.0:
        raise ConfigError(f"{name}: test_fraction + validation_fraction must be below 1 (train keeps the rest), "
                          f"got {test_fraction} + {validation_fraction}.")


def split_of(key: str, test_fraction: float, validation_fraction: float = 0.0) -> str:
    """The split a problem belongs to, from a hash of its identity (stable across runs and seeds).

    The hash, as a number u in [0, 1), puts u < test_fraction in test (as before validation
    existed, so the test split is unchanged) and the next `validation_fraction` in validation,
    carved out of what was train."""
    digest = hashlib.sha256(key.encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < test_fraction:
        return "test"
    return "validation" if u < test_fraction + validation_fraction else "train"


def split_rng(seed: int, split: str, salt: str) -> random.Random:
    """A generator for (seed, split, task), independent across the three. Python's Mersenne
    Twister: its small draws are several times cheaper than numpy Generator calls, which
    dominated procedural problem generation."""
    digest = hashlib.sha256(f"{salt}:{split}:{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest, "big"))


def sample_split(draw: Callable[[random.Random], Problem], key: Callable[[Problem], str], split: str, n: int,
                 seed: int, test_fraction: float, validation_fraction: float, name: str) -> list[Problem]:
    """n procedurally drawn problems whose hashed key falls into `split` (rejection sampling). The
    draws of a (seed, split) are one stream, so the first k of n problems are those of n = k."""
    rng = split_rng(seed, split, name)
    out: list[Problem] = []
    tries = 0
    budget = 1000 + 200 * n
    while len(out) < n:
        tries += 1
        if tries > budget:
            raise ConfigError(f"{name}: could not draw {n} {split} problems in {budget} tries; the problem "
                              "space is too small for this split. Raise digits/steps (or max_value/count).")
        problem = draw(rng)
        if split_of(key(problem), test_fraction, validation_fraction) == split:
            out.append(dataclasses.replace(problem, meta={**problem.meta, "task": name, "split": split}))
    return out


#: a procedural split counts as exhausted once this many draws per distinct problem found add none new:
#: a problem of the split still missing then survives them with probability below e**-10
EXHAUSTED_AFTER = 10


def distinct_problems(task: Any, split: str, n: int, seed: int) -> list[Problem]:
    """Up to n distinct problems of `split` for evaluation: the first n distinct ones of
    `task.problems(split, ., seed)`, in its order (so the start of the old with-replacement draw).

    Fewer than n when the split holds fewer: all of a finite pool (`task.size`), or every problem
    a procedural stream yields before EXHAUSTED_AFTER draws per problem found bring no new one.
    Draws double until then, so the cost is at most twice the final draw."""
    check_split_args(split, n, seed)
    size = getattr(task, "size", None)
    if callable(size):  # a permutation of the pool: distinct already
        return task.problems(split, min(n, size(split)), seed)
    drawn = max(n, 64)
    while True:
        problems = task.problems(split, drawn, seed)  # a prefix-stable stream (sample_split)
        first: dict[str, int] = {}
        for i, p in enumerate(problems):
            first.setdefault(p.prompt, i)
        found = list(first.values())
        if len(found) >= n or (drawn - 1 - max(found, default=0) >= EXHAUSTED_AFTER * len(found)):
            return [problems[i] for i in found[:n]]
        drawn *= 2


# ----------------------------------------------------------------------------- rewards


def _applies(task: Any, problem: Problem) -> bool:
    return problem.meta.get("task", task.name) == task.name


def _check_batch(problems: Sequence[Problem], completions: Sequence[str]) -> None:
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions.")


def correctness_reward(task: Task) -> RewardFn:
    """1.0 for a correct completion, 0.0 otherwise, NaN for problems of another task."""

    def correctness(problems: Sequence[Problem], completions: Sequence[str]) -> np.ndarray:
        _check_batch(problems, completions)
        return np.array([float(task.is_correct(p, c)) if _applies(task, p) else np.nan
                         for p, c in zip(problems, completions)], np.float32)

    correctness.__name__ = f"{task.name}_correctness"
    return correctness


def format_reward(task: Task, value: float = 0.1) -> RewardFn:
    """`value` for a well-formed completion (answer line present and parseable), else 0.0; NaN
    for problems of another task. Summed with `correctness_reward` a correct completion scores
    1.0 + value; use `task_reward` for the max-style recipe (1.0 correct, 0.1 well-formed)."""

    def fmt(problems: Sequence[Problem], completions: Sequence[str]) -> np.ndarray:
        _check_batch(problems, completions)
        return np.array([value * task.is_well_formed(p, c) if _applies(task, p) else np.nan
                         for p, c in zip(problems, completions)], np.float32)

    fmt.__name__ = f"{task.name}_format"
    return fmt


def task_reward(task: Task, correct: float = 1.0, well_formed: float = 0.1) -> RewardFn:
    """The usual single reward (TinyZero's Countdown recipe): `correct` for a correct completion,
    `well_formed` for a well-formed wrong one, 0.0 otherwise; NaN for problems of another task."""

    def score(problems: Sequence[Problem], completions: Sequence[str]) -> np.ndarray:
        _check_batch(problems, completions)
        out = []
        for p, c in zip(problems, completions):
            if not _applies(task, p):
                out.append(np.nan)
            else:
                out.append(correct if task.is_correct(p, c) else well_formed * task.is_well_formed(p, c))
        return np.array(out, np.float32)

    score.__name__ = f"{task.name}_reward"
    return score


def overlong_penalty(length: Any, max_len: int, buffer: int, penalty: float, xp: Any = np) -> Any:
    """DAPO's soft overlong shaping: 0 up to max_len - buffer, then a linear ramp down to
    -penalty at max_len, and -penalty beyond. `xp` is numpy or jax.numpy (the on-device reward
    calls it with jax.numpy, so both sides share one formula)."""
    start = max_len - buffer
    ramp = (length - start) / max(buffer, 1)
    return 0.0 - penalty * xp.clip(ramp, 0.0, 1.0)  # 0.0 - x: no -0.0 in logs


def length_penalty(max_len: int, buffer: int | None = None, penalty: float = 1.0,
                   tokenizer: Any = None) -> RewardFn:
    """A length term in [-penalty, 0] (DAPO's overlong reward shaping).

    A completion of length L scores 0 for L <= max_len - buffer, falls linearly to -penalty at
    L = max_len, and stays -penalty above it. `buffer` defaults to max_len // 4; buffer=0 gives a
    hard step at max_len. L counts tokens when a `tokenizer` is given (text encoded without
    special tokens), else characters (the same thing for the char tokenizer). The on-device
    version is `jax_rewards.length_penalty_from_lengths`.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ConfigError(f"length_penalty: max_len must be a positive integer, got {max_len!r}.")
    buffer = max_len // 4 if buffer is None else buffer
    if isinstance(buffer, bool) or not isinstance(buffer, int) or not 0 <= buffer <= max_len:
        raise ConfigError(f"length_penalty: buffer must be an integer in [0, max_len={max_len}], got {buffer!r}.")
    if not np.isfinite(penalty) or penalty < 0:
        raise ConfigError(f"length_penalty: penalty must be a finite number >= 0, got {penalty!r}.")

    def measure(text: str) -> int:
        if tokenizer is None:
            return len(text)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def length(problems: Sequence[Problem], completions: Sequence[str]) -> np.ndarray:
        _check_batch(problems, completions)
        lengths = np.array([measure(c) for c in completions], np.float32)
        return overlong_penalty(lengths, max_len, buffer, penalty).astype(np.float32)

    length.__name__ = "length_penalty"
    return length


class CombinedReward:
    """A weighted sum of reward functions, like TRL's `reward_funcs` + `reward_weights`.

    Calling it on (problems, completions) returns (total, per_fn): total is float32 [B], the
    weighted sum with NaN (not applicable) counted as 0; per_fn maps each name to that function's
    float32 [B] scores with the NaNs kept, for logging.
    """

    def __init__(self, funcs: Sequence[RewardFn], weights: Sequence[float] | None = None,
                 names: Sequence[str] | None = None):
        funcs = list(funcs)
        if not funcs:
            raise ConfigError("CombinedReward needs at least one reward function.")
        weights = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
        names = [getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(funcs)] if names is None else list(names)
        if len(weights) != len(funcs) or len(names) != len(funcs):
            raise ConfigError(f"CombinedReward: {len(funcs)} functions but {len(weights)} weights and "
                              f"{len(names)} names; give one weight and one name per function.")
        if len(set(names)) != len(names):
            raise ConfigError(f"CombinedReward: reward names must be unique, got {names}.")
        if not all(np.isfinite(weights)):
            raise ConfigError(f"CombinedReward: weights must be finite numbers, got {weights}.")
        self.funcs, self.weights, self.names = funcs, weights, names

    def __call__(self, problems: Sequence[Problem],
                 completions: Sequence[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        _check_batch(problems, completions)
        total = np.zeros(len(completions), np.float32)
        per_fn: dict[str, np.ndarray] = {}
        for func, weight, name in zip(self.funcs, self.weights, self.names):
            scores = np.asarray(func(problems, completions), np.float32)
            if scores.shape != (len(completions),):
                raise ValueError(f"reward '{name}' returned shape {scores.shape}, expected ({len(completions)},).")
            per_fn[name] = scores
            total += np.float32(weight) * np.nan_to_num(scores, nan=0.0)
        return total, per_fn
