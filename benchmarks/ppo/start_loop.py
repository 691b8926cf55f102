"""Start an entry point many times, each with a timeout, and count hangs (the XLA:CPU deadlock of a
vmapped LAPACK QR: `jaxrl_hier/networks/init.py`).

A start that hangs sits at ~0% CPU, so each child is also sampled: a start that passes its timeout
is reported as a hang together with its last CPU reading, and the children of a hang get a Python
stack dump (faulthandler on SIGUSR1... here: `faulthandler.dump_traceback_later`) written beside
the results so the stuck frame is known.

    python benchmarks/ppo/start_loop.py --entry skills --starts 50 --timeout 300 --out benchmarks/results/cpu/start_loop.json
    python benchmarks/ppo/start_loop.py --entry ppo grpo pgts --starts 10 ...
    python benchmarks/ppo/start_loop.py --entry qr_vmap_jax qr_vmap_ours --starts 10 --timeout 300 --frozen-s 20  # the cause

Entry points, each made as small as it goes while still compiling and running one step:
- skills: `python -m jaxrl_hier.skills run` on TechTree, 2 slots, tiny PPO, max_rounds=1 (the path
  where a run hung: scheduler -> SkillTrainer.start -> init of the slots, then one compiled round);
- ppo: `python -m jaxrl_hier.train` on TechTree-v0, 3 vmapped seeds, one update;
- grpo / pgts: `configs/grpo_arithmetic.yaml` / `configs/pgts_arithmetic.yaml` with every phase cut
  to one or two steps.
Results are merged into `--out` (one entry per entry point), so entry points can be run one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxrl_hier.io import atomic_write_json  # noqa: E402

SKILLS = ["-m", "jaxrl_hier.skills", "run", "--config", "configs/skills_techtree.yaml", "--no-progress",
          "max_rounds=1", "max_parallel_skills=2", "updates_per_round=1", "min_skill_timesteps=0"]
PPO = ["-m", "jaxrl_hier.train", "--config", "configs/ppo_techtree.yaml", "--no-progress", "num_seeds=3",
       "num_envs=8", "num_steps=8", "num_minibatches=2", "update_epochs=1", "hidden_size=16", "total_timesteps=64",
       "log_every=1", "checkpoint_every=0"]
GRPO = ["-m", "jaxrl_hier.train", "--config", "configs/grpo_arithmetic.yaml", "--no-progress", "sft.steps=1",
        "sft.warmup_steps=0", "total_steps=1", "prompts_per_step=2", "num_generations=2", "eval_every=0",
        "eval_problems=8", "checkpoint_every=0", "model.hidden_size=32", "model.intermediate_size=64"]
PGTS = ["-m", "jaxrl_hier.train", "--config", "configs/pgts_arithmetic.yaml", "--no-progress", "sft.steps=1",
        "sft.warmup_steps=0", "rm_sft_steps=1", "rm_steps=1", "rm_problems=8", "rm_samples=1",
        "rm_eval_problems=8", "imitation_steps=1", "imitation_problems=8", "imitation_batch_size=8",
        "train_problems=16", "ppo.num_envs=4", "ppo.num_steps=4", "ppo.num_minibatches=1", "ppo.update_epochs=1",
        "ppo.total_timesteps=16", "eval_problems=4", "eval_every=0", "sc_samples=[2]", "mcts_simulations=2",
        "checkpoint_every=0"]
# The frame of the report's stack dump alone, as the trainer ran it before the fix: a fresh process
# (a heartbeat-like thread beside it) builds the zero rows of a frozen-expert bank from eager ops,
# Craftax-Classic shapes. `expert_init_jit` is the same work as the trainer does it now.
_EAGER = """
import threading, jax, jax.numpy as jnp, jaxrl_hier
from jaxrl_hier.skills.moe import MoEPolicy, stack_experts
threading.Thread(target=lambda e=threading.Event(): [e.wait(0.05) for _ in iter(int, 1)], daemon=True).start()
p = MoEPolicy(17, 64, 2, "tanh", 8)
for slot in range(3):
    zeros = p.init_expert(jax.random.key(0), 1345)["actor"]
    jax.block_until_ready(stack_experts([jax.tree.map(jnp.zeros_like, zeros)] * 8))
