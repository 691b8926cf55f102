"""Shared pieces of the benchmark scripts under `benchmarks/`: device and version info, the
timing of a compiled function with compile time kept apart from run time (also chained over an
env's state, with a random-action rollout to chain), and the mean and standard error of a figure
over seeds."""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable


#: the benchmark scripts' `--unroll-decode` choices -> `ModelConfig.unroll_decode` (auto: the decoder's size rule)
UNROLL_DECODE = {"auto": None, "on": True, "off": False}


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cpu_model() -> str:
    """The CPU's model name (as `lscpu` prints it: /proc/cpuinfo's "model name"), or platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# The vector extensions that decide XLA:CPU's matrix-product speed and whether bfloat16 runs natively.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_vector_flags() -> str:
    """The CPU's vector extensions among `VECTOR_FLAGS` (from /proc/cpuinfo's flags), space-separated:
    two processors with one model name ("AMD EPYC") may differ there, and their figures with them.
    "" where /proc/cpuinfo is missing."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    return " ".join(flag for flag in VECTOR_FLAGS if flag in flags)


def cpu_ticks() -> tuple[int, int, int] | None:
    """(total, idle, steal) clock ticks of all the CPUs since boot, from /proc/stat's first line (idle
    counts iowait; steal is the time the hypervisor ran something else while this VM wanted the CPU).
    None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    return sum(fields[:8]), idle, steal  # user nice system idle iowait irq softirq steal (guest is in user)


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """The fraction of all the CPUs' time spent busy (not idle, not waiting on I/O) over the next `seconds`,
    from /proc/stat; call it while this process sleeps, so what it measures is the other jobs' load.
    None where /proc/stat is missing."""
    before = cpu_ticks()
    time.sleep(seconds)
    after = cpu_ticks()
    if before is None or after is None:
        return None
    total = after[0] - before[0]
    return 0.0 if total <= 0 else 1.0 - (after[1] - before[1]) / total


def steal_fraction(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> float | None:
    """The share of the CPUs' time between two `cpu_ticks()` readings that the hypervisor took (steal).

    On a shared 2-core Intel Xeon @ 2.80GHz VM the host's other tenants took up to 40% of the CPU
    time for minutes: a 1024^3 matmul fell from 167 to 82 GFLOP/s while 39% was stolen, and ran at 176 with 2% stolen half a
    minute later; in another run the steal came in other phases (`benchmarks/llm_rl/cpu_steal.py`). So a
    benchmark arm can be slowed by the machine, not by itself."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[2] - before[2]) / (after[0] - before[0])


def wait_until_unthrottled(max_wait_s: float, threshold: float = 0.05, probe_s: float = 1.0) -> tuple[float, float | None]:
    """Probe every other `probe_s` until the hypervisor steals under `threshold` of the CPUs' time, or
    `max_wait_s` has passed: (seconds waited, the last probe's steal share). A VM shows steal only while
    it runs something, so each probe spins one thread for `probe_s`."""
    start = time.perf_counter()
    share = None
    while True:
        before = cpu_ticks()
        end = time.perf_counter() + probe_s
        while time.perf_counter() < end:  # keep one core busy, so a throttled host shows it as steal
            pass
        share = steal_fraction(before, cpu_ticks())
        waited = time.perf_counter() - start
        if share is None or share < threshold or waited >= max_wait_s:
            return waited, share
        time.sleep(probe_s)


def device_info() -> dict:
    import flax
    import jax
    import optax

    dev = jax.devices()[0]
    return {"device": f"{dev.platform}:{dev.device_kind}", "cpu_model": cpu_model(), "cpu_flags": cpu_vector_flags(),
            "num_devices": jax.device_count(),
            "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "python": platform.python_version(), "machine": platform.machine(), "cpu_count": cpu_count()}


def time_compiled(fn: Callable, *args: Any, repeats: int = 3) -> tuple[float, float]:
    """(compile seconds, best steady-state seconds) of `jax.jit`-able `fn` on `args`."""
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))  # first run: allocations, thread pools
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - t0)
    return compile_s, best


