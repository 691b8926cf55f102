"""Comparisons of logged values that hold on any CPU and any pytest the `test` extra allows.

Two runs that should agree (a run and its resume, two processes and four devices) log the same
keys; a key may be absent or None on some rows in both (e.g. `actor/pg_loss` in a critic-only
warm-up iteration). pytest 9.2 refuses `pytest.approx(None, rel=...)`, so None is compared as None
and numbers with a tolerance for float rounding.
"""

from __future__ import annotations

import pytest


def assert_close_or_both_none(a, b, rel: float, abs: float, context=None) -> None:
    """`a` equals `b` when either is None; otherwise they agree within `rel` / `abs`."""
    if a is None or b is None:
        assert a == b, context
    else:
        assert a == pytest.approx(b, rel=rel, abs=abs), context


def assert_rows_match(got: list[dict], want: list[dict], keys, rel: float = 1e-5, abs: float = 1e-7,
                      step_key: str = "step") -> None:
    """Row by row, each of `keys` agrees (see `assert_close_or_both_none`)."""
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want):
        for key in keys:
            assert_close_or_both_none(a.get(key), b.get(key), rel, abs, (a.get(step_key), key, a.get(key), b.get(key)))
