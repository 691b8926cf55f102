"""Countdown: combine the given numbers with + - * / and parentheses to hit a target.

    prompt     "make 28 from 7 2 5 3:"
    completion "(7-2)*5+3\\n#### 28"

The text before the answer line is the expression. A completion is well formed when that
expression parses (`safe_eval`: integers, + - * /, parentheses, exact division only) and uses
only the given numbers, each at most once, and the answer line holds a number. It is correct
when, on top of that, the expression equals the target and so does the answer line. Targets are
reachable by construction: the generator combines all the numbers (positive intermediates,
exact division), so the SFT target always uses every number once.

The answer line alone does not decide correctness here, so the on-device rewards
(`jax_rewards`) are not enough for Countdown: use the Python rewards.
"""

from __future__ import annotations

import collections
import dataclasses
import random

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import MARKER, answers_equal, extract_answer
from jaxrl_hier.tasks.base import Problem, check_fractions, check_split_args, sample_split
from jaxrl_hier.tasks.safe_eval import Evaluation, safe_eval, try_eval

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


def _combine(a: tuple[int, str, int], op: str, b: tuple[int, str, int]) -> tuple[int, str, int] | None:
    """(value, text, precedence) of `a op b` with only the parentheses precedence needs, or None
    when the step breaks the rules (a non-positive result or an inexact division)."""
    (va, ta, pa), (vb, tb, pb) = a, b
    if op == "/":
        if vb == 0 or va % vb:
            return None
        value = va // vb
    else:
        value = va + vb if op == "+" else va - vb if op == "-" else va * vb
    if value <= 0:
        return None
    prec = _PREC[op]
    left = f"({ta})" if pa < prec else ta
    right = f"({tb})" if pb < prec or (pb == prec and op in "-/") else tb
    return value, f"{left}{op}{right}", prec


@dataclasses.dataclass(frozen=True)
class CountdownTask:
    """`count` numbers in [1, max_value] and a target in [1, max_target] reachable with all of them."""

    count: int = 4
    max_value: int = 20
    max_target: int = 100
    test_fraction: float = 0.1
    validation_fraction: float = 0.1
    name: str = "countdown"
    answer_checkable_on_device = False  # the expression must be checked too

    def __post_init__(self):
        for key, low, high in (("count", 2, 8), ("max_value", 1, 10**6), ("max_target", 1, 10**9)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"countdown: {key} must be an integer in [{low}, {high}], got {value!r}.")
        check_fractions("countdown", self.test_fraction, self.validation_fraction)

    def make_problem(self, numbers: list[int], target: int, expression: str) -> Problem:
        """The problem for given numbers, target and a solving expression."""
        prompt = f"make {target} from {' '.join(map(str, numbers))}:"
        return Problem(prompt=prompt, answer=str(target), target=f"{expression}\n{MARKER} {target}",
                       meta={"numbers": tuple(numbers), "target": target})

    def _draw(self, rng: random.Random) -> Problem:
        for _ in range(1000):
            numbers = [rng.randint(1, self.max_value) for _ in range(self.count)]
            items = [(v, str(v), _ATOM) for v in numbers]
            while len(items) > 1:
                i, j = rng.sample(range(len(items)), 2)
                # try the operators in a random order; + always works on positive numbers
                for op in rng.sample("+-*/", 4):
                    merged = _combine(items[i], op, items[j])
                    if merged is not None:
                        break
                items = [x for k, x in enumerate(items) if k not in (i, j)] + [merged]
            target, expression, _ = items[0]
            if target <= self.max_target:
                assert safe_eval(expression).value == target
                return self.make_problem(numbers, target, expression)
        raise ConfigError(f"countdown: no target <= max_target={self.max_target} found in 1000 draws; "
                          "raise max_target or lower max_value/count.")

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """n problems of `split`, deterministic in `seed`; the split is a hash of the sorted numbers
        and the target, so no two splits share a puzzle."""
        check_split_args(split, n, seed)
        key = lambda p: f"{self.name}:{sorted(p.meta['numbers'])}:{p.meta['target']}"  # noqa: E731
        return sample_split(self._draw, key, split, n, seed, self.test_fraction, self.validation_fraction, self.name)

    def check_expression(self, problem: Problem, completion: str) -> Evaluation | None:
        """The evaluated expression before the answer line, or None when it does not parse or uses
        a number that was not given (or more often than given)."""
        at = completion.find(MARKER)
        evaluation = try_eval(completion[:at] if at >= 0 else completion)
        if evaluation is None:
            return None
        used, given = collections.Counter(evaluation.numbers), collections.Counter(problem.meta["numbers"])
        return evaluation if all(used[k] <= given[k] for k in used) else None

    def is_well_formed(self, problem: Problem, completion: str) -> bool:
        """A valid expression over the given numbers, then an answer line with a number."""
        return extract_answer(completion) is not None and self.check_expression(problem, completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Well formed, the expression equals the target, and so does the answer line."""
        evaluation = self.check_expression(problem, completion)
        return (evaluation is not None and evaluation.value == problem.meta["target"]
                and answers_equal(extract_answer(completion), problem.answer))
