"""The processes of a run: which one writes, a barrier between them, process 0's decision shared
with the others, and multi-host start-up.

In a multi-process JAX run every process computes (and joins Orbax's saves), process 0 alone
writes the run directory's other files. jax is imported inside the functions, so that a CLI
can check its input (and exit 2) before JAX starts.
"""

from __future__ import annotations

import os
from typing import Any

from jaxrl_hier.config import ConfigError


def is_primary() -> bool:
    """Process 0 writes the run's files; the others only compute (and join Orbax's saves)."""
    import jax

    return jax.process_index() == 0


def sync_processes(name: str) -> None:
    """A barrier across processes (no-op with one): nobody writes before every process has checked."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def from_primary(value: bool) -> bool:
    """Process 0's `value` on every process, for a branch that every process must take alike (one
    into a collective computation, decided from a file that process 0 alone reads)."""
    import jax

    if jax.process_count() == 1:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.bool_(value)))


def init_distributed() -> None:
    """jax.distributed.initialize() with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID
    when set (JAX itself reads only the first); unset ones are left to its cluster detection
    (SLURM, Open MPI, TPU pods). CPU processes talk through gloo, JAX's default CPU collectives."""
    import jax

    kwargs: dict[str, Any] = {}
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        kwargs["coordinator_address"] = os.environ["JAX_COORDINATOR_ADDRESS"]
    for var, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
        if os.environ.get(var):
            try:
                kwargs[key] = int(os.environ[var])
            except ValueError:
                raise ConfigError(f"{var} must be an integer, got {os.environ[var]!r}.") from None
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as err:  # nothing set and no cluster detected
        raise ConfigError(f"--distributed: {err} Set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                          "JAX_PROCESS_ID, or run under SLURM/MPI.") from None
