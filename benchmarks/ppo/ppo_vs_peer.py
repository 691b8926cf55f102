"""Our PPO against Craftax_Baselines' `ppo.py` at equal work, in one process, and where our update's time goes.

    python benchmarks/ppo/ppo_vs_peer.py --peer-dir PATH/TO/Craftax_Baselines --out benchmarks/results/cpu/ppo_peer \
        [--envs Craftax-Classic-Symbolic-v1 Craftax-Symbolic-v1] [--num-envs 256] [--num-steps 16] \
        [--updates 20] [--width 512] [--check]
    python benchmarks/ppo/ppo_vs_peer.py --profile --out benchmarks/results/cpu/ppo_peer [--envs ...] [--num-envs 256]

The peer is the user's own checkout of Craftax_Baselines (github.com/MichaelTMatthews/Craftax_Baselines;
nothing of it is copied here): its `ppo.py` is imported by path and its `make_train(config)` runs
unchanged, with the config dict its own script builds (`run_ppo`: the upper-cased argparse
defaults, `jax.vmap` over `NUM_REPEATS` = 1 seeds), logging off. Optimistic resets 1/16 as its
default. Where `wandb` is not installed, an empty module stands in for it (the peer imports it at
the top; with logging off it is never called).

Both sides do the same work: the same env, num_envs, num_steps, minibatches, epochs and layer
width (3 hidden layers, tanh, actor and critic apart), `--updates` PPO updates from fresh worlds
and fresh parameters. Each is compiled ahead (`jit(...).lower(...).compile()`, compile time
recorded apart), called once untimed, then called again from the same start and timed to
`block_until_ready`. The peer's call includes its initialisation (network init, env reset); so
does ours (`PPO.init`'s program, then one compiled chunk of `--updates` updates, our default
pool resets 1/16). With 20+ updates of 16+ steps episodes end in the timed call, so resets are
paid on both sides (ours records how many ended). Sides alternate within each point; `--repeats`
timed calls each, the best kept. The record carries the device, versions, XLA_FLAGS, the load
average and the hypervisor's steal share during each timed call.

Writes OUT/ppo_vs_peer.json (records and pairs), OUT/ppo_vs_peer.md (the side-by-side table) and
OUT/ppo_vs_peer.png (steps/s per env and num_envs, both systems). `--check` exits 1 when ours is
slower than the peer at any point. `--env-only` adds a third side at each point: our vectorised env
alone over the same steps (random actions, pool resets), the ceiling the whole loop is measured
against. `--points ENV:N[:ours+peer+env_only] ...` runs those points in that order (most wanted
first), each with the systems it names (by default ours, the peer, and env_only with --env-only);
`--deadline-s` starts no point after that many seconds, and a point that fails (out of memory, say)
is recorded as such while the others run: sized for a GPU machine held for minutes.

`--profile` times the pieces of one of our PPO updates, each compiled on its own, at the same
settings: env stepping with resets (random actions, after `--profile-warmup` steps so that
episodes end at their stationary rate), the policy's forward pass and sampling in the rollout,
GAE, the epochs' minibatch gathers, forward+backward, and the optimiser; beside them the whole
update (our compiled chunk, from the same warmed env state). Writes OUT/ppo_profile.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import math
import os
import sys
import time
import types
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
from jaxrl_hier.bench import cpu_ticks, device_info, steal_fraction
from jaxrl_hier.networks.precision import MATMUL_DTYPES
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

PEER = "craftax_baselines"
OURS = "jaxrl_hier"
ENV_ONLY = "env_only"  # our env stepping alone over the same steps (--env-only)

# Craftax_Baselines ppo.py's argparse defaults (its `__main__`), upper-cased as its `run_ppo` does.
PEER_DEFAULTS = {
    "ENV_NAME": "Craftax-Symbolic-v1", "NUM_ENVS": 1024, "TOTAL_TIMESTEPS": int(1e9), "LR": 2e-4, "NUM_STEPS": 64,
    "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 8, "GAMMA": 0.99, "GAE_LAMBDA": 0.8, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
    "VF_COEF": 0.5, "MAX_GRAD_NORM": 1.0, "ACTIVATION": "tanh", "ANNEAL_LR": True, "DEBUG": True, "JIT": True,
    "SEED": 0, "USE_WANDB": True, "SAVE_POLICY": False, "NUM_REPEATS": 1, "LAYER_SIZE": 512, "WANDB_PROJECT": None,
    "WANDB_ENTITY": None, "USE_OPTIMISTIC_RESETS": True, "OPTIMISTIC_RESET_RATIO": 16,
    "EXPLORATION_UPDATE_EPOCHS": 4, "ICM_REWARD_COEFF": 1.0, "TRAIN_ICM": False, "ICM_LR": 3e-4,
    "ICM_FORWARD_LOSS_COEF": 1.0, "ICM_INVERSE_LOSS_COEF": 1.0, "ICM_LAYER_SIZE": 256, "ICM_LATENT_SIZE": 32,
    "E3B_REWARD_COEFF": 1.0, "USE_E3B": False, "E3B_LAMBDA": 0.1,
}


# ---------------------------------------------------------------------------- settings
def settings(args) -> dict:
    return {"num_steps": args.num_steps, "num_minibatches": args.minibatches, "update_epochs": args.epochs,
            "width": args.width, "updates": args.updates, "lr": args.lr, "reset_ratio": args.reset_ratio,
            "matmul_dtype": args.matmul_dtype}


def peer_config(env: str, num_envs: int, s: dict) -> dict:
    """The peer's config dict for one point: its defaults with our settings, logging off."""
    config = dict(PEER_DEFAULTS)
    config.update(ENV_NAME=env, NUM_ENVS=num_envs, NUM_STEPS=s["num_steps"], NUM_MINIBATCHES=s["num_minibatches"],
                  UPDATE_EPOCHS=s["update_epochs"], LAYER_SIZE=s["width"], LR=s["lr"],
                  TOTAL_TIMESTEPS=num_envs * s["num_steps"] * s["updates"], OPTIMISTIC_RESET_RATIO=s["reset_ratio"],
                  DEBUG=False, USE_WANDB=False)
    return config


