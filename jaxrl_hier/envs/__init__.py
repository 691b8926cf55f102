"""Environments: the functional protocol, a registry by name, and vectorised wrappers."""

from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.registry import list_envs, make
from jaxrl_hier.envs.spaces import Box, Discrete
from jaxrl_hier.envs.vec import RESET_MODES, VecEnv, VecState, make_vec_env, reset_many

__all__ = ["Box", "Discrete", "Environment", "RESET_MODES", "VecEnv", "VecState", "list_envs", "make", "make_vec_env", "reset_many"]
