"""jaxrl_hier: JAX-native reinforcement learning with the whole training loop on the accelerator."""

import os as _os

__version__ = "0.1.0"

# XLA:CPU's concurrency-optimised scheduler (jaxlib 0.10) made a deadlock more likely when
# executing some of the vmapped programs this library compiles: seen here as a permanent hang in
# block_until_ready, with idle cores, for PPO init with 3 or more vmapped seeds, and
# intermittently elsewhere. Turning it off made those hangs rarer; their cause was found later
# (issue 30): a batched LAPACK QR of the orthogonal initializer blocks on XLA:CPU's thread pool,
# and `networks.init.orthogonal` removes it. The flag stays as a second line of defence. It
# only concerns the CPU backend and must be set before JAX starts, hence here. Set JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER=1 to keep XLA's default.
_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _os.environ.get("JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER") != "1" and "concurrency_optimized_scheduler" not in _os.environ.get(
    "XLA_FLAGS", ""
):
    _os.environ["XLA_FLAGS"] = (_os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