def load_peer(peer_dir: Path):
    """The peer's `ppo` module, imported from its checkout (its own imports resolve there)."""
    peer_dir = Path(peer_dir).resolve()
    path = peer_dir / "ppo.py"
    if not path.is_file():
        raise SystemExit(f"error: --peer-dir {peer_dir} has no ppo.py (a checkout of Craftax_Baselines is expected)")
    stub = None
    try:
        import wandb  # noqa: F401
    except ImportError:  # imported at the top of the peer's ppo.py; never called with USE_WANDB off
        stub = sys.modules["wandb"] = types.ModuleType("wandb")
    sys.path.insert(0, str(peer_dir))
    try:
        spec = importlib.util.spec_from_file_location("craftax_baselines_ppo", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(peer_dir))
        # The peer's own modules (wrappers, models, logz) and the stand-in leave sys.modules again, so
        # that they shadow nothing imported later in this process; the peer's functions keep them.
        for name, mod in list(sys.modules.items()):
            if (stub is not None and mod is stub) or str(getattr(mod, "__file__", "") or "").startswith(str(peer_dir)):
                del sys.modules[name]
    return module


def peer_version(peer_dir: Path) -> str | None:
    """The checkout's commit (`git rev-parse HEAD`), None where it is no git checkout."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(peer_dir), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def point_error(e: Exception, system: str) -> str:
    """What a failed point's record says for `system`: its own failure, or that another side's stopped it."""
    if isinstance(e, SideError):
        return repr(e.__cause__) if e.system == system else f"not timed: {e.system} failed"
    return repr(e)


class SideError(RuntimeError):
    """One system could not be built (or compiled) at a point."""

    def __init__(self, system: str, env: str, num_envs: int):
        super().__init__(f"{system} could not be built at {env} N={num_envs}")
        self.system = system


SYSTEM_NAMES = {"ours": OURS, "peer": PEER, "env_only": ENV_ONLY}


def parse_points(specs: list[str], order: tuple[str, ...]) -> list[tuple[str, int, tuple[str, ...]]]:
    """`ENV:N` or `ENV:N:ours+env_only` strings as (env, num_envs, systems), in the order given; a
    point without its own systems runs `order`."""
    points = []
    for spec in specs:
        env, _, rest = spec.partition(":")
        n, _, systems = rest.partition(":")
        names = systems.split("+") if systems else None
        if not env or not n.isdigit() or int(n) < 1 or (names and not set(names) <= set(SYSTEM_NAMES)):
            raise SystemExit(f"error: --points takes ENV:N or ENV:N:{'+'.join(SYSTEM_NAMES)} "
                             f"(say Craftax-Symbolic-v1:4096), not '{spec}'")
        points.append((env, int(n), tuple(SYSTEM_NAMES[x] for x in names) if names else order))
    return points


# ---------------------------------------------------------------------------- timing
def _timed(call):
    """(seconds, result, load average, steal share) of `call()` blocked until ready."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    before = cpu_ticks()
    t0 = time.perf_counter()
    out = jax.block_until_ready(call())
    seconds = time.perf_counter() - t0
    return seconds, out, load, steal_fraction(before, cpu_ticks())


class Peer:
    """Craftax_Baselines' train, compiled ahead as its run_ppo calls it: jit(vmap(make_train(config)))."""

    system = PEER

    def __init__(self, module, env: str, num_envs: int, s: dict, seed: int = 0):
        self.config = peer_config(env, num_envs, s)
        self.rngs = jax.random.split(jax.random.PRNGKey(seed), self.config["NUM_REPEATS"])
        t0 = time.perf_counter()
        fn = jax.jit(jax.vmap(module.make_train(self.config)))
        self.compiled = fn.lower(self.rngs).compile()
        self.compile_s = time.perf_counter() - t0

    def __call__(self):
        return self.compiled(self.rngs)

    def episodes(self, out) -> None:
        return None  # the peer's train returns its runner state only


class Ours:
    """Our PPO from the same start: `PPO.init`'s program, then one compiled chunk of `updates` updates."""

    system = OURS

    def __init__(self, env: str, num_envs: int, s: dict, seed: int = 0, overrides: dict | None = None):
        from jaxrl_hier.algorithms.ppo import PPOConfig, make_train

        self.config = PPOConfig(env=env, num_envs=num_envs, num_steps=s["num_steps"],
                                num_minibatches=s["num_minibatches"], update_epochs=s["update_epochs"],
                                hidden_size=s["width"], num_layers=3, activation="tanh", network="mlp", lr=s["lr"],
                                total_timesteps=num_envs * s["num_steps"] * s["updates"], reset_mode="pool",
                                reset_ratio=s["reset_ratio"], seed=seed,
                                **{"matmul_dtype": s.get("matmul_dtype", "float32"), **(overrides or {})})
        trainer = make_train(self.config)
        self.seed_keys = jax.random.split(jax.random.PRNGKey(seed), self.config.num_seeds)
        t0 = time.perf_counter()
        # PPO.init's own program (init jits a fresh closure on every call, so build it once here).
        init = jax.vmap(lambda k: trainer._init_one(k, {}))
        shape = jax.eval_shape(init, self.seed_keys)
        self.init = jax.jit(init, out_shardings=trainer.shardings(shape)).lower(self.seed_keys).compile()
        runner = self.init(self.seed_keys)  # the chunk is lowered on the laid-out runner (its shardings)
        self.chunk = trainer._compiled_chunk(s["updates"], runner).lower(runner).compile()
        self.compile_s = time.perf_counter() - t0

    def __call__(self):
        return self.chunk(self.init(self.seed_keys))

    def episodes(self, out) -> int:
        return int(np.asarray(out[1]["episodes"]).sum())


