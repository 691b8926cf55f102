"""Reductions over the mapped axes a function is traced under (vmap's `axis_name`, shard_map's mesh axes).

A `lax.cond` or `lax.switch` whose predicate is batched under `vmap` runs every branch and selects.
Reducing the predicate over the mapped axes makes it one value for every instance, so the branch
stays a real branch: every instance takes the branch that some instance needs.
"""

from __future__ import annotations

import jax


def bound(axis: str) -> bool:
    """Whether the caller is traced under a mapped axis of that name."""
    try:
        jax.lax.axis_size(axis)
    except NameError:
        return False
    return True


def max_over_axes(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """`x`'s maximum over those of `axes` the caller is mapped over (the others are skipped, so one
    function serves a trainer's named vmaps and a plain call alike)."""
    for axis in axes:
        if bound(axis):
            x = jax.lax.pmax(x, axis)
    return x