def op_profile(run: Callable[[], Any], calls: int, hlo_text: str = "", top: int = 25) -> list[dict]:
    """Where a compiled program's time goes, op by op: `run()` (one call of the program, blocking)
    `calls` times under JAX's profiler, the trace's complete events' own time (less the events nested
    in them: a loop's ops are its own entries) summed by name, per call, the `top` costliest first.
    With the program's compiled HLO (`jitted.lower(...).compile().as_text()`) each op also gets its shape and the JAX operation it came from (`op_name`), so that an op such as
    `dot.153` can be traced to the code, and events that are not its ops (the runtime's host-side
    work) are left out; without it only the executor's and thread pool's wrappers are."""
    import collections
    import gzip
    import json
    import re
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        try:
            for _ in range(calls):
                run()
        finally:
            jax.profiler.stop_trace()
        traces = sorted(Path(folder).glob("plugins/profile/*/*.trace.json.gz"))
        events = []
        if traces:
            with gzip.open(traces[-1]) as f:
                events = json.load(f)["traceEvents"]
    # instruction name -> the rest of its line (result type, operands, metadata)
    instructions = dict(re.findall(r"^\s*(?:ROOT )?%?(\S+) = (.*)$", hlo_text, re.M))
    total, count = collections.Counter(), collections.Counter()
    for e, self_us in _self_times([e for e in events if e.get("ph") == "X" and e.get("name")]):
        name = e["name"]
        if not any(w in name for w in ("ThunkExecutor", "$", "ThreadPool", "Await")):
            total[name] += self_us
            count[name] += 1
    out = []
    for name, us in total.most_common():
        line = instructions.get(name)
        if hlo_text and line is None:  # not an op of the program: the runtime's host-side work
            continue
        if len(out) == top:
            break
        op = re.search(r'op_name="([^"]*)"', line) if line else None
        out.append({"op": name, "ms_per_call": us / 1e3 / calls, "runs_per_call": count[name] / calls,
                    "shape": _result_type(line) if line else None, "op_name": op.group(1) if op else None})
    return out


def _self_times(events: list[dict]) -> list[tuple[dict, float]]:
    """Each complete event with its own time: its duration less that of the events nested in it on
    its thread (a loop's or a branch's event holds the ops it ran)."""
    out = []
    by_thread: dict = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for evs in by_thread.values():
        stack: list[list] = []  # [event, end, own time]
        for e in sorted(evs, key=lambda e: (e["ts"], -e.get("dur", 0))):
            while stack and e["ts"] >= stack[-1][1]:
                out.append((stack[-1][0], stack.pop()[2]))
            if stack:
                stack[-1][2] -= e.get("dur", 0)
            stack.append([e, e["ts"] + e.get("dur", 0), e.get("dur", 0)])
        out += [(entry[0], entry[2]) for entry in stack]
    return out


def _result_type(instruction: str) -> str:
    """The result type at the start of an HLO instruction's right-hand side (a tuple whole)."""
    if not instruction.startswith("("):
        return instruction.split(" ")[0]
    depth = 0
    for i, ch in enumerate(instruction):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return instruction[:i + 1]
    return instruction