class EnvOnly:
    """Our env stepping alone over the same work: the vectorised env (pool resets, the same ratio)
    reset from fresh worlds, then `num_steps x updates` steps of uniformly random actions in one scan,
    resets of the episodes that end included. The PPO loop's ceiling: whole PPO over this is the
    share of the time left to the environment."""

    system = ENV_ONLY

    def __init__(self, env: str, num_envs: int, s: dict, seed: int = 0):
        from jaxrl_hier.bench import random_rollout
        from jaxrl_hier.envs import make, make_vec_env

        base, params = make(env)
        vec = make_vec_env(base, params, num_envs, reset_mode="pool", reset_ratio=s["reset_ratio"])
        rollout = random_rollout(vec, base.action_space(params).n, s["num_steps"] * s["updates"])

        def run(key):
            k_reset, k_run = jax.random.split(key)
            return rollout(k_run, vec.reset(k_reset)[1])

        self.key = jax.random.PRNGKey(seed)
        t0 = time.perf_counter()
        self.compiled = jax.jit(run).lower(self.key).compile()
        self.compile_s = time.perf_counter() - t0

    def __call__(self):
        return self.compiled(self.key)

    def episodes(self, out) -> int:
        return int(out[2])


def make_side(system: str, env: str, num_envs: int, s: dict, peer_module):
    """One system at one point, built and compiled (no call made yet)."""
    if system == ENV_ONLY:
        return EnvOnly(env, num_envs, s)
    return Ours(env, num_envs, s) if system == OURS else Peer(peer_module, env, num_envs, s)


def build_sides(points: list[tuple[str, int, tuple[str, ...]]], s: dict, peer_module, workers: int = 1,
                log=print) -> dict:
    """Every system of every (env, num_envs, systems) point built and compiled ahead, keyed by
    (system, env, num_envs). With `workers` > 1 the programs compile
    in that many threads at once (XLA compiles each program mostly on one core, and releases the GIL):
    on an H200's 16-core host 13 Craftax programs compiled in 311 s with 13 threads, about three times
    one program alone (116 s), against some 1,300 s one after another."""
    jobs = [(system, env, n) for env, n, systems in points for system in systems]

    def build(job):
        try:
            side = make_side(*job, s, peer_module)
        except Exception as e:  # noqa: BLE001  (one point's failure, out of memory say, spares the others)
            log(f"  {job[1]} N={job[2]} {job[0]}: failed to build: {e!r:.300}")
            return e
        log(f"  {job[1]} N={job[2]} {job[0]}: compiled in {side.compile_s:.1f} s")
        return side

    if workers <= 1:
        return {job: build(job) for job in jobs}
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        sides = dict(zip(jobs, pool.map(build, jobs)))
    log(f"  {len(jobs)} programs compiled in {time.perf_counter() - t0:.1f} s with {workers} threads")
    return sides


def run_point(env: str, num_envs: int, s: dict, peer_module, repeats: int = 1, order=(OURS, PEER),
              log=print, sides: dict | None = None) -> list[dict]:
    """Both systems at one point: build and compile each (unless `sides` holds them), one warm-up
    call each, then `repeats` rounds of one timed call each, the sides alternating. One record per
    system (its best call)."""
    sides = sides if sides is not None else build_sides([(env, num_envs, order)], s, peer_module, log=log)
    sides = {system: sides[(system, env, num_envs)] for system in order}
    for system, side in sides.items():
        if isinstance(side, Exception):
            raise SideError(system, env, num_envs) from side
    for system in order:
        jax.block_until_ready(sides[system]())  # warm-up: first-run allocations and thread pools
    steps = num_envs * s["num_steps"] * s["updates"]
    timings = {system: [] for system in order}
    for _ in range(repeats):
        for system in order:
            seconds, out, load, steal = _timed(sides[system])
            timings[system].append({"run_s": seconds, "loadavg": load, "steal": steal,
                                    "episodes_timed": sides[system].episodes(out)})
            del out
    records = []
    for system in order:
        best = min(timings[system], key=lambda t: t["run_s"])
        records.append({"system": system, "env": env, "num_envs": num_envs, **s, "steps": steps,
                        "fps": steps / best["run_s"], "fps_per_env": steps / best["run_s"] / num_envs,
                        "compile_s": sides[system].compile_s, "run_s": best["run_s"], "calls": timings[system],
                        "episodes_timed": best["episodes_timed"], "reset": "optimistic 1/%d" % s["reset_ratio"]
                        if system == PEER else "pool 1/%d" % s["reset_ratio"]})
        log(f"  {system}: {records[-1]['fps']:,.0f} steps/s ({best['run_s']:.1f} s timed)")
    return records


def pairs(records: list[dict]) -> list[dict]:
    """Ours / peer steps/s at each (env, num_envs) where both ran."""
    out = []
    keyed = {(r["system"], r["env"], r["num_envs"]): r for r in records if "fps" in r}
    for (system, env, n), r in keyed.items():
        peer, env_only = keyed.get((PEER, env, n)), keyed.get((ENV_ONLY, env, n))
        if system == OURS and (peer or env_only):
            pair = {"env": env, "num_envs": n, "ours_fps": r["fps"], "ours_compile_s": r["compile_s"]}
            if peer:
                pair.update(peer_fps=peer["fps"], ratio=r["fps"] / peer["fps"], peer_compile_s=peer["compile_s"])
            if env_only:  # the share of env-only stepping that the whole PPO loop keeps
                pair.update(env_only_fps=env_only["fps"], of_env_only=r["fps"] / env_only["fps"])
            out.append(pair)
    return out


