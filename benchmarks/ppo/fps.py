"""Steps per second: sequential vs vectorised vs sharded, env stepping and full PPO training.

    python benchmarks/ppo/fps.py --out benchmarks/results/cpu [--quick] [--env Craftax-Symbolic-v1]

Writes OUT/fps.json (a list of records: mode, workload, env, num_envs, reset_mode, fps,
compile_s, run_s, steps, device, versions), OUT/fps.png (log-log steps/s against num_envs) and
OUT/fps.md (a markdown table). Compile time is measured apart (ahead-of-time `lower().compile()`),
and every timed region ends with `block_until_ready`.

Modes:
- sequential: one env, a jitted step called from a Python loop, reset in Python only when the
  episode ends (the best a sequential loop can do); and `sequential-autoreset`, the same loop
  through Craftax's own auto-resetting step (it computes a reset on every step).
- vectorized: `vmap` over N envs inside one `lax.scan`, random actions, for each reset scheme
  (`none` is the no-reset upper bound).
- sharded: the same program under `jax.shard_map` over every local device (envs split).
Each timed call continues from the env state of the previous one. `--warmup-steps W` first runs
W untimed steps so that episodes end at the policy's stationary rate: from a fresh reset almost
no Craftax random-policy episode ends in the first ~140 steps, so the reset schemes' refills
would not be exercised. Records carry `episodes_timed` (episodes that ended in the timed calls).
Workloads: `env` (stepping alone) and `ppo` (the whole PPO loop: rollout, GAE, epochs; `--ppo-updates`
updates from fresh worlds, 20 by default, timed as benchmarks/ppo/ppo_vs_peer.py does; `--peer-dir` adds
Craftax_Baselines' ppo.py at the same work, in the same process).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
from jaxrl_hier.bench import device_info, random_rollout, timed_chained
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_hier.envs import make, make_vec_env


# ---------------------------------------------------------------------------- env stepping
def sequential(env_name: str, steps: int, auto_reset: bool = False) -> dict:
    """One env stepped from Python; reset in Python when an episode ends."""
    env, params = make(env_name)
    if auto_reset:
        # Craftax's own auto-resetting step: a full world reset computed on every step.
        from craftax.craftax_env import make_craftax_env_from_name

        raw = make_craftax_env_from_name(env_name, auto_reset=True)
        step = jax.jit(lambda k, s, a: raw.step(k, s, a, params)[1:4:2])  # (state, done)
        reset = jax.jit(lambda k: raw.reset(k, params)[1])
    else:
        step = jax.jit(lambda k, s, a: (lambda o: (o[1], o[3] | o[4]))(env.step(k, s, a, params)))
        reset = jax.jit(lambda k: env.reset(k, params)[1])
    n_actions = env.action_space(params).n
    key = jax.random.PRNGKey(0)
    t0 = time.perf_counter()
    state = reset(key)
    state, done = step(key, state, 0)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    actions = rng.integers(0, n_actions, steps)
    keys = jax.random.split(key, steps)
    t0 = time.perf_counter()
    for i in range(steps):
        state, done = step(keys[i], state, int(actions[i]))
        if not auto_reset and bool(done):
            state = reset(keys[i])
    jax.block_until_ready(state)
    run_s = time.perf_counter() - t0
    return {"mode": "sequential-autoreset" if auto_reset else "sequential", "workload": "env", "num_envs": 1,
            "reset_mode": "craftax-auto" if auto_reset else "python", "fps": steps / run_s, "compile_s": compile_s,
            "run_s": run_s, "steps": steps}


def vectorized(env_name: str, num_envs: int, reset_mode: str, steps: int, sharded: bool = False,
               warmup_steps: int = 0) -> dict:
    env, params = make(env_name)
    devices = jax.device_count() if sharded else 1
    per_device = num_envs // devices
    vec = make_vec_env(env, params, per_device, reset_mode=reset_mode)
    rollout = random_rollout(vec, env.action_space(params).n, steps)

    if sharded:
        mesh = jax.make_mesh((devices,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        keys = jax.random.split(jax.random.PRNGKey(0), devices)
        _, vstate = jax.jit(jax.vmap(vec.reset))(keys)
        spec = jax.tree.map(lambda x: P("data", *[None] * (x.ndim - 1)), vstate)
        vstate = jax.device_put(vstate, jax.tree.map(lambda s: NamedSharding(mesh, s), spec))
        keys = jax.device_put(keys, NamedSharding(mesh, P("data", None)))

        def per_shard(k, v):
            v, total, episodes = rollout(k[0], jax.tree.map(lambda x: x[0], v))
            return jax.tree.map(lambda x: x[None], v), jax.lax.psum(total, "data"), jax.lax.psum(episodes, "data")

        fn = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P("data", None), spec),
                                   out_specs=(spec, P(), P()), check_vma=False))
        # One key per device; each call folds in its own index.
        fn_keyed = jax.jit(lambda key, v: fn(jax.device_put(jax.random.split(key, devices),
                                                            NamedSharding(mesh, P("data", None))), v))
        compile_s, run_s, episodes = timed_chained(fn_keyed, jax.random.PRNGKey(1), vstate, -(-warmup_steps // steps))
    else:
        _, vstate = jax.jit(vec.reset)(jax.random.PRNGKey(0))
        compile_s, run_s, episodes = timed_chained(jax.jit(rollout), jax.random.PRNGKey(1), vstate,
                                                   -(-warmup_steps // steps))
    return {"mode": "sharded" if sharded else "vectorized", "workload": "env", "num_envs": num_envs,
            "reset_mode": reset_mode, "fps": num_envs * steps / run_s, "compile_s": compile_s, "run_s": run_s,
            "steps": num_envs * steps, "devices": devices, "warmup_steps": warmup_steps,
            "episodes_timed": episodes}


# ---------------------------------------------------------------------------- full PPO
def ppo(env_name: str, num_envs: int, num_steps: int, updates: int, reset_mode: str, hidden: int,
        peer_dir: Path | None = None) -> list[dict]:
    """The whole PPO loop, as benchmarks/ppo/ppo_vs_peer.py times it: `updates` updates from fresh worlds
    and parameters (20+, so that episodes end and resets are paid), initialisation included, compiled
    ahead, one warm-up call, then one timed call from the same start. With `peer_dir` (a checkout of
    Craftax_Baselines) its ppo.py runs the same work in the same process: a second record."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.ppo import ppo_vs_peer

    s = {"num_steps": num_steps, "num_minibatches": 8, "update_epochs": 4, "width": hidden, "updates": updates,
         "lr": 3e-4, "reset_ratio": 16}
    if reset_mode != "pool":
        raise ValueError("the PPO point runs pool resets (benchmarks/ppo/ppo_vs_peer.py)")
    order = (ppo_vs_peer.OURS, ppo_vs_peer.PEER) if peer_dir else (ppo_vs_peer.OURS,)
    module = ppo_vs_peer.load_peer(peer_dir) if peer_dir else None
    out = []
    for r in ppo_vs_peer.run_point(env_name, num_envs, s, module, order=order):
        mode = "sharded" if jax.device_count() > 1 else "vectorized"
        out.append({"mode": mode if r["system"] == ppo_vs_peer.OURS else "craftax_baselines", "workload": "ppo",
                    "num_envs": num_envs, "reset_mode": reset_mode if r["system"] == ppo_vs_peer.OURS else "optimistic",
                    "fps": r["fps"], "compile_s": r["compile_s"], "run_s": r["run_s"], "steps": r["steps"],
                    "devices": jax.device_count(), "num_steps": num_steps, "hidden_size": hidden, "updates": updates,
                    "episodes_timed": r["episodes_timed"]})
    return out


