"""Orbax checkpoints with metadata checks."""

from jaxrl_hier.checkpointing.checkpoints import Checkpointer, CheckpointError, abstract_like

__all__ = ["Checkpointer", "CheckpointError", "abstract_like"]
