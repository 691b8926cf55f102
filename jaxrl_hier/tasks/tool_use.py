"""A calculator tool for answer-line tasks, as a turn-based environment of the guided trainer.

Each turn the actor writes either a call, `calc <expression>`, which the safe evaluator
(`tasks.safe_eval`, exact integers, no Python `eval`) answers by appending `= <value>` (or
`= error`) to the state, or its answer line (`#### <number>`), which ends the episode with reward 1
if it is correct and 0 otherwise. At most `max_calls` calls: the turn after them is the answer
whatever it says. The state is the problem's prompt followed by one line per call,
`calc 8-4 = 4\n` (a new line first after a prompt that has none, `8-4=`); the environment's text is never an action, so it is outside the policy loss (the
trainer scores utterances only). The host evaluates the calls, so episodes play the per-turn host
loop (`turn_loop: host` or `auto`).

Warm-start (`sft_problems`): the rule calls the calculator on the problem's own computations (an
arithmetic problem: its whole expression; a GSM8K-format problem: its `<<expr=value>>`
annotations in order, `meta["calls"]`), then answers with the last result; with probability
`direct_fraction` it answers at once instead, without a call, so the warm-start both calls and
answers unaided and reinforcement learning can find which pays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import MARKER, extract_answer
from jaxrl_hier.tasks.base import Problem, check_split_args, distinct_problems, split_rng
from jaxrl_hier.tasks.safe_eval import MAX_ABS, try_eval
from jaxrl_hier.tasks.text_games import ACTOR

CALL = "calc "
RESULT_CHARS = max(len(str(-MAX_ABS)), len("error"))  # the longest text the calculator appends


@dataclasses.dataclass
class ToolEpisode:
    problem: Problem
    calls: list = dataclasses.field(default_factory=list)    # the expressions called
    results: list = dataclasses.field(default_factory=list)  # their values as text, or "error"
    answer: str = ""
    turn: int = 0
    done: bool = False
    reward: float = 0.0


def parse_call(utterance: str) -> str | None:
    """The expression of a calculator call (`calc <expression>` on one line), or None for anything else."""
    text = utterance.strip()
    if not text.startswith(CALL) or "\n" in text:
        return None
    return text[len(CALL):].strip() or None


def evaluate_call(expression: str) -> str:
    """What the calculator appends for an expression: its exact value, or "error"."""
    value = try_eval(expression)
    return "error" if value is None else str(value.value)


def rule_calls(problem: Problem) -> list[str]:
    """The computations the warm-start's rule hands the calculator (module docstring)."""
    calls = problem.meta.get("calls") or ([problem.meta["expression"]] if "expression" in problem.meta else [])
    if not calls:
        raise ConfigError(f"the calculator's warm-start needs the task's computations (arithmetic, or GSM8K-format "
                          f"answers with <<expr=value>> annotations); none for {problem.prompt!r}.")
    return list(calls)


