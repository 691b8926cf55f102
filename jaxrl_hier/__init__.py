"""jaxrl_hier: JAX-native reinforcement learning with the whole training loop on the accelerator."""

import os as _os

__version__ = "0.1.0"

# With jaxlib 0.10.2, a batched LAPACK QR (the orthogonal initializer under `vmap`: seeds of
# `make_train`, slots of a skills trainer) splits its batch over XLA:CPU's intra-op thread pool and
# blocks until the pieces finish; once as many such calls run concurrently as the pool has threads,
# no thread is left to run the pieces and the program hangs in block_until_ready with idle cores.
# `networks.init.orthogonal` removes the cause (one matrix per LAPACK call, see that module). XLA:CPU's
# concurrency-optimised scheduler runs more independent ops at once, which made the hang more likely
# (PPO init with 3 or more vmapped seeds hung; with the scheduler off, rarely), so it stays off here
# as a second line of defence. The flag only concerns the CPU backend and must be set before JAX starts, hence
# here. Set JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER=1 to keep XLA's default.
_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _os.environ.get("JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER") != "1" and "concurrency_optimized_scheduler" not in _os.environ.get(
    "XLA_FLAGS", ""
):
    _os.environ["XLA_FLAGS"] = (_os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