"""
_JIT = """
import threading, jax, jax.numpy as jnp, numpy as np, jaxrl_hier
from jaxrl_hier.skills.moe import MoEPolicy
threading.Thread(target=lambda e=threading.Event(): [e.wait(0.05) for _ in iter(int, 1)], daemon=True).start()
p = MoEPolicy(17, 64, 2, "tanh", 8)
shapes = jax.eval_shape(lambda: p.init_expert(jax.random.key(0), 1345))
zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)["actor"]
stack = jax.jit(lambda rows: jax.tree.map(lambda *xs: jnp.stack(xs), *rows))
for slot in range(3):
    jax.block_until_ready(stack([zeros] * 8))
"""
# The cause (networks/init.py): four layers' orthogonal inits vmapped over three slots, QR_CALLS calls
# of one jitted program (each a few milliseconds on an idle CPU).
# jax's initializer does a batched LAPACK QR per layer, which in jaxlib 0.10.2 blocks on XLA:CPU's
# intra-op pool; ours runs one matrix per QR under vmap.
QR_CALLS = 1000
_QR = """
import jax, jax.numpy as jnp, jaxrl_hier
from jaxrl_hier.networks.init import orthogonal
init = {init}
def one(k):
    ks = jax.random.split(k, 4)
    return [init(ks[i], (256, 256), jnp.float32) for i in range(4)]
f = jax.jit(lambda k: jax.vmap(one)(jax.random.split(k, 3)))
for i in range({calls}):
    jax.block_until_ready(f(jax.random.key(i)))
