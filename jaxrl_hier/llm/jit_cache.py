"""One jitted program per (owner object, static settings): `JitCache`.

The samplers and scorers build a function closing over a model object (a language model, a reward
model) and a few static settings, then jit it. `jax.jit` caches compiled programs per function
object and input shapes, so the jitted function must be built once and kept. Keyed by the owner's
`id`, the cache also holds the owner itself: a freed object's id can be reused by a new one, which
would otherwise receive the old object's program.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import jax


class JitCache:
    def __init__(self) -> None:
        self._programs: dict[tuple[int, Hashable], tuple[Any, Any]] = {}

    def get(self, owner: Any, statics: Hashable, build: Callable[[], Callable]) -> Any:
        """The jitted `build()` for this owner and these statics, built on the first call."""
        key = (id(owner), statics)
        if key not in self._programs:
            self._programs[key] = (owner, jax.jit(build()))
        return self._programs[key][1]

    def compiled(self) -> int:
        """How many programs XLA has compiled through this cache (for recompilation checks)."""
        return int(sum(f._cache_size() for _, f in self._programs.values()))

    def clear(self) -> None:
        """Drop the programs and the owners they keep alive."""
        self._programs.clear()
