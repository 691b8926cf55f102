"""The rewards of an LLM-RL run, on the device from token ids or on the host from text.

Both paths compute the same weighted sum (TRL's `reward_funcs` + `reward_weights`):

    reward = reward_correct * correct + reward_format * well_formed + length

where `correct` and `well_formed` are the task's answer-line checks (1 or 0) and `length` is
DAPO's soft overlong penalty (0 up to max_new_tokens - overlong_buffer tokens, then a ramp down
to -overlong_penalty; absent when overlong_buffer is 0). The device path (`jax_fn`) runs
`jaxrl_hier.tasks.jax_rewards` inside the compiled step; the host path (`py_fn`) runs the task's
Python rewards on the decoded completions, for tasks the answer line alone cannot judge (Countdown)
and for tokenizers that do not write digits as single tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks import jax_rewards
from jaxrl_hier.tasks.base import CombinedReward, correctness_reward, format_reward, overlong_penalty


@dataclass
class RewardSpec:
    task: Any
    tokenizer: Any
    weights: dict[str, float]
    max_new_tokens: int
    overlong_buffer: int
    overlong_penalty: float
    token_spec: Any = None  # jax_rewards.AnswerTokenSpec when the device path is used
    answer_width: int = 16
    custom: Any = None  # reward_fn(problems, texts) -> [B] floats, replacing the task's rewards (host path)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.weights) + (("length",) if self.overlong_buffer else ())

    def encode_answers(self, problems: Sequence[Any]) -> np.ndarray:
        if self.token_spec is None:
            return np.zeros((len(problems), 1), np.int32)  # unused by the host path; keeps shapes static
        return jax_rewards.encode_answers(self.tokenizer, [p.answer for p in problems], self.answer_width)

    def _length(self, lengths: Any, xp: Any) -> Any:
        return overlong_penalty(lengths, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty, xp=xp)

    def jax_fn(self, tokens: jax.Array, mask: jax.Array, answer_ids: jax.Array) -> tuple[jax.Array, dict]:
        """total [B] and the parts, from token ids (traceable)."""
        r = jax_rewards.answer_rewards(tokens, mask, answer_ids, self.token_spec)
        parts = {"correct": r["correct"], "format": r["well_formed"]}
        total = self.weights["correct"] * parts["correct"] + self.weights["format"] * parts["format"]
        if self.overlong_buffer:
            parts["length"] = self._length(r["length"].astype(jnp.float32), jnp)
            total = total + parts["length"]
        return total, parts

    def py_fn(self, problems: Sequence[Any], texts: Sequence[str], lengths: np.ndarray) -> tuple[np.ndarray, dict]:
        """total [B] and the parts, from decoded text (NaN parts count as 0 in the total); `lengths`
        are the completions' token counts before EOS."""
        if self.custom is not None:
            total = np.asarray(self.custom(problems, list(texts)), np.float32)
            return total, {"custom": total}
        combined = CombinedReward([correctness_reward(self.task), format_reward(self.task, value=1.0)],
                                  [self.weights["correct"], self.weights["format"]], ["correct", "format"])
        total, parts = combined(problems, texts)
        parts = dict(parts)
        if self.overlong_buffer:  # lengths: tokens before EOS, as the device path counts them
            parts["length"] = self._length(np.asarray(lengths, np.float32), np).astype(np.float32)
            total = total + parts["length"]
        return np.asarray(total, np.float32), parts


def make_reward_spec(config: Any, task: Any, tokenizer: Any, reward_fn: Any = None) -> RewardSpec:
    """The run's rewards; the device path is refused (ConfigError) for tasks or tokenizers it cannot judge.
    `reward_fn(problems, texts)` replaces the task's rewards by any Python function (host path)."""
    spec = RewardSpec(task=task, tokenizer=tokenizer,
                      weights={"correct": float(config.reward_correct), "format": float(config.reward_format)},
                      max_new_tokens=config.max_new_tokens, overlong_buffer=int(config.overlong_buffer or 0),
                      overlong_penalty=float(config.overlong_penalty), custom=reward_fn)
    if reward_fn is not None and config.jax_rewards:
        raise ConfigError("a custom reward_fn runs on the host: set jax_rewards: false.")
    if config.jax_rewards:
        if not getattr(task, "answer_checkable_on_device", False):
            raise ConfigError(f"task {task.name!r} cannot be judged from its answer line alone; set "
                              "jax_rewards: false to use its Python rewards.")
        spec.token_spec = jax_rewards.answer_token_spec(tokenizer)
    return spec


__all__ = ["RewardSpec", "make_reward_spec"]
