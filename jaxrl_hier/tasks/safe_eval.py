"""A small, bounded recursive-descent parser and evaluator for integer arithmetic (never `eval`).

Grammar (whitespace between tokens is ignored):

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := "-" unary | atom
    atom   := integer | "(" expr ")"

Everything else is rejected with an `ExpressionError` naming the problem: names, attribute
access, calls, `**` and `^` (so no huge exponents), floats, and expressions that are too long,
nested too deep, or hold numbers beyond `max_abs`. Arithmetic is exact on Python ints; division
must be exact ("6/4" is an error, as is division by zero), as Countdown's rules require.
"""

from __future__ import annotations

import dataclasses
import re

MAX_LENGTH = 256
MAX_DEPTH = 32
MAX_ABS = 10**15

_TOKEN = re.compile(r"\s*(?:(\d+)|(.))", re.S)


class ExpressionError(ValueError):
    """The text is not a valid bounded integer expression; the message says why."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The exact value of an expression and the integer literals it used, in order."""

    value: int
    numbers: tuple[int, ...]


def _tokenize(text: str, max_abs: int) -> list[str | int]:
    tokens: list[str | int] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        digits, char = match.group(1), match.group(2)
        if digits is not None:
            if len(digits) > len(str(max_abs)) or int(digits) > max_abs:
                raise ExpressionError(f"number {digits[:20]} is larger than {max_abs}")
            tokens.append(int(digits))
        elif char in "+-*/()":
            if char == "*" and tokens and tokens[-1] == "*":
                raise ExpressionError("'**' (power) is not allowed")
            tokens.append(char)
        elif char.isalpha() or char == "_":
            raise ExpressionError(f"names are not allowed (found {char!r} at {match.start(2)})")
        else:
            raise ExpressionError(f"character {char!r} at {match.start(2)} is not allowed; "
                                  "only integers, + - * / and parentheses")
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str | int], max_depth: int, max_abs: int):
        self.tokens, self.pos, self.depth = tokens, 0, 0
        self.max_depth, self.max_abs = max_depth, max_abs
        self.numbers: list[int] = []

    def peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | int | None:
        token = self.peek()
        self.pos += 1
        return token

    def check(self, value: int) -> int:
        if abs(value) > self.max_abs:
            raise ExpressionError(f"intermediate value exceeds {self.max_abs}")
        return value

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = self.check(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> int:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value = self.check(value * rhs)
            elif rhs == 0:
                raise ExpressionError("division by zero")
            elif value % rhs:
                raise ExpressionError(f"{value}/{rhs} is not an exact integer division")
            else:
                value = value // rhs
        return value

    def unary(self) -> int:
        self.depth += 1  # unary minus and parentheses both nest; bound the recursion
        if self.depth > self.max_depth:
            raise ExpressionError(f"expression nested deeper than {self.max_depth}")
        try:
            if self.peek() == "-":
                self.take()
                return -self.unary()
            return self.atom()
        finally:
            self.depth -= 1

    def atom(self) -> int:
        token = self.take()
        if isinstance(token, int):
            self.numbers.append(token)
            return token
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        raise ExpressionError("unexpected end of expression" if token is None else f"unexpected {token!r}")


def safe_eval(text: str, *, max_length: int = MAX_LENGTH, max_depth: int = MAX_DEPTH,
              max_abs: int = MAX_ABS) -> Evaluation:
    """Parse and evaluate `text` exactly; raise ExpressionError if it is not a valid expression.

    >>> safe_eval("(7-2)*5+3")
    Evaluation(value=28, numbers=(7, 2, 5, 3))
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expected a string, got {type(text).__name__}")
    if len(text) > max_length:
        raise ExpressionError(f"expression longer than {max_length} characters")
    tokens = _tokenize(text, max_abs)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens, max_depth, max_abs)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return Evaluation(value=value, numbers=tuple(parser.numbers))


def try_eval(text: str, **bounds: int) -> Evaluation | None:
    """`safe_eval`, or None when the text is not a valid expression."""
    try:
        return safe_eval(text, **bounds)
    except ExpressionError:
        return None