def timed_chained(fn, key, vstate, warmup_calls: int, repeats: int = 2):
    """Like `time_compiled`, but each call continues from the env state the previous one returned.

    `fn(key, vstate) -> (vstate, total_reward, episodes)`. The first `warmup_calls` calls are
    not timed: starting from a fresh reset almost no episode ends (Craftax random-policy
    episodes last 140-390 steps), so without warm-up the reset schemes' refills never run.
    Returns (compile s, best call s, episodes that ended in the timed calls).
    """
    import jax

    t0 = time.perf_counter()
    compiled = fn.lower(key, vstate).compile()
    compile_s = time.perf_counter() - t0
    for i in range(max(warmup_calls, 1)):  # at least one un-timed call (first-run overheads)
        vstate, _, _ = jax.block_until_ready(compiled(jax.random.fold_in(key, i), vstate))
    best, episodes = math.inf, 0
    for i in range(repeats):
        t0 = time.perf_counter()
        vstate, _, eps = jax.block_until_ready(compiled(jax.random.fold_in(key, 10_000 + i), vstate))
        best = min(best, time.perf_counter() - t0)
        episodes += int(eps)
    return compile_s, best, episodes


def random_rollout(vec, num_actions: int, steps: int):
    """`fn(key, vstate) -> (vstate, total reward, episodes ended)`: `steps` steps of uniformly random
    actions through the vectorised env `vec`, one scan (with `timed_chained`, calls continue the
    worlds the previous one left, so a timed call pays the resets of episodes that end, not a fresh
    reset of every env)."""
    import jax
    import jax.numpy as jnp

    def rollout(key, vstate):
        def body(carry, k):
            vstate, total, episodes = carry
            k_act, k_env = jax.random.split(k)
            action = jax.random.randint(k_act, (vec.num_envs,), 0, num_actions)
            _, vstate, reward, terminated, truncated, info = vec.step(k_env, vstate, action)
            # Episodes that ended (with reset_mode "none" a dead env counts again every step).
            ended = info["returned_episode"].sum(dtype=jnp.int32)
            return (vstate, total + reward.sum(), episodes + ended), None

        init = (vstate, jnp.float32(0), jnp.int32(0))
        (vstate, total, episodes), _ = jax.lax.scan(body, init, jax.random.split(key, steps))
        return vstate, total, episodes

    return rollout


def mean_se(xs: list[float | None]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) of the values that are not None; the error is None for
    fewer than two values, both for none."""
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def fmt_mean_se(mean: float | None, se: float | None, pct: bool = True, digits: int = 1) -> str:
    """"12.3 ± 1.4" (x100 with `pct`; `digits` after the point), "n/a" without a mean."""
    if mean is None:
        return "n/a"
    scale = 100 if pct else 1
    return f"{mean * scale:.{digits}f}" + ("" if se is None else f" ± {se * scale:.{digits}f}")


def seed_sweep_error(config: Any, seeds: list[int]) -> str | None:
    """What is wrong with a sweep's --config and --seeds (None: nothing), for its exit-2 message."""
    if not Path(config).is_file():
        return f"--config {config} is not a file"
    if len(set(seeds)) < 2:
        return "--seeds needs two or more distinct seeds (a spread over seeds is the point)"
    return None


def run_logged(cmd: list[str], log: Path, cwd: Path) -> None:
    """One step of a sweep in its own process (its memory goes with it), its output in `log`; exits the
    sweep with the command and the log's path when the step fails."""
    import subprocess

    t0 = time.perf_counter()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        code = subprocess.call(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    print(f"  {' '.join(cmd[1:4])} ... -> {code} in {time.perf_counter() - t0:.0f} s ({log})", flush=True)
    if code:
        raise SystemExit(f"error: {' '.join(cmd)} exited {code}; see {log}")


def train_run(config: Path, out: Path, overrides: list[str], log: Path, cwd: Path) -> None:
    """`python -m jaxrl_hier.train --config CONFIG OVERRIDES` in `out`, resumed where a killed sweep left
    it (`--resume`, which keeps the recorded config), skipped once the run has saved its model."""
    import sys

    if (out / "model" / "model.safetensors").is_file():
        return
    start = ["--resume"] if (out / "config.yaml").is_file() else ["--config", str(config), *overrides]
    run_logged([sys.executable, "-m", "jaxrl_hier.train", *start, "--output-dir", str(out), "--no-progress"],
               log, cwd)
