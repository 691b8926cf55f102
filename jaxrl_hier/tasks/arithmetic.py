"""Procedural arithmetic: "5+3*4=" -> "#### 17", optionally with a worked solution.

Prompts stay short for tiny char-level models: the expression and "=". The completion may work
the expression out one operation per line in standard precedence (multiplications first, then
left to right), each line "a op b=c", and always ends with the answer line:

    prompt "5+3*4="   target (worked) "3*4=12\\n5+12=17\\n#### 17"   target (plain) "#### 17"

Answers can be negative ("2-9=" -> "#### -7"). A problem belongs to the test split when a hash
of its expression falls below `test_fraction`, to the validation split when it falls in the next
`validation_fraction`, else to train (`base.split_of`), so no two splits share an expression,
whatever the seeds.
"""

from __future__ import annotations

import dataclasses
import random

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import answers_equal, extract_answer
from jaxrl_hier.tasks.base import Problem, check_fractions, check_split_args, sample_split
from jaxrl_hier.tasks.safe_eval import safe_eval


def reduce_once(operands: list[int], ops: list[str]) -> tuple[str, list[int], list[str]]:
    """One operation worked out in standard precedence (the leftmost multiplication, else the
    leftmost + or -): its solution line "a op b=c" and the operands and operators left."""
    i = ops.index("*") if "*" in ops else 0
    a, op, b = operands[i], ops[i], operands[i + 1]
    c = a * b if op == "*" else a + b if op == "+" else a - b
    return f"{a}{op}{b}={c}", operands[:i] + [c] + operands[i + 2:], ops[:i] + ops[i + 1:]


def render_expression(operands: list[int], ops: list[str]) -> str:
    return "".join(f"{a}{op}" for a, op in zip(operands, ops)) + str(operands[-1])


def reductions(operands: list[int], ops: list[str]) -> list[str]:
    """The expression after each operation worked out (in `reduce_once`'s order) down to its last
    operation: `9-2+1-3` -> [`7+1-3`, `8-3`]; an expression of one operation is its own list."""
    out = []
    while len(ops) > 1:
        _, operands, ops = reduce_once(operands, ops)
        out.append(render_expression(operands, ops))
    return out or [render_expression(operands, ops)]


def worked_steps(operands: list[int], ops: list[str]) -> tuple[list[str], int]:
    """The solution lines of `operands[0] ops[0] operands[1] ...`, one operation each, in
    standard precedence, and the value. Multiplications go first (leftmost first), then + and -
    from left to right."""
    lines = []
    while ops:
        line, operands, ops = reduce_once(operands, ops)
        lines.append(line)
    return lines, operands[0]


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """Expressions of `steps` operations drawn from `operators` over operands with up to `digits`
    digits (0 to 10**digits - 1). `worked=True` puts the step-by-step solution in the SFT target."""

    operators: str = "+-*"
    digits: int = 2
    steps: int = 2
    worked: bool = False
    test_fraction: float = 0.1
    validation_fraction: float = 0.1
    name: str = "arithmetic"
    answer_checkable_on_device = True  # the answer line alone decides correctness

    def __post_init__(self):
        if not isinstance(self.operators, str) or not self.operators or set(self.operators) - set("+-*") \
                or len(set(self.operators)) != len(self.operators):
            raise ConfigError(f"arithmetic: operators must be a non-empty string of distinct characters "
                              f"from '+-*', got {self.operators!r}.")
        for key, low, high in (("digits", 1, 9), ("steps", 1, 16)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"arithmetic: {key} must be an integer in [{low}, {high}], got {value!r}.")
        if not isinstance(self.worked, bool):
            raise ConfigError(f"arithmetic: worked must be true or false, got {self.worked!r}.")
        check_fractions("arithmetic", self.test_fraction, self.validation_fraction)

    def make_problem(self, operands: list[int], ops: list[str]) -> Problem:
        """The problem for a given expression (also used by tests and demos)."""
        expression = render_expression(operands, ops)
        lines, value = worked_steps(operands, ops)
        assert value == safe_eval(expression).value  # the worked solution follows precedence
        answer = str(value)
        target = "\n".join((lines if self.worked else []) + [f"#### {answer}"])
        return Problem(prompt=f"{expression}=", answer=answer, target=target,
                       meta={"expression": expression,  # and the problem one operation closer to its answer,
                             "reduced": render_expression(*reduce_once(operands, ops)[1:]),
                             # and the expressions on the way down to its last operation
                             "reductions": " ".join(reductions(operands, ops))})

    def _draw(self, rng: random.Random) -> Problem:
        operands = [rng.randrange(10**self.digits) for _ in range(self.steps + 1)]
        ops = [rng.choice(self.operators) for _ in range(self.steps)]
        return self.make_problem(operands, ops)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """n problems of `split` ("train", "validation" or "test"), deterministic in `seed` (repeats possible)."""
        check_split_args(split, n, seed)
        return sample_split(self._draw, lambda p: f"{self.name}:{p.meta['expression']}", split, n, seed,
                            self.test_fraction, self.validation_fraction, self.name)

    def is_well_formed(self, problem: Problem, completion: str) -> bool:
        """An answer line "#### <number>" is present."""
        return extract_answer(completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """The answer line's number equals the answer (worked lines are not checked)."""
        return answers_equal(extract_answer(completion), problem.answer)

    def steps_correct(self, problem: Problem, steps: list[str]) -> list[bool]:
        """Process labels: for each prefix of the solution `steps` (its lines, in order), whether every
        line so far is right. A worked line is right when it equals the worked solution's line at that
        place (`worked_steps`: the leftmost multiplication, else the leftmost operation); the answer
        line when its number equals the answer. A line past the worked solution's end is wrong."""
        reference = [line for line in problem.target.split("\n") if not line.startswith("####")]
        out, ok = [], True
        for i, line in enumerate(s.strip() for s in steps):
            if line.startswith("####"):
                ok = ok and answers_equal(extract_answer(line), problem.answer)
            else:
                ok = ok and i < len(reference) and line.replace(" ", "") == reference[i].replace(" ", "")
            out.append(ok)
        return out