def check(pairs_: list[dict], threshold: float = 1.0) -> list[str]:
    """The points where ours is below `threshold` x the peer (empty: none)."""
    return [f"{p['env']} at {p['num_envs']} envs: ours {p['ours_fps']:,.0f} steps/s < {threshold} x peer "
            f"{p['peer_fps']:,.0f}" for p in pairs_ if "ratio" in p and p["ratio"] < threshold]


# ---------------------------------------------------------------------------- outputs
def _load(record: dict) -> str:
    """The 1-minute load average when the record's best call started (other jobs on the machine show here)."""
    best = min(record.get("calls") or [{}], key=lambda c: c.get("run_s", math.inf))
    return "n/a" if best.get("loadavg") is None else f"{best['loadavg']:.1f}"


def write_outputs(result: dict, out: Path) -> None:
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "ppo_vs_peer.json", result)
    s, info = result["settings"], result["device"]
    lines = ["| env | num_envs | ours steps/s | peer steps/s | ours / peer | env-only steps/s | ours / env-only | "
             "ours per env | peer per env | ours compile s | peer compile s | episodes ended (ours, timed) | "
             "load average (ours, peer) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    by = {(r["system"], r["env"], r["num_envs"]): r for r in result["records"] if "fps" in r}
    for p in result["pairs"]:
        o, q = by[(OURS, p["env"], p["num_envs"])], by.get((PEER, p["env"], p["num_envs"]))
        env_only = (f"{p['env_only_fps']:,.0f} | {p['of_env_only']:.2f}x" if "env_only_fps" in p else "n/a | n/a")
        peer = (f"{q['fps']:,.0f} | {p['ratio']:.2f}x" if q else "not run | n/a")
        q_per_env, q_compile = (f"{q['fps_per_env']:.2f}", f"{q['compile_s']:.1f}") if q else ("n/a", "n/a")
        lines.append(f"| {p['env']} | {p['num_envs']} | {p['ours_fps']:,.0f} | {peer} | {env_only} | "
                     f"{o['fps_per_env']:.2f} | {q_per_env} | {o['compile_s']:.1f} | {q_compile} | "
                     f"{o.get('episodes_timed')} | {_load(o)}, {_load(q) if q else 'n/a'} |")
    failed = {}
    for r in result["records"]:
        if "error" in r:
            failed.setdefault((r["env"], r["num_envs"]), []).append(f"{r['system']}: {r['error'][:200]}")
    for (env, n), why in failed.items():
        lines.append(f"| {env} | {n} | failed ({'; '.join(why)}) |")
    lines += ["", f"Same process, equal work: {s['updates']} updates of num_envs x {s['num_steps']} steps, "
              f"{s['update_epochs']} epochs x {s['num_minibatches']} minibatches, width {s['width']} (3 layers, tanh), "
              f"from fresh worlds and parameters; each side compiled ahead, one warm-up call, then timed to "
              f"block_until_ready (initialisation included on both sides). Ours: pool resets 1/{s['reset_ratio']}, "
              f"matrix products in {s.get('matmul_dtype', 'float32')} (parameters float32); "
              f"peer: Craftax_Baselines ppo.py unchanged (commit {result.get('peer_commit') or 'unknown'}), "
              f"optimistic resets 1/{s['reset_ratio']}. Env-only: our vectorised env alone over the same "
              f"num_envs x {s['num_steps'] * s['updates']} steps from fresh worlds, random actions, pool resets "
              f"1/{s['reset_ratio']} (the whole loop's ceiling).",
              f"Device {info.get('device')} ({info.get('cpu_model')}, {info.get('cpu_count')} cores{_flags(info)}), jax {info.get('jax')}, "
              f"flax {info.get('flax')}, optax {info.get('optax')}; {result.get('date', '')}."]
    atomic_write_text(out / "ppo_vs_peer.md", "\n".join(lines) + "\n")

    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()
    envs = sorted({p["env"] for p in result["pairs"] if "ratio" in p})
    if not envs:
        return
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        ps = sorted((p for p in result["pairs"] if p["env"] == env and "ratio" in p), key=lambda p: p["num_envs"])
        x = np.arange(len(ps))
        ax.bar(x - 0.2, [p["ours_fps"] for p in ps], 0.4, label="jaxrl_hier PPO")
        ax.bar(x + 0.2, [p["peer_fps"] for p in ps], 0.4, label="Craftax_Baselines ppo.py")
        for i, p in enumerate(ps):
            ax.annotate(f"{p['ratio']:.2f}x", (i - 0.2, p["ours_fps"]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [str(p["num_envs"]) for p in ps])
        ax.set(xlabel="num_envs", ylabel="env steps / s (whole PPO loop)", title=env)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(f"{info.get('device')} ({info.get('cpu_model')}), jax {info.get('jax')}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out / "ppo_vs_peer.png")


# ---------------------------------------------------------------------------- profile
def turn_lock(path: Path | None):
    """A factory of `with` blocks that hold the device alone: an exclusive lock on `path`, shared by
    several profiling processes that compile at once (on a GPU host's spare cores) but must not time
    at once (they would share the GPU). No path: nothing is held."""
    if path is None:
        return contextlib.nullcontext

    @contextlib.contextmanager
    def held():
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    return held


def wait_for(gate: Path | None) -> None:
    """Block until no other process holds `gate` (their shared locks), then keep it exclusively for
    the rest of this process: a point whose arrays need most of the GPU's memory runs once the others
    are done."""
    if gate is not None:
        f = open(gate, "a")  # left open: the lock lasts as long as the process
        fcntl.flock(f, fcntl.LOCK_EX)


def _best(compiled, *args, repeats: int = 3, turn=contextlib.nullcontext) -> float:
    with turn():
        jax.block_until_ready(compiled(*args))
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            best = min(best, time.perf_counter() - t0)
    return best


def profile(env: str, num_envs: int, s: dict, warmup_steps: int = 400, log=print,
            turn=contextlib.nullcontext, ready=lambda: None) -> dict:
    """Seconds per PPO update of each piece, each compiled apart (see the module docstring); `turn`
    (turn_lock) is held around every timed call, and `ready()` is called once the two large
    programs (env stepping, the whole update) are compiled, before anything is put on the device
    beyond the initial state."""
    import optax

    from jaxrl_hier.algorithms.gae import gae
    from jaxrl_hier.algorithms.ppo import PPOConfig, make_train

    config = PPOConfig(env=env, num_envs=num_envs, num_steps=s["num_steps"], num_minibatches=s["num_minibatches"],
                       update_epochs=s["update_epochs"], hidden_size=s["width"], num_layers=3, network="mlp",
                       total_timesteps=num_envs * s["num_steps"] * max(s["updates"], 2), reset_mode="pool",
                       reset_ratio=s["reset_ratio"], lr=s["lr"])
    trainer = make_train(config)
    T, N, M, E = config.num_steps, num_envs, config.num_minibatches, config.update_epochs
    vec = trainer.vec_env(trainer.env_params)
    n_actions = trainer.env.action_space(trainer.env_params).n
    pieces, compile_s = {}, {}

    def env_steps(key, vstate, obs):
        def body(carry, k):
            vstate, obs = carry
            k_act, k_env = jax.random.split(k)
            action = jax.random.randint(k_act, (N,), 0, n_actions)
            obs, vstate, *_ = vec.step(k_env, vstate, action)
            return (vstate, obs), obs

        (vstate, obs), all_obs = jax.lax.scan(body, (vstate, obs), jax.random.split(key, T))
        return vstate, obs, all_obs

    t0 = time.perf_counter()
    obs, vstate = jax.jit(vec.reset)(jax.random.PRNGKey(0))
    step_c = jax.jit(env_steps).lower(jax.random.PRNGKey(1), vstate, obs).compile()
    compile_s["env"] = time.perf_counter() - t0
    # The whole update (our compiled chunk of 2 updates), compiled ahead: it is timed last, from the
    # warmed env state, which has the initial state's shapes.
    runner = trainer.init(jax.random.PRNGKey(0))
    runner = jax.device_put(runner, trainer.shardings(runner))
    t0 = time.perf_counter()
    chunk = trainer._compiled_chunk(2, runner).lower(runner).compile()
    compile_s["whole update"] = time.perf_counter() - t0
    ready()
    calls = 8
    with turn():
        for i in range(-(-warmup_steps // T)):  # episodes end at their stationary rate from here on
            vstate, obs = step_c(jax.random.PRNGKey(100 + i), vstate, obs)[:2]
        jax.block_until_ready(vstate)
        t0 = time.perf_counter()
        for i in range(calls):  # chained calls, so the pool's refills are paid at their rate
            # the observations dropped at once: two calls' worth would not fit beside each other at 16,384 envs
            vstate, obs = step_c(jax.random.PRNGKey(1000 + i), vstate, obs)[:2]
        jax.block_until_ready(vstate)
        pieces["env stepping and resets (random actions)"] = (time.perf_counter() - t0) / calls
    vstate, obs, traj_obs = step_c(jax.random.PRNGKey(1000 + calls), vstate, obs)
    log(f"    env stepping: {pieces['env stepping and resets (random actions)'] * 1e3:.1f} ms per update "
        f"(compiled in {compile_s['env']:.0f} s)")
    params = jax.tree.map(lambda x: x[0], runner.train_state.params)
    opt_state = jax.tree.map(lambda x: x[0], runner.train_state.opt_state)

    def policy(params, traj_obs, key):
        def body(_, x):
            o, k = x
            pi, value = trainer.apply(params, {}, o)
            a = pi.sample(seed=k)
            return None, (a, pi.log_prob(a), value)

        return jax.lax.scan(body, None, (traj_obs, jax.random.split(key, T)))[1]

    def timed_piece(name, fn, *args):
        t0 = time.perf_counter()
        c = jax.jit(fn).lower(*args).compile()
        compile_s[name] = time.perf_counter() - t0
        pieces[name] = _best(c, *args, turn=turn)
        log(f"    {name}: {pieces[name] * 1e3:.1f} ms per call (compiled in {compile_s[name]:.0f} s)")
        return c(*args)

    actions, log_prob, values = timed_piece("policy forward + sampling (rollout)", policy, params, traj_obs,
                                            jax.random.PRNGKey(2))
    rewards = jnp.zeros((T, N)) + 0.1
    done = jnp.zeros((T, N), bool).at[T // 2, : N // 8].set(True)
    adv, targets = timed_piece("GAE", lambda r, v, d, lv: gae(r, v, d, d & False, v, lv, config.gamma, config.gae_lambda),
                               rewards, values, done, values[-1])
    from jaxrl_hier.algorithms.ppo import Transition

    traj = Transition(traj_obs, actions, log_prob, values, rewards, done, done & False, values)
    perms = jax.vmap(lambda k: jax.random.permutation(k, T))(jax.random.split(jax.random.PRNGKey(3), N))[None]

    def gathers(traj, adv, targets):
        outs = [trainer._take_minibatch(perms, k, jax.tree.map(lambda x: x[None], traj), adv[None], targets[None], None)
                for k in range(M)]
        return jax.tree.map(lambda *x: jnp.stack(x), *outs)

    mbs = timed_piece("minibatch gathers (epochs)", gathers, traj, adv, targets)
    pieces["minibatch gathers (epochs)"] *= E
    tx = trainer.optimizer()
    grad_fn = jax.value_and_grad(trainer._loss, has_aux=True)

    def fwd_bwd(params, mbs):
        def body(_, mb):
            return None, grad_fn(params, {}, *mb)[1]

        return jax.lax.scan(body, None, mbs)[1]

    loss_axis = jax.shard_map(fwd_bwd, mesh=trainer.mesh, in_specs=(jax.sharding.PartitionSpec(),) * 2,
                              out_specs=jax.sharding.PartitionSpec(), check_vma=False)
    grads = timed_piece("forward + backward (epochs)", loss_axis, params, mbs)
    pieces["forward + backward (epochs)"] *= E

    def optimise(params, opt_state, grads):
        def body(carry, g):
            p, o = carry
            u, o = tx.update(g, o, p)
            return (optax.apply_updates(p, u), o), None

        return jax.lax.scan(body, (params, opt_state), grads)[0]

    timed_piece("optimiser (clip + Adam)", optimise, params, opt_state, grads)
    pieces["optimiser (clip + Adam)"] *= E
    # The rollout's observations and their minibatch copy are the largest arrays (tens of GB at 16,384
    # Craftax envs): gone before the whole update needs its own.
    del traj_obs, traj, mbs, grads, actions, log_prob, values, adv, targets

    # The whole update from the warmed env state: our compiled chunk of 2 updates, per update.
    runner = runner.replace(env_state=jax.tree.map(lambda x: x[None, None], vstate),
                            obs=jax.tree.map(lambda x: x[None, None], obs))
    runner = jax.device_put(runner, trainer.shardings(runner))
    try:
        whole = _best(chunk, runner, repeats=2, turn=turn) / 2
    except Exception as e:  # out of memory, say: the pieces are still worth their table
        log(f"    whole update failed: {e!r:.300}")
        whole = math.nan
    total = sum(pieces.values())
    rows = [{"piece": k, "s_per_update": v, "share_of_sum": v / total} for k, v in pieces.items()]
    for r in rows:
        log(f"  {r['piece']:42s} {r['s_per_update'] * 1e3:9.1f} ms  {100 * r['share_of_sum']:5.1f}%")
    log(f"  {'sum of the pieces':42s} {total * 1e3:9.1f} ms;  whole update {whole * 1e3:.1f} ms "
        f"({num_envs * T / whole:,.0f} steps/s)")
    return {"env": env, "num_envs": num_envs, **s, "pieces": rows, "sum_s": total, "whole_update_s": whole,
            "whole_fps": num_envs * T / whole, "compile_s": compile_s, "loadavg": os.getloadavg()[0]}


def levers(env: str, num_envs: int, s: dict, log=print, turn=contextlib.nullcontext) -> dict:
    """Speed levers measured on the update's dearest pieces, each against its float32 / per-leaf
    form at the same shapes (observations random: dense matrix products take the same time on any
    values): bf16 matrix products with float32 parameters for the epochs' forward+backward and the
    rollout's forward, in two forms: the parameters and observations cast inside the loss (autodiff's
    own backward pass), and the trainer's `matmul_dtype: bfloat16` network (`networks.precision`:
    every product, backward included, of bf16 operands accumulated in float32); and the optimiser on
    one flat vector instead of per-leaf arrays."""
    import optax

    from jaxrl_hier.algorithms.ppo import PPOConfig, Transition, make_train

    config = PPOConfig(env=env, num_envs=num_envs, num_steps=s["num_steps"], num_minibatches=s["num_minibatches"],
                       update_epochs=s["update_epochs"], hidden_size=s["width"], num_layers=3, network="mlp",
                       total_timesteps=num_envs * s["num_steps"] * max(s["updates"], 2), lr=s["lr"])
    trainer = make_train(config)
    bf16_net = make_train(dataclasses.replace(config, matmul_dtype="bfloat16"))
    T, N, M, E = config.num_steps, num_envs, config.num_minibatches, config.update_epochs
    obs_dim = trainer.env.observation_space(trainer.env_params).shape[0]
    n_actions = trainer.env.action_space(trainer.env_params).n
    params = trainer.network.init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))["params"]
    B = N * T // M
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    mbs = (Transition((jax.random.uniform(k[0], (M, B, obs_dim)) < 0.05).astype(jnp.float32),
                      jax.random.randint(k[1], (M, B), 0, n_actions), jnp.full((M, B), -jnp.log(n_actions)),
                      jnp.zeros((M, B)), jnp.zeros((M, B)), jnp.zeros((M, B), bool), jnp.zeros((M, B), bool),
                      jnp.zeros((M, B))), jax.random.normal(k[2], (M, B)), jax.random.normal(k[3], (M, B)))

    def cast(tree, dtype):
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def loss(params, traj, adv, targets, dtype, net=trainer):
        traj = traj._replace(obs=traj.obs.astype(dtype))
        pi, value = net._evaluate(cast(params, dtype), {}, traj, None)
        log_prob, entropy = pi.log_prob(traj.action), pi.entropy()
        from jaxrl_hier.algorithms.ppo import ppo_loss

        return ppo_loss(log_prob.astype(jnp.float32), entropy.astype(jnp.float32), value.astype(jnp.float32),
                        traj.log_prob, traj.value, adv, targets, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)

    def fwd_bwd(dtype, net=trainer):
        def run(params, mbs):
            def body(_, mb):
                return None, jax.grad(lambda p: loss(p, *mb, dtype, net)[0])(params)

            return jax.lax.scan(body, None, mbs)[1]

        return run

    def rollout_forward(dtype, net=trainer):
        def run(params, obs, key):
            def body(_, x):
                pi, value = net.apply(cast(params, dtype), {}, x[0].astype(dtype))
                a = pi.sample(seed=x[1])
                return None, (a, pi.log_prob(a).astype(jnp.float32), value.astype(jnp.float32))

            return jax.lax.scan(body, None, (obs, jax.random.split(key, T)))[1]

        return run

    tx = trainer.optimizer()

    def optimise(flat: bool):
        def run(params, grads):
            if flat:
                vec, unravel = jax.flatten_util.ravel_pytree(params)
                gvec = jax.vmap(lambda g: jax.flatten_util.ravel_pytree(g)[0])(grads)
                state = tx.init(vec)

                def body(carry, g):
                    p, o = carry
                    u, o = tx.update(g, o, p)
                    return (optax.apply_updates(p, u), o), None

                return unravel(jax.lax.scan(body, (vec, state), gvec)[0][0])
            state = tx.init(params)

            def body(carry, g):
                p, o = carry
                u, o = tx.update(g, o, p)
                return (optax.apply_updates(p, u), o), None

            return jax.lax.scan(body, (params, state), grads)[0][0]

        return run

    rollout_obs = mbs[0].obs.reshape((T, N, obs_dim))
    grads = jax.jit(fwd_bwd(jnp.float32))(params, mbs)
    rows = []
    for piece, fn, args, times in [
        ("forward + backward (epochs), float32", fwd_bwd(jnp.float32), (params, mbs), E),
        ("forward + backward (epochs), bf16 matmuls", fwd_bwd(jnp.bfloat16), (params, mbs), E),
        ("forward + backward (epochs), matmul_dtype bfloat16", fwd_bwd(jnp.float32, bf16_net), (params, mbs), E),
        ("policy forward (rollout), float32", rollout_forward(jnp.float32), (params, rollout_obs, k[0]), 1),
        ("policy forward (rollout), bf16 matmuls", rollout_forward(jnp.bfloat16), (params, rollout_obs, k[0]), 1),
        ("policy forward (rollout), matmul_dtype bfloat16", rollout_forward(jnp.float32, bf16_net),
         (params, rollout_obs, k[0]), 1),
        ("optimiser (epochs), per-leaf arrays", optimise(False), (params, grads), E),
        ("optimiser (epochs), one flat vector", optimise(True), (params, grads), E),
    ]:
        c = jax.jit(fn).lower(*args).compile()
        rows.append({"piece": piece, "s_per_update": _best(c, *args, turn=turn) * times})
        log(f"  {piece:45s} {rows[-1]['s_per_update'] * 1e3:9.1f} ms")
    return {"env": env, "num_envs": num_envs, **s, "rows": rows, "loadavg": os.getloadavg()[0]}


def _flags(info: dict) -> str:
    """", with avx2 fma avx512f ..." for a CPU device whose vector extensions were recorded."""
    return f", with {info['cpu_flags']}" if info.get("cpu_flags") and info.get("device", "").startswith("cpu") else ""


def write_profile(result: dict, out: Path) -> None:
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "ppo_profile.json", result)
    profs = result["profiles"]
    lines = ["| piece | " + " | ".join(f"{p['env']}, {p['num_envs']:,} envs: ms | share" for p in profs) + " |",
             "|---|" + "---:|---:|" * len(profs)]
    for i, row in enumerate(profs[0]["pieces"]):
        cells = [f"{p['pieces'][i]['s_per_update'] * 1e3:,.1f} | {100 * p['pieces'][i]['share_of_sum']:.0f}%"
                 for p in profs]
        lines.append(f"| {row['piece']} | " + " | ".join(cells) + " |")
    lines.append("| sum of the pieces | " + " | ".join(f"{p['sum_s'] * 1e3:,.1f} | 100%" for p in profs) + " |")
    lines.append("| whole update (compiled chunk) | " + " | ".join(
        f"{p['whole_update_s'] * 1e3:,.1f} | {p['whole_fps']:,.0f} steps/s" for p in profs) + " |")
    s, info = profs[0], result["device"]
    lines += ["", f"One PPO update of each column's envs x {s['num_steps']} steps, {s['update_epochs']} epochs x "
              f"{s['num_minibatches']} minibatches, width {s['width']} (3 layers); each piece compiled apart and timed "
              f"(best of 3; env stepping: the mean of 8 chained calls after {result['warmup_steps']} warm-up steps). "
              f"Device {info.get('device')} ({info.get('cpu_model')}, {info.get('cpu_count')} cores{_flags(info)}), jax {info.get('jax')}; "
              f"{result.get('date', '')}."]
    if result.get("note"):
        lines.append(result["note"])
    atomic_write_text(out / "ppo_profile.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peer-dir", type=Path, help="a local checkout of Craftax_Baselines")
    parser.add_argument("--envs", nargs="+", default=["Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1"])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256])
    parser.add_argument("--points", nargs="+", default=None, metavar="ENV:N[:SYSTEMS]",
                        help="the (env, num_envs) points in this order, instead of every --envs x --num-envs; "
                             "SYSTEMS names the point's own, joined by + (ours, peer, env_only)")
    parser.add_argument("--env-only", action="store_true",
                        help="time our env stepping alone over the same steps beside both systems")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no new point after this many seconds (compilation included); finished points "
                             "are written as they end")
    parser.add_argument("--num-steps", type=int, default=16)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--updates", type=int, default=20, help="PPO updates per timed call (20+: episodes end)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--reset-ratio", type=int, default=16)
    parser.add_argument("--matmul-dtype", choices=MATMUL_DTYPES, default="float32",
                        help="our MLP's matrix products (PPOConfig.matmul_dtype); the peer's stay float32")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per side (alternating), best kept")
    parser.add_argument("--compile-workers", type=int, default=1,
                        help="compile every point's programs ahead in this many threads (a GPU host's spare cores)")
    parser.add_argument("--peer-commit", default=None, help="the peer checkout's commit, where it is no git checkout")
    parser.add_argument("--check", action="store_true", help="exit 1 when ours is slower than the peer anywhere")
    parser.add_argument("--append", action="store_true", help="keep the records already in OUT/ppo_vs_peer.json")
    parser.add_argument("--profile", action="store_true", help="time the pieces of our update instead")
    parser.add_argument("--levers", action="store_true", help="time the speed levers on the update's pieces instead")
    parser.add_argument("--profile-warmup", type=int, default=400)
    parser.add_argument("--turn-lock", type=Path, default=None,
                        help="--profile/--levers: a lock file shared with other profiling processes, held around "
                             "every timed call (they compile at once, time one at a time)")
    parser.add_argument("--gate", type=Path, default=None,
                        help="--profile: once its large programs are compiled, wait for an exclusive lock on this "
                             "file (other profiling processes hold it shared while they run) before using the device")
    parser.add_argument("--merge-profiles", type=Path, nargs="+", default=None, metavar="JSON",
                        help="write one table in OUT from the ppo_profile.json files of several --profile runs")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    args = parser.parse_args(argv)
    s = settings(args)
    info = device_info()
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")

    turn = turn_lock(args.turn_lock)
    if args.merge_profiles:
        parts = [json.loads(f.read_text()) for f in args.merge_profiles]
        write_profile({**parts[0], "profiles": [p for part in parts for p in part["profiles"]]}, args.out)
        print(f"wrote {args.out}/ppo_profile.json, .md", file=sys.stderr)
        return 0
    if args.levers:
        res = []
        for env in args.envs:
            for n in args.num_envs:
                print(f"levers {env} N={n}", flush=True)
                res.append(levers(env, n, s, turn=turn))
        from jaxrl_hier.io import atomic_write_json, atomic_write_text

        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / "ppo_levers.json", {"levers": res, "device": info, "date": args.date})
        lines = ["| piece | " + " | ".join(f"{r['env']} ms" for r in res) + " |", "|---|" + "---:|" * len(res)]
        for i, row in enumerate(res[0]["rows"]):
            lines.append(f"| {row['piece']} | " + " | ".join(f"{r['rows'][i]['s_per_update'] * 1e3:,.1f}" for r in res)
                         + " |")
        lines += ["", f"Per PPO update of {res[0]['num_envs']} envs x {s['num_steps']} steps ({s['update_epochs']} epochs x "
                  f"{s['num_minibatches']} minibatches, width {s['width']}), each form compiled apart, best of 3. "
                  f"Device {info.get('device')} ({info.get('cpu_model')}, {info.get('cpu_count')} cores{_flags(info)}), "
                  f"jax {info.get('jax')}; {args.date}."]
        atomic_write_text(args.out / "ppo_levers.md", "\n".join(lines) + "\n")
        return 0

    if args.profile:
        profs = []
        for env in args.envs:
            for n in args.num_envs:
                print(f"profile {env} N={n}", flush=True)
                profs.append(profile(env, n, s, args.profile_warmup, turn=turn, ready=lambda: wait_for(args.gate)))
                write_profile({"profiles": profs, "device": info, "warmup_steps": args.profile_warmup,
                               "date": args.date}, args.out)
        print(f"wrote {args.out}/ppo_profile.json, .md", file=sys.stderr)
        return 0

    if args.peer_dir is None:
        parser.error("--peer-dir is required (a local checkout of Craftax_Baselines)")
    module = load_peer(args.peer_dir)
    result = {"records": [], "settings": s, "device": info, "peer_dir": str(args.peer_dir),
              "peer_commit": args.peer_commit or peer_version(args.peer_dir), "date": args.date}
    if args.append and (args.out / "ppo_vs_peer.json").exists():
        old = json.loads((args.out / "ppo_vs_peer.json").read_text())
        result["records"] = old.get("records", [])
    log = lambda m: print(m, flush=True)  # noqa: E731
    order = (OURS, PEER, ENV_ONLY) if args.env_only else (OURS, PEER)
    points = (parse_points(args.points, order) if args.points
              else [(env, n, order) for env in args.envs for n in args.num_envs])
    t_start = time.perf_counter()
    sides = build_sides(points, s, module, workers=args.compile_workers, log=log) if args.compile_workers > 1 else None
    result["pairs"] = pairs(result["records"])
    for env, n, systems in points:
        if args.deadline_s is not None and time.perf_counter() - t_start > args.deadline_s:
            print(f"{env} N={n}: skipped, past the {args.deadline_s:.0f} s deadline", flush=True)
            continue
        print(f"{env} N={n}", flush=True)
        try:
            new = run_point(env, n, s, module, repeats=args.repeats, order=systems, log=log, sides=sides)
        except Exception as e:  # noqa: BLE001  (recorded; the other points still run)
            print(f"  failed: {e!r:.300}", flush=True)
            new = [{"system": system, "env": env, "num_envs": n, **s, "error": point_error(e, system)}
                   for system in systems]
        keys = {(r["system"], r["env"], r["num_envs"]) for r in new}
        result["records"] = [r for r in result["records"] if (r["system"], r["env"], r["num_envs"]) not in keys] + new
        result["pairs"] = pairs(result["records"])
        write_outputs(result, args.out)
        if sides is not None:  # the point's programs are done with: their memory goes back
            for system in systems:
                sides.pop((system, env, n), None)
    write_outputs(result, args.out)  # also when every point was skipped
    for p in result["pairs"]:
        print(f"{p['env']} N={p['num_envs']}: ours {p['ours_fps']:,.0f} steps/s"
              + (f"; ours/peer {p['ratio']:.2f}x (peer {p['peer_fps']:,.0f})" if "ratio" in p else "")
              + (f"; ours/env-only {p['of_env_only']:.2f}x" if "of_env_only" in p else ""))
    print(f"wrote {args.out}/ppo_vs_peer.json, .md, .png", file=sys.stderr)
    if args.check:
        failures = check(result["pairs"])
        for f in failures:
            print(f"check failed: {f}", file=sys.stderr)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
