"""Numeric answer extraction shared by every task: the answer line `#### <number>`.

The grammar is deliberately small, so that the on-device rewards in `jax_rewards.py` implement
exactly the same rule on token ids (a test checks the two agree):

    text   := anything "####" " "* sign? int frac? rest
    sign   := "-" | "+"
    int    := digit (digit | ",")*          commas are ignored ("1,234" is 1234)
    frac   := "." digit+                    "3.50" equals "3.5"; "3." is just 3
    rest   := anything (ignored: "#### 17 apples" answers 17)

Only the FIRST "####" counts. Only spaces (not newlines or tabs) may sit between the marker and
the number. Numbers compare exactly as decimals: leading zeros, trailing fractional zeros and the
sign of zero do not matter ("-0" == "0", "007" == "7").
"""

from __future__ import annotations

import re

MARKER = "####"

_NUMBER = re.compile(r" *([-+]?)(\d[\d,]*)(?:\.(\d+))?")


def canonical_number(text: str) -> str | None:
    """The canonical form of a number at the start of `text` (after optional spaces), or None.

    Canonical: no sign for zero or positive numbers, no commas, no leading zeros in the integer
    part, no trailing zeros in the fraction, no "." without a fraction: "-0012.50" -> "-12.5".
    Trailing text after the number is ignored.
    """
    match = _NUMBER.match(text)
    if match is None:
        return None
    sign, whole, frac = match.group(1), match.group(2), match.group(3) or ""
    whole = whole.replace(",", "").lstrip("0") or "0"
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    return "-" + body if sign == "-" and body != "0" else body


def extract_answer(text: str) -> str | None:
    """The canonical number on the answer line (after the first "####"), or None if there is none.

    >>> extract_answer("3*4=12\\n5+12=17\\n#### 17")
    '17'
    >>> extract_answer("#### 1,234 dollars"), extract_answer("####  -3.50"), extract_answer("17")
    ('1234', '-3.5', None)
    """
    at = text.find(MARKER)
    if at < 0:
        return None
    return canonical_number(text[at + len(MARKER):])


def answers_equal(predicted: str | None, answer: str) -> bool:
    """Whether an extracted answer equals a reference answer (both compared as exact decimals)."""
    if predicted is None:
        return False
    reference = canonical_number(answer)
    return reference is not None and canonical_number(predicted) == reference
