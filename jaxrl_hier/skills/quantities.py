"""Named state quantities: the vocabulary that skill conditions (YAML, LLM proposals) are written in.

A quantity is a scalar computed in JAX from an environment state, named like `inventory.wood`,
`achievement.place_table` (0 or 1) or `floor`. Each environment family gets its own table; a skill
condition such as `inventory.wood >= 3` refers to one by name, so a proposal that names a quantity
the environment does not have is refused before anything compiles.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp

QuantityFn = Callable[[Any], Any]  # env state -> scalar


def _techtree_quantities(env: Any) -> dict[str, QuantityFn]:
    from jaxrl_hier.envs.builtin import techtree as tt

    out: dict[str, QuantityFn] = {}
    for i, item in enumerate(tt.ITEMS):
        out[f"inventory.{item}"] = lambda s, i=i: s.inventory[i]
    for i, name in enumerate(tt.ACHIEVEMENTS):
        out[f"achievement.{name}"] = lambda s, i=i: s.achievements[i]
    out["timestep"] = lambda s: s.timestep
    return out


def _craftax_quantities(env: Any) -> dict[str, QuantityFn]:
    out: dict[str, QuantityFn] = {}
    # Scalar inventory fields of either Craftax version (Classic has pickaxes by tier; the full game
    # has one pickaxe level, arrows, torches, gems, ...). Array fields (armour, potions) are summed.
    fields = _craftax_inventory_fields(env)
    for field, is_array in fields:
        if is_array:
            out[f"inventory.{field}"] = lambda s, f=field: getattr(s.inventory, f).sum()
        else:
            out[f"inventory.{field}"] = lambda s, f=field: getattr(s.inventory, f)
    for i, name in enumerate(env.achievement_names):
        out[f"achievement.{name}"] = lambda s, i=i: s.achievements[i]
    out["health"] = lambda s: s.player_health
    out["food"] = lambda s: s.player_food
    out["drink"] = lambda s: s.player_drink
    out["energy"] = lambda s: s.player_energy
    if not env.classic:
        out["floor"] = lambda s: s.player_level
        out["mana"] = lambda s: s.player_mana
        out["xp"] = lambda s: s.player_xp
    return out


def _craftax_inventory_fields(env: Any) -> list[tuple[str, bool]]:
    import dataclasses

    if env.classic:
        from craftax.craftax_classic.envs.craftax_state import Inventory
    else:
        from craftax.craftax.craftax_state import Inventory
    arrays = {"armour", "potions"}
    return [(f.name, f.name in arrays) for f in dataclasses.fields(Inventory)]


def _achievement_quantities(env: Any) -> dict[str, QuantityFn]:
    """Any env with `achievement_names` and `achievements(state)` (e.g. a user's own env)."""
    return {f"achievement.{name}": (lambda s, i=i: env.achievements(s)[i])
            for i, name in enumerate(getattr(env, "achievement_names", ()))}


def env_quantities(env: Any) -> dict[str, QuantityFn]:
    """The named quantities of `env`, in a fixed order (the order is the index used on device)."""
    from jaxrl_hier.envs.builtin.techtree import TechTree
    from jaxrl_hier.envs.craftax import CraftaxEnv

    if isinstance(env, TechTree):
        return _techtree_quantities(env)
    if isinstance(env, CraftaxEnv):
        return _craftax_quantities(env)
    return _achievement_quantities(env)


def quantity_vector(fns: tuple[QuantityFn, ...], state: Any) -> jnp.ndarray:
    """float32[len(fns)]: every quantity of one state."""
    return jnp.stack([jnp.asarray(f(state), jnp.float32) for f in fns])
