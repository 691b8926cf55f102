"""Mixture-of-experts cost against the number of experts: gather (only each row's expert) vs mask
(every expert on every row, as Flow-RL does).

For E = 1 .. 32 experts, `rows` env rows routed uniformly at random, expert MLPs shaped like the
skills policy on Craftax-Classic (obs 1345 -> hidden x layers -> 17 actions), it times:
- `forward`: the routed actor logits (the rollout's cost per env step);
- `grad`: forward and backward through the mixture with respect to the trainable expert (the
  update's cost);
- `bank grad`: forward and backward with respect to every expert of the bank, as chain fine-tuning
  trains them (`skills.chain`), `gather` at each of `--block-sizes` (rows per block; default: the
  dispatch's own choice), both as the block loop the rollout acts with and as the batched blocks
  (`gather (batched)`) the chain trains through.
Compile time is recorded apart from the best of `--repeats` steady runs.

    python benchmarks/skills/moe.py --out benchmarks/results/cpu [--rows 1024] [--experts 1 2 4 8 16 32]

Writes `moe.json` (device, versions, records) and `moe.png`.

With `--active` it times instead the rollout's acting forward of a skill with `--experts` frozen
dependency experts and a new one, as the share of rows the frozen experts act on grows
(`--shares`, rows picked at random, each routed to a random frozen expert): every expert on every row
(the bank with the new expert appended, as the policy ran before, beside the new expert's dense pass
that its log-probs need) against that dense pass plus the frozen experts on their own rows only
(`skills.moe.mixture_apply_active`, as `MoEPolicy` runs now), for both dispatches. TechTree's shapes:

    python benchmarks/skills/moe.py --active --out DIR --rows 64 --obs-dim 1190 --hidden 64 --actions 10 --experts 8

Writes `moe_active.json` and `moe_active.png`.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import jax.numpy as jnp

from jaxrl_hier.bench import device_info, time_compiled
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.skills.moe import (default_block_size, init_mlp, mixture_apply_active, mixture_apply_gather,
                                   mixture_apply_mask, mlp_apply, stack_experts)

# "gather (batched)": every block at once, the form chain fine-tuning trains through (every expert trains)
DISPATCH = {"gather": mixture_apply_gather, "gather (batched)": partial(mixture_apply_gather, batched=True),
            "mask": mixture_apply_mask}


def measure(experts: int, rows: int, obs_dim: int, hidden: int, layers: int, actions: int, repeats: int,
            block_sizes: list[int | None] = (None,)) -> list[dict]:
    key = jax.random.key(experts)
    sizes = [obs_dim] + [hidden] * layers + [actions]
    frozen = (stack_experts([init_mlp(jax.random.fold_in(key, i), sizes, 0.01) for i in range(experts - 1)])
              if experts > 1 else None)
    new = init_mlp(jax.random.fold_in(key, 1000), sizes, 0.01)
    x = jax.random.normal(jax.random.fold_in(key, 1), (rows, obs_dim))
    idx = jax.random.randint(jax.random.fold_in(key, 2), (rows,), 0, experts)

    def bank_of(new_expert):
        if frozen is None:
            return jax.tree.map(lambda w: w[None], new_expert)
        return jax.tree.map(lambda f, n: jnp.concatenate([jax.lax.stop_gradient(f), n[None]]), frozen, new_expert)

    out = []
    for name, apply in DISPATCH.items():
        def forward(new_expert, x, idx, apply=apply):
            return apply(bank_of(new_expert), x, idx, jnp.tanh)

        def grad(new_expert, x, idx, apply=apply):
            return jax.grad(lambda p: jnp.sum(apply(bank_of(p), x, idx, jnp.tanh) ** 2))(new_expert)

        def bank_grad(new_expert, x, idx, apply=apply, block_size=None):
            mix = partial(apply, block_size=block_size) if block_size else apply
            # differentiated with respect to the whole bank, frozen rows included
            return jax.grad(lambda b: jnp.sum(mix(b, x, idx, jnp.tanh) ** 2))(bank_of(new_expert))

        gathers = name.startswith("gather")
        blocks = block_sizes if gathers else (None,)
        for workload, fn, bs in (("forward", forward, None), ("grad", grad, None),
                                 *(("bank grad", partial(bank_grad, block_size=b), b) for b in blocks)):
            compile_s, run_s = time_compiled(jax.jit(fn), new, x, idx, repeats=repeats)
            block = (bs or default_block_size(rows, experts)) if gathers else None
            out.append({"dispatch": name, "workload": workload, "experts": experts, "rows": rows, "run_s": run_s,
                        "compile_s": compile_s, "rows_per_s": rows / run_s, "block_size": block})
            print(f"E={experts:2d} {name:6s} {workload:9s} {'' if block is None else f'block {block:3d}'} "
                  f"{run_s * 1e3:8.2f} ms (compile {compile_s:.1f} s)", flush=True)
    return out


def measure_active(experts: int, rows: int, obs_dim: int, hidden: int, layers: int, actions: int, repeats: int,
                   shares: list[float]) -> list[dict]:
    key = jax.random.key(experts)
    sizes = [obs_dim] + [hidden] * layers + [actions]
    frozen = stack_experts([init_mlp(jax.random.fold_in(key, i), sizes, 0.01) for i in range(experts)])
    new = init_mlp(jax.random.fold_in(key, 1000), sizes, 0.01)
    x = jax.random.normal(jax.random.fold_in(key, 1), (rows, obs_dim))
    out = []
    for share in shares:
        k_rows, k_expert = jax.random.split(jax.random.fold_in(key, int(share * 1e6)))
        is_frozen = jax.random.permutation(k_rows, rows) < round(share * rows)
        idx = jnp.where(is_frozen, jax.random.randint(k_expert, (rows,), 0, experts), experts)
        for name, apply in DISPATCH.items():
            def every_row(new_expert, x, idx, apply=apply):  # and the new expert's own pass (its log-probs)
                bank = jax.tree.map(lambda f, n: jnp.concatenate([f, n[None]]), frozen, new_expert)
                return apply(bank, x, idx, jnp.tanh), mlp_apply(new_expert, x, jnp.tanh)

            def active_rows(new_expert, x, idx, apply=apply):
                routed = mixture_apply_active(frozen, x, idx, idx < experts, jnp.tanh, apply)
                return jnp.where((idx < experts)[:, None], routed, mlp_apply(new_expert, x, jnp.tanh))

            for form, fn in (("every row", every_row), ("active rows", active_rows)):
                compile_s, run_s = time_compiled(jax.jit(fn), new, x, idx, repeats=repeats)
                out.append({"dispatch": name, "form": form, "frozen_share": share, "frozen_rows": int(is_frozen.sum()),
                            "experts": experts, "rows": rows, "run_s": run_s, "compile_s": compile_s})
                print(f"share {share:.3f} {name:6s} {form:11s} {run_s * 1e3:8.3f} ms (compile {compile_s:.1f} s)",
                      flush=True)
    return out


def plot_active(records: list[dict], path: Path, title: str) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 4))
    for name in DISPATCH:
        for form, style in (("every row", "--"), ("active rows", "-")):
            pts = sorted((r["frozen_share"], r["run_s"] * 1e3) for r in records
                         if r["dispatch"] == name and r["form"] == form)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"{name}, {form}")
    ax.set(xlabel="share of rows a frozen expert acts on", ylabel="ms per call", title=title)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib.ticker

    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, workload in zip(axes, ("forward", "grad", "bank grad")):
        for name, marker in (("gather", "o"), ("gather (batched)", "^"), ("mask", "s")):
            best: dict = {}  # gather's bank grad at its best block size
            for r in records:
                if r["dispatch"] == name and r["workload"] == workload:
                    best[r["experts"]] = min(best.get(r["experts"], float("inf")), r["run_s"] * 1e3)
            pts = sorted(best.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=name)
        ax.set(xscale="log", yscale="log", xlabel="experts", ylabel="ms per call", title=f"{workload} ({title})")
        ax.set_xticks([r["experts"] for r in records if r["dispatch"] == "gather" and r["workload"] == workload])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    p.add_argument("--experts", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--rows", type=int, default=1024, help="env rows per call (num_envs)")
    p.add_argument("--obs-dim", type=int, default=1345, help="Craftax-Classic symbolic observation size")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--actions", type=int, default=17)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--active", action="store_true",
                   help="time the acting forward against the share of rows frozen experts act on (see above)")
    p.add_argument("--shares", type=float, nargs="+", default=[0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0])
    p.add_argument("--block-sizes", type=int, nargs="+", default=None,
                   help="gather's rows per block for the bank grad (default: its own choice)")
    args = p.parse_args(argv)
    if min(args.experts) < 1 or args.rows < 1 or min(args.block_sizes or [1]) < 1:
        print("error: --experts, --rows and --block-sizes must be positive", file=sys.stderr)
        return 2
    if not all(0.0 <= s <= 1.0 for s in args.shares):
        print("error: --shares must lie between 0 and 1", file=sys.stderr)
        return 2
    if args.active:
        experts = max(args.experts)
        records = measure_active(experts, args.rows, args.obs_dim, args.hidden, args.layers, args.actions,
                                 args.repeats, args.shares)
        info = device_info() | {"rows": args.rows, "obs_dim": args.obs_dim, "hidden": args.hidden,
                                "layers": args.layers, "actions": args.actions, "frozen_experts": experts}
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / "moe_active.json", {"info": info, "records": records})
        plot_active(records, args.out / "moe_active.png", f"{info['device']}, {args.rows} rows, {experts} frozen")
        print(f"wrote {args.out / 'moe_active.json'} and moe_active.png")
        return 0
    records = []
    for e in args.experts:
        records += measure(e, args.rows, args.obs_dim, args.hidden, args.layers, args.actions, args.repeats,
                           args.block_sizes or [None])
    info = device_info() | {"rows": args.rows, "obs_dim": args.obs_dim, "hidden": args.hidden,
                            "layers": args.layers, "actions": args.actions}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "moe.json", {"info": info, "records": records})
    plot(records, args.out / "moe.png", f"{info['device']}, {args.rows} rows")
    print(f"wrote {args.out / 'moe.json'} and moe.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
