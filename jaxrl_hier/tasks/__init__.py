"""Text tasks with verifiable rewards, and a tiny offline character tokenizer.

Tasks (`make_task(name, **kwargs)`, or `task_from_config(config)` from a run config's `task*` keys): procedural arithmetic, Countdown, and GSM8K-format JSONL.
Every completion ends with the answer line "#### <answer>" (`extract_answer`). Rewards come as
Python functions over (problems, completions) combined with `CombinedReward`, and as pure
jax.numpy functions over token ids (`jaxrl_hier.tasks.jax_rewards`) for compiled training steps.
See docs/tasks.md.
"""

from jaxrl_hier.tasks.answers import MARKER, answers_equal, canonical_number, extract_answer
from jaxrl_hier.tasks.arithmetic import ArithmeticTask
from jaxrl_hier.tasks.base import (CombinedReward, Problem, RewardFn, Task, correctness_reward, format_reward,
                                   length_penalty, task_reward)
from jaxrl_hier.tasks.countdown import CountdownTask
from jaxrl_hier.tasks.gsm8k import GSM8KTask, load_gsm8k_jsonl
from jaxrl_hier.tasks.registry import make_task, task_from_config
from jaxrl_hier.tasks.safe_eval import Evaluation, ExpressionError, safe_eval
from jaxrl_hier.tasks.tokenizer import DEFAULT_CHARS, build_char_tokenizer, save_tokenizer

__all__ = [
    "ArithmeticTask", "CombinedReward", "CountdownTask", "DEFAULT_CHARS", "Evaluation", "ExpressionError",
    "GSM8KTask", "MARKER", "Problem", "RewardFn", "Task", "answers_equal", "build_char_tokenizer",
    "canonical_number", "correctness_reward", "extract_answer", "format_reward", "length_penalty",
    "load_gsm8k_jsonl", "make_task", "safe_eval", "save_tokenizer", "task_from_config", "task_reward",
]
