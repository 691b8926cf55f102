"""Environments by name: `make(name) -> (env, params)`."""

from __future__ import annotations

from typing import Any, Callable

from jaxrl_hier.config import ConfigError, closest
from jaxrl_hier.envs.base import Environment


def _builtin() -> dict[str, Callable[[], Environment]]:
    from jaxrl_hier.envs.builtin.cartpole import CartPole
    from jaxrl_hier.envs.builtin.memory import MemoryCue
    from jaxrl_hier.envs.builtin.techtree import TechTree

    return {"CartPole-v1": CartPole, "TechTree-v0": TechTree, "MemoryCue-v0": MemoryCue}


def list_envs() -> list[str]:
    """Every name `make` accepts (gymnax ones when gymnax is installed)."""
    from jaxrl_hier.envs.craftax import CRAFTAX_NAMES
    from jaxrl_hier.envs.gymnax_adapter import gymnax_names

    return [*CRAFTAX_NAMES, *_builtin(), *gymnax_names()]


def make(name: str, **kwargs: Any) -> tuple[Environment, Any]:
    """The environment called `name` and its default params.

    Names: the four Craftax variants (e.g. `Craftax-Symbolic-v1`), the built-in pure-JAX envs
    (`CartPole-v1`, `TechTree-v0`, `MemoryCue-v0`), and any gymnax env as `gymnax:<name>`. Keyword arguments
    override fields of the default params of built-in envs.
    """
    from jaxrl_hier.envs.craftax import CRAFTAX_NAMES, CraftaxEnv

    if name.startswith("gymnax:"):
        from jaxrl_hier.envs.gymnax_adapter import GymnaxEnv

        env = GymnaxEnv(name.split(":", 1)[1])
    elif name in CRAFTAX_NAMES:
        env = CraftaxEnv(name)
    elif name in _builtin():
        env = _builtin()[name]()
    else:
        known = [*CRAFTAX_NAMES, *_builtin(), "gymnax:<name> (e.g. gymnax:CartPole-v1)"]
        raise ConfigError(f"unknown environment '{name}'.{closest(name, [*CRAFTAX_NAMES, *_builtin()])} "
                          f"Known: {', '.join(known)}.")
    params = env.default_params
    if kwargs:
        try:
            params = params.replace(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"bad parameters for {name}: {err}") from None
    return env, params