@dataclasses.dataclass(frozen=True)
class CalculatorEnv:
    """See the module docstring. `task` is any answer-line task (`tasks.make_task`)."""

    task: Any
    max_calls: int = 2
    call_chars: int = 16        # the longest expression a call can hold (max_new_tokens - 1 - len(CALL))
    direct_fraction: float = 0.5
    name: str = "calculator"
    #: the evaluation metrics reports show, (summarize key, label), the headline first
    METRICS: ClassVar[tuple[tuple[str, str], ...]] = (("accuracy", "accuracy"),
                                                      ("call_rate", "episodes that call the calculator"))

    def __post_init__(self):
        if isinstance(self.max_calls, bool) or not isinstance(self.max_calls, int) or not 1 <= self.max_calls <= 16:
            raise ConfigError(f"calculator: max_calls must be an integer in [1, 16], got {self.max_calls!r}.")
        if not 0.0 <= self.direct_fraction <= 1.0:
            raise ConfigError(f"calculator: direct_fraction must be in [0, 1], got {self.direct_fraction!r}.")

    @property
    def max_turns(self) -> int:
        return self.max_calls + 1

    def speaker(self, turn: int) -> str:
        return ACTOR

    def evaluation_label(self, split: str) -> str:
        return f"{split} problems"

    def reset(self, split: str, n: int, seed: int) -> list[ToolEpisode]:
        return [ToolEpisode(p) for p in self.task.problems(split, n, seed)]

    def evaluation_episodes(self, split: str, n: int, seed: int) -> list[ToolEpisode]:
        """Episodes of up to n distinct problems (`distinct_problems`)."""
        return [ToolEpisode(p) for p in distinct_problems(self.task, split, n, seed)]

    def render(self, prompt: str, calls: Sequence[str], results: Sequence[str]) -> str:
        """The prompt, then a line per call (on a new line after a prompt without one: `8-4=`)."""
        lines = "".join(f"{CALL}{c} = {r}\n" for c, r in zip(calls, results))
        return prompt + ("\n" if lines and not prompt.endswith("\n") else "") + lines

    def observation(self, ep: ToolEpisode) -> str:
        return self.render(ep.problem.prompt, ep.calls, ep.results)

    def max_state_chars(self, prompt_chars: int = 0, utterance_chars: int = 0) -> int:
        """The longest state for prompts of `prompt_chars` characters (a call's text is cut to `call_chars`
        whatever the utterance's length)."""
        return prompt_chars + 1 + self.max_calls * (len(CALL) + self.call_chars + len(" = ") + RESULT_CHARS + 1)

    def step(self, ep: ToolEpisode, utterance: str) -> tuple[ToolEpisode, float, bool]:
        ep = dataclasses.replace(ep, calls=list(ep.calls), results=list(ep.results))
        ep.turn += 1
        expression = parse_call(utterance)
        if expression is not None and len(ep.calls) < self.max_calls:
            ep.calls.append(expression)
            ep.results.append(evaluate_call(expression))
            return ep, 0.0, False
        ep.answer, ep.done = utterance, True
        ep.reward = float(self.task.is_correct(ep.problem, utterance))
        return ep, ep.reward, True

    def sft_problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Warm-start examples: the rule's game (module docstring) cut at a random turn, and the rule's
        next utterance (a call, or the answer line) as the target."""
        check_split_args(split, n, seed)
        rng = split_rng(seed, split, f"{self.name}:sft")
        out = []
        for p in self.task.problems(split, n, seed):
            answer = f"{MARKER} {p.answer}"
            if rng.random() < self.direct_fraction:
                out.append(Problem(p.prompt, p.answer, answer, {**p.meta, "kind": "answer", "calls_made": []}))
                continue
            calls = rule_calls(p)[:self.max_calls]
            cut = rng.randint(0, len(calls))
            results = [evaluate_call(c) for c in calls[:cut]]
            target = f"{CALL}{calls[cut]}" if cut < len(calls) else answer
            out.append(Problem(self.render(p.prompt, calls[:cut], results), p.answer, target,
                               {**p.meta, "kind": "call" if cut < len(calls) else "answer", "calls_made": calls[:cut]}))
        return out

    def sft_correct(self, problem: Problem, completion: str) -> bool:
        """A call whose value is the rule's call's, or a correct answer line."""
        if problem.meta["kind"] == "call":
            said, want = try_eval(parse_call(completion) or ""), try_eval(parse_call(problem.target) or "")
            return said is not None and want is not None and said.value == want.value
        return bool(self.task.is_correct(problem, completion))

    def sft_well_formed(self, problem: Problem, completion: str) -> bool:
        """A call of a valid expression, or an answer line."""
        expression = parse_call(completion)
        return (try_eval(expression) is not None) if expression is not None else extract_answer(completion) is not None

    def summarize(self, episodes: Sequence[ToolEpisode]) -> dict[str, float]:
        """Accuracy, the share of episodes that called the calculator, calls per episode, the share of
        calls the evaluator refused, and the return."""
        n = max(len(episodes), 1)
        calls = sum(len(e.calls) for e in episodes)
        return {"accuracy": sum(e.reward for e in episodes) / n,
                "call_rate": sum(bool(e.calls) for e in episodes) / n, "calls": calls / n,
                "call_errors": sum(r == "error" for e in episodes for r in e.results) / max(calls, 1),
                "return": sum(e.reward for e in episodes) / n}

    def record(self, ep: ToolEpisode) -> dict[str, Any]:
        return {"problem": ep.problem.prompt, "answer": ep.problem.answer, "calls": ep.calls, "results": ep.results,
                "said": ep.answer, "reward": ep.reward}


__all__ = ["CALL", "CalculatorEnv", "ToolEpisode", "evaluate_call", "parse_call", "rule_calls"]
