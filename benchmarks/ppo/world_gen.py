"""Fresh worlds generated in one batch: are they right, and what does each cost?

    python benchmarks/ppo/world_gen.py --out DIR [--env Craftax-Classic-Symbolic-v1] [--worlds 128]
        [--blocks 1 4 8 16 32 64 128] [--check]

For `--worlds` keys, the world each key makes alone (`env.reset(key, params)`, one compiled call
per key) is the reference. Then, for each block size B, the same keys' worlds generated as
`jaxrl_hier.envs.reset_many` does with that block (a vmap over rows of B worlds inside a vmap over
the rows; B = worlds: one flat vmap of them all), in two settings: alone (a program of its own, as
an evaluation's fresh worlds) and under a vmap of one (the trainers' seed axis, as a PPO runner's
pool refill): how many equal their reference world (every field of the state; floats to a relative 1e-5), and the
microseconds a world costs (the best of `--repeats` calls of the compiled batch; compile apart).
`reset_many`'s own choice on this backend is timed and checked beside them.

Writes DIR/world_gen.json, DIR/world_gen.md and DIR/world_gen.png (microseconds a world against
the block size, in both settings). `--check` exits 1 when `reset_many` gives any world other than its key's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.bench import device_info, time_compiled
from jaxrl_hier.envs import make, reset_many
from jaxrl_hier.envs.vec import default_reset_block
from jaxrl_hier.io import atomic_write_json, atomic_write_text
from jaxrl_hier.logging.plots import pyplot, save_figure


def leaves(state) -> list[np.ndarray]:
    """The state's leaves as host arrays (PRNG keys as their data), each with the world axis first."""
    out = []
    for leaf in jax.tree.leaves(state):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out.append(np.asarray(leaf))
    return out


def own_worlds(state, reference: list[np.ndarray]) -> int:
    """How many worlds equal their reference: integer and boolean fields exactly, float fields to a
    relative 1e-5 (a field computed from params that a program holds as constants in one setting and
    as inputs in the other, such as the light level, may round differently)."""
    same = np.ones(reference[0].shape[0], bool)
    for got, want in zip(leaves(state), reference):
        got, want = got.reshape(got.shape[0], -1), want.reshape(want.shape[0], -1)
        if np.issubdtype(want.dtype, np.floating):
            same &= np.isclose(got, want, rtol=1e-5, atol=1e-6).all(axis=1)
        else:
            same &= (got == want).all(axis=1)
    return int(same.sum())


def measure(env, params, keys: jax.Array, block: int | None, reference: list[np.ndarray], repeats: int) -> dict:
    row = {"block": block, "worlds": int(keys.shape[0])}
    seed_params = jax.tree.map(lambda x: jnp.asarray(x)[None], params)
    settings = {"alone": lambda ks: reset_many(env, params, ks, block)[1],
                "seed_vmap": lambda ks: jax.tree.map(lambda x: x[0], jax.vmap(
                    lambda p, k: reset_many(env, p, k, block)[1])(seed_params, ks[None]))}
    for name, fn in settings.items():
        fn = jax.jit(fn)
        compile_s, best_s = time_compiled(fn, keys, repeats=repeats)
        row[name] = {"compile_s": compile_s, "batch_s": best_s, "us_per_world": 1e6 * best_s / keys.shape[0],
                     "own_world": own_worlds(fn(keys), reference)}
    return row


def table(result: dict) -> str:
    info = result["device"]
    lines = [f"# Fresh worlds in one batch: {result['env']}", "",
             f"{info.get('cpu_model') or info.get('device_kind')} ({info.get('cpu_flags', '')}), jax {info['jax']}, "
             f"{result['worlds']} worlds from `--seed {result['seed']}`; reset_many's block here: {result['reset_many_block']}.",
             "", "Alone: a program of its own (an evaluation's fresh worlds); under a seed vmap: as a trainer's pool refill.",
             "", "| block | us a world, alone | own worlds, alone | us a world, under a seed vmap | own worlds, under a seed vmap |",
             "|---:|---:|---:|---:|---:|"]
    rows = [(str(r["block"]), r) for r in result["blocks"]]
    rows.append((f"reset_many ({result['reset_many_block'] or 'all'})", result["reset_many"]))
    for label, r in rows:
        a, v = r["alone"], r["seed_vmap"]
        lines.append(f"| {label} | {a['us_per_world']:,.0f} | {a['own_world']} of {r['worlds']} "
                     f"| {v['us_per_world']:,.0f} | {v['own_world']} of {r['worlds']} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    blocks = [r["block"] for r in result["blocks"]]
    for setting, label in (("alone", "alone"), ("seed_vmap", "under a seed vmap")):
        us = [r[setting]["us_per_world"] for r in result["blocks"]]
        ax.plot(blocks, us, "o-", label=label)
        for r, y in zip(result["blocks"], us):
            if r[setting]["own_world"] < r["worlds"]:
                ax.annotate(f"{r[setting]['own_world']}/{r['worlds']} right", (r["block"], y), fontsize=7)
    ax.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("worlds vmapped together (block)")
    ax.set_ylabel("us a world")
    ax.set_title(f"{result['env']}: one batch of {result['worlds']} fresh worlds", fontsize=9)
    save_figure(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--env", default="Craftax-Classic-Symbolic-v1")
    ap.add_argument("--worlds", type=int, default=128)
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.worlds < 1 or args.repeats < 1 or any(b < 1 or b > args.worlds for b in args.blocks):
        print("world_gen: --worlds and --repeats must be positive and every block within 1..--worlds.", file=sys.stderr)
        return 2
    env, params = make(args.env)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.worlds)
    alone = jax.jit(lambda k: env.reset(k, params)[1])
    worlds = [leaves(alone(k)) for k in keys]
    reference = [np.stack(leaf) for leaf in zip(*worlds)]
    result = {"env": args.env, "worlds": args.worlds, "seed": args.seed, "device": device_info(),
              "reset_many_block": default_reset_block(), "blocks": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for b in sorted(set(args.blocks)):
        result["blocks"].append(measure(env, params, keys, b, reference, args.repeats))
        r = result["blocks"][-1]
        print(f"block {b}: alone {r['alone']['us_per_world']:,.0f} us a world, {r['alone']['own_world']} right; "
              f"under a seed vmap {r['seed_vmap']['us_per_world']:,.0f}, {r['seed_vmap']['own_world']} right", flush=True)
    result["reset_many"] = measure(env, params, keys, None, reference, args.repeats)
    atomic_write_json(args.out / "world_gen.json", result)
    atomic_write_text(args.out / "world_gen.md", table(result))
    plot(result, args.out / "world_gen.png")
    print(table(result))
    if args.check and min(result["reset_many"][k]["own_world"] for k in ("alone", "seed_vmap")) < args.worlds:
        print("world_gen: reset_many gave worlds other than their keys' own.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
