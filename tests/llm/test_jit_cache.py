"""JitCache: a program built once per (owner, statics), counted and cleared, its owner kept alive."""

from __future__ import annotations

import gc
import weakref

import jax.numpy as jnp

from jaxrl_hier.llm.jit_cache import JitCache


class Owner:
    scale = 2.0


def test_one_program_per_owner_and_statics_and_the_owner_kept_alive():
    cache, builds = JitCache(), []

    def build(owner, power):
        def make():
            builds.append((owner, power))
            return lambda x: owner.scale * x**power

        return make

    a, b = Owner(), Owner()
    f = cache.get(a, 2, build(a, 2))
    assert cache.get(a, 2, build(a, 2)) is f and len(builds) == 1  # built once
    assert float(f(jnp.float32(3.0))) == 18.0
    cache.get(a, 3, build(a, 3))
    cache.get(b, 2, build(b, 2))
    assert len(builds) == 3  # another statics, another owner: each its own program
    f(jnp.ones(4))  # a new shape: jit's own cache, the same program object
    assert cache.get(a, 2, build(a, 2)) is f and cache.compiled() == 2  # a(2) at two shapes; the others never ran

    # the cache holds the owner, so its id cannot be reused by a new object while its program is cached
    alive = weakref.ref(b)
    builds.clear()
    del b
    gc.collect()
    assert alive() is not None
    cache.clear()
    gc.collect()
    assert alive() is None and cache.compiled() == 0