# ---------------------------------------------------------------------------- outputs
def write_outputs(records: list[dict], out: Path, title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / "fps.json", records)
    lines = ["| workload | mode | reset | num_envs | steps/s | compile s | warm-up steps | episodes ended (timed) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['workload']} | {r['mode']} | {r['reset_mode']} | {r['num_envs']} | {r['fps']:,.0f} | "
                     f"{r['compile_s']:.1f} | {r.get('warmup_steps', '')} | {r.get('episodes_timed', '')} |")
    info = records[0] if records else {}
    lines.append("")
    lines.append(f"{title}; device {info.get('device')}, jax {info.get('jax')}, {info.get('cpu_count')} CPU cores.")
    atomic_write_text(out / "fps.md", "\n".join(lines) + "\n")

    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[tuple, list] = {}
    for r in records:
        groups.setdefault((r["workload"], r["mode"], r["reset_mode"]), []).append(r)
    for (workload, mode, reset), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["num_envs"])
        style = "o--" if mode.startswith("sequential") else "o-"
        ax.plot([r["num_envs"] for r in rs], [r["fps"] for r in rs], style, label=f"{workload}/{mode}/{reset}")
    ax.set(xscale="log", yscale="log", xlabel="num_envs", ylabel="env steps / s", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "fps.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", default="Craftax-Symbolic-v1")
    parser.add_argument("--quick", action="store_true", help="a reduced sweep (under 5 minutes on a 2-core CPU)")
    parser.add_argument("--workload", choices=["env", "sharded", "ppo", "all"], default="all")
    parser.add_argument("--append", action="store_true", help="add to the records already in OUT/fps.json")
    parser.add_argument("--num-envs", type=int, nargs="*", default=None, help="override the num_envs sweep")
    parser.add_argument("--steps", type=int, default=None, help="scan steps per timed vectorized call")
    parser.add_argument("--hidden", type=int, default=512, help="PPO network width")
    parser.add_argument("--warmup-steps", type=int, default=0,
                        help="env steps run (untimed) before the vectorized timing, so that episodes end at the "
                             "policy's stationary rate (Craftax random policy: ~400)")
    parser.add_argument("--modes", nargs="*", default=None, help="override the reset schemes swept")
    parser.add_argument("--ppo-updates", type=int, default=20,
                        help="PPO updates per timed call, from fresh worlds (20+: episodes end, resets are paid)")
    parser.add_argument("--peer-dir", type=Path, default=None,
                        help="a Craftax_Baselines checkout: its ppo.py beside each PPO point (benchmarks/ppo/ppo_vs_peer.py)")
    parser.add_argument("--ppo-num-envs", type=int, nargs="*", default=None, help="override the PPO num_envs sweep")
    args = parser.parse_args(argv)

    gpu = jax.devices()[0].platform != "cpu"
    if args.quick:
        sweep = args.num_envs or [256]
        modes = args.modes or ["none", "pool"]  # with/without resets; each extra mode is ~50 s of compile
        seq_steps, steps = 300, args.steps or 32
        ppo_sweep = [256]
    else:
        sweep = args.num_envs or ([1, 16, 64, 256, 1024, 4096] if gpu else [1, 64, 256, 1024])
        modes = args.modes or ["none", "auto", "optimistic", "pool"]
        seq_steps, steps = 1000, args.steps or 64
        ppo_sweep = [256, 1024, 4096] if gpu else [256, 1024]
    ppo_sweep = args.ppo_num_envs or ppo_sweep
    info = device_info()
    records: list[dict] = []
    if args.append and (args.out / "fps.json").exists():
        records = json.loads((args.out / "fps.json").read_text())

    def add(rec):
        rec.update(env=args.env, **info)
        records.append(rec)
        print(f"{rec['workload']:4s} {rec['mode']:21s} {rec['reset_mode']:12s} N={rec['num_envs']:5d} "
              f"{rec['fps']:12,.0f} steps/s  (compile {rec['compile_s']:.1f}s)", flush=True)
        write_outputs(records, args.out, f"{args.env} steps/s")

    if args.workload in ("env", "all"):
        add(sequential(args.env, seq_steps))
        if args.env.startswith("Craftax") and not args.quick:
            add(sequential(args.env, max(seq_steps // 10, 50), auto_reset=True))
        for n in sweep:
            for mode in modes:
                if mode == "auto" and n > 256 and not gpu:
                    continue  # a reset per env per step: minutes per point on a CPU
                add(vectorized(args.env, n, mode, steps, warmup_steps=args.warmup_steps))
    if args.workload in ("sharded", "all") and (jax.device_count() > 1 or not args.quick):
        add(vectorized(args.env, max(sweep), "pool", steps, sharded=True, warmup_steps=args.warmup_steps))
    if args.workload in ("ppo", "all"):
        for n in ppo_sweep:
            for rec in ppo(args.env, n, 16 if not gpu else 64, args.ppo_updates, "pool", args.hidden, args.peer_dir):
                add(rec)
    print(f"wrote {args.out}/fps.json, fps.png, fps.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