"""
ENTRIES = {"skills": SKILLS, "ppo": PPO, "grpo": GRPO, "pgts": PGTS, "expert_init_eager": ["-c", _EAGER],
           "expert_init_jit": ["-c", _JIT], "qr_vmap_jax": ["-c", _QR.format(init="jax.nn.initializers.orthogonal()", calls=QR_CALLS)],
           "qr_vmap_ours": ["-c", _QR.format(init="orthogonal()", calls=QR_CALLS)]}
# Skills: the PPO config of the slots is set through the config file (ppo.* is a dict field).
SKILLS_PPO = {"num_envs": 8, "num_steps": 8, "num_minibatches": 2, "update_epochs": 1, "hidden_size": 16}


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process and its reaped children (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / tick


def _skills_config(work: Path) -> Path:
    import yaml

    config = yaml.safe_load((ROOT / "configs/skills_techtree.yaml").read_text())
    config["ppo"] = {**config["ppo"], **SKILLS_PPO}
    path = work / "skills_tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def one_start(entry: str, work: Path, timeout: float, stack_dir: Path | None, index: int, frozen_s: int = 0,
              compile_cache: Path | None = None) -> dict:
    out = work / f"run{index}"
    shutil.rmtree(out, ignore_errors=True)
    args = list(ENTRIES[entry])
    if entry == "skills":
        args[args.index("configs/skills_techtree.yaml")] = str(_skills_config(work))
    args += ["--output-dir", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    if compile_cache is not None:  # jax's persistent cache: later starts load their programs instead of compiling
        env.update(JAX_COMPILATION_CACHE_DIR=str(compile_cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    log_path = work / f"run{index}.log"
    # A child alive after `timeout` gets SIGABRT: faulthandler (PYTHONFAULTHANDLER) prints every
    # thread's Python stack to its stderr, which is kept as the hang's evidence.
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        cpu_at = []
        frozen = False
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            time.sleep(1.0)
            cpu_at.append(_cpu_seconds(proc.pid))
            # A deadlock parks every thread: no CPU time for `frozen_s` seconds (a slow start still works)
            recent = [c for c in cpu_at[-(frozen_s + 1):] if c is not None]
            if frozen_s and len(recent) > frozen_s and recent[-1] - recent[0] < 0.05:
                frozen = True
                break
        hung = proc.poll() is None
        cpu_last_30s = None
        if hung:
            recent = [c for c in cpu_at[-31:] if c is not None]
            cpu_last_30s = round(recent[-1] - recent[0], 2) if len(recent) > 1 else None
            proc.send_signal(6)  # SIGABRT: faulthandler dumps the stacks
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - t0
    text = log_path.read_text(errors="replace")
    if hung and stack_dir is not None:
        stack_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, stack_dir / f"{entry}_hang_{index}.log")
    shutil.rmtree(out, ignore_errors=True)
    result = {"index": index, "wall_s": round(wall, 1), "hung": hung, "returncode": None if hung else proc.returncode}
    if compile_cache is not None:
        result["compile_cache"] = True
    if hung:
        result["cpu_s_last_30s"] = cpu_last_30s
        result["frozen"] = frozen  # True: every thread parked (a deadlock); False: still working at the timeout
    elif proc.returncode not in (0, 1):  # skills exits 1 when the target was not reached (max_rounds)
        result["tail"] = text[-1500:]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entry", nargs="+", choices=sorted(ENTRIES), default=["skills"])
    p.add_argument("--starts", type=int, default=50)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a start counts as hung")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu/start_loop.json")
    p.add_argument("--frozen-s", type=int, default=0,
                   help="count a start as hung as soon as it has used no CPU for this many seconds (0: only the timeout)")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop an entry point's loop after this long (0: none)")
    p.add_argument("--append", action="store_true", help="add to the entry's runs already in --out")
    p.add_argument("--compile-cache", action="store_true",
                   help="share one XLA compilation cache between an entry's starts: from the second start on, what a "
                        "start exercises is process start-up, init and execution, not compilation; runs are marked "
                        "compile_cache")
    args = p.parse_args()
    import jaxlib

    data = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for entry in args.entry:
        work = Path(tempfile.mkdtemp(prefix=f"start_loop_{entry}_"))
        runs = []
        t0 = time.monotonic()
        try:
            for i in range(args.starts):
                if args.budget_s and time.monotonic() - t0 > args.budget_s:
                    break
                res = one_start(entry, work, args.timeout, args.out.parent / "start_loop_hangs", i, args.frozen_s,
                                work / "xla_cache" if args.compile_cache else None)
                runs.append(res)
                print(json.dumps({"entry": entry, **res}), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if args.append and entry in data:  # several invocations' starts of the same entry point add up
            runs = [*data[entry]["runs"], *[{**r, "index": r["index"] + len(data[entry]["runs"])} for r in runs]]
        hangs = sum(r["hung"] for r in runs)
        deadlocks = sum(bool(r.get("frozen")) for r in runs)
        errors = sum(1 for r in runs if not r["hung"] and r["returncode"] not in (0, 1))
        walls = sorted(r["wall_s"] for r in runs if not r["hung"])
        data[entry] = {"command": " ".join(["python", *ENTRIES[entry]]), "starts": len(runs), "hangs": hangs,
                       "deadlocks": deadlocks, "frozen_s": args.frozen_s,
                       "errors": errors, "completed": len(runs) - hangs - errors, "timeout_s": args.timeout,
                       "median_wall_s": walls[len(walls) // 2] if walls else None, "runs": runs,
                       "jaxlib": jaxlib.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                       "host": platform.node(), "cpus": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        if entry == "skills":
            data[entry]["ppo_section"] = SKILLS_PPO
        atomic_write_json(args.out, data)
        print(f"{entry}: {hangs} hangs ({deadlocks} deadlocked), {errors} errors in {len(runs)} starts", flush=True)


if __name__ == "__main__":
    main()
