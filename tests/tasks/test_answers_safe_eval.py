"""Answer-line extraction and the bounded expression evaluator (pure Python, fast)."""

import pytest

from jaxrl_hier.tasks import answers_equal, canonical_number, extract_answer
from jaxrl_hier.tasks.safe_eval import MAX_DEPTH, ExpressionError, safe_eval, try_eval


@pytest.mark.parametrize("text, expected", [
    ("3*4=12\n5+12=17\n#### 17", "17"),
    ("#### 1,234", "1234"),
    ("#### -3", "-3"),
    ("#### 3.50", "3.5"),
    ("#### 3.0", "3"),
    ("#### 3.", "3"),            # a dot without digits is not a fraction
    ("####   +0042 apples", "42"),  # spaces, plus sign, leading zeros, trailing text
    ("#### -0.00", "0"),
    ("#### 12\n#### 13", "12"),  # the first marker counts
    ("####17abc", "17"),
    ("no marker 17", None),
    ("#### ", None),
    ("####\n17", None),          # only spaces may separate the marker and the number
    ("#### .5", None),
    ("#### - 5", None),
    ("##### 5", None),           # the first "####" is followed by "#"
    ("#### ,5", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_answers_equal_is_exact_decimal_equality():
    assert answers_equal("3.50", "3.5") and answers_equal("-0", "0") and answers_equal("1,000", "1000")
    assert not answers_equal("3.05", "3.5") and not answers_equal(None, "1") and not answers_equal("-3", "3")
    assert canonical_number("-0012.50") == "-12.5" and canonical_number("x") is None


def test_safe_eval_values_and_numbers():
    assert safe_eval("5+3*4") .value == 17
    assert safe_eval("(7-2)*5+3").numbers == (7, 2, 5, 3)
    assert safe_eval(" -3 - -2 ").value == -1
    assert safe_eval("12/4/3").value == 1          # left-associative, exact
    assert safe_eval("2*(3+4)-10/5").value == 12


@pytest.mark.parametrize("text, reason", [
    ("__import__('os')", "names"),
    ("x+1", "names"),
    ("(1).real", "not allowed"),     # attribute access: the '.' is rejected
    ("abs(3)", "names"),
    ("2**100", "power"),
    ("2^100", "not allowed"),
    ("9" * 40, "larger than"),
    ("99999999*99999999*99999999", "exceeds"),
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nested"),
    ("-" * (MAX_DEPTH + 1) + "1", "nested"),
    ("1+" * 200 + "1", "longer"),
    ("1.5+1", "not allowed"),
    ("6/4", "exact"),
    ("1/(2-2)", "zero"),
    ("(1+2", "missing"),
    ("1 2", "after a complete"),
    ("", "empty"),
    ("3+", "end"),
])
def test_safe_eval_rejects(text, reason):
    with pytest.raises(ExpressionError, match=reason):
        safe_eval(text)
    assert try_eval(text) is None
