"""Does a shared VM slow a process down because of the load before it? A benchmark that runs its arms
one after another saw whichever arm came second run slower: this script tells the host's share of that
from the process's own.

Three phases, each a fresh process running a jitted 1024^3 float32 matmul in a loop, with /proc/stat's
steal ticks (time the hypervisor gave to something else while this VM wanted the CPU) read around it:

1. `sustained`: --sustained-s seconds of the loop, the rate per 5-second window;
2. `right_after`: a fresh process started as soon as the first ends, --short-s seconds;
3. `after_idle`: the same after --idle-s seconds of sleep.

If the rate falls inside phase 1 and phase 2 starts low while steal rises, the slowdown belongs to
the host, not to the process that runs second: a benchmark has to let the machine recover between
its arms (`benchmarks/llm_rl/grpo.py --cooldown-s`) and record the steal each arm met.

    python benchmarks/llm_rl/cpu_steal.py --out DIR [--sustained-s 40 --short-s 10 --idle-s 30]

Writes DIR/cpu_steal.json and DIR/cpu_steal.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LOOP = """
import json, sys, time
import jax, jax.numpy as jnp
n = 1024
a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
mm = jax.jit(lambda x: x @ x).lower(a).compile()
jax.block_until_ready(mm(a))
seconds, window = float(sys.argv[1]), 5.0
start = last = time.perf_counter(); count = 0; rates = []
while time.perf_counter() - start < seconds:
    jax.block_until_ready(mm(a)); count += 1
    now = time.perf_counter()
    if now - last >= min(window, seconds):
        rates.append(2 * n**3 * count / 1e9 / (now - last)); count = 0; last = now
print(json.dumps(rates))
"""


def phase(name: str, seconds: float) -> dict:
    from jaxrl_hier.bench import cpu_ticks, steal_fraction

    before = cpu_ticks()
    proc = subprocess.run([sys.executable, "-c", LOOP, str(seconds)], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True)
    rates = json.loads(proc.stdout.strip().splitlines()[-1])
    share = steal_fraction(before, cpu_ticks())
    stolen = "unknown (no /proc/stat)" if share is None else f"{share:.0%} of the CPUs' time"
    print(f"{name}: matmul GFLOP/s per window {[round(r) for r in rates]}, steal {stolen}", flush=True)
    return {"phase": name, "seconds": seconds, "gflop_per_s": rates, "steal_fraction": share}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sustained-s", type=float, default=40.0)
    p.add_argument("--short-s", type=float, default=10.0)
    p.add_argument("--idle-s", type=float, default=30.0)
    args = p.parse_args(argv)
    if min(args.sustained_s, args.short_s) <= 0 or args.idle_s < 0:
        print("error: --sustained-s and --short-s must be positive, --idle-s >= 0.", file=sys.stderr)
        return 2
    from jaxrl_hier.bench import device_info
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    phases = [phase("sustained", args.sustained_s), phase("right_after", args.short_s)]
    time.sleep(args.idle_s)
    phases.append(phase("after_idle", args.short_s))
    result = {"device": device_info(), "idle_s": args.idle_s, "phases": phases}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "cpu_steal.json", result)
    rows = ["| phase | seconds | 1024^3 matmul GFLOP/s per 5 s window | steal (% of CPU time) |", "|---|---:|---|---:|"]
    percent = lambda x: "n/a" if x is None else f"{100 * x:.0f}"  # noqa: E731  (None: no /proc/stat)
    rows += [f"| {r['phase']} | {r['seconds']:g} | {', '.join(f'{g:.0f}' for g in r['gflop_per_s'])} | "
             f"{percent(r['steal_fraction'])} |" for r in phases]
    atomic_write_text(args.out / "cpu_steal.md", "\n".join(rows) + f"\n\n{args.idle_s:g} s of sleep before after_idle.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
