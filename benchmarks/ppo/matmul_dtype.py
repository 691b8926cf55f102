"""Does PPO learn the same with its MLP's products in bfloat16? Float32 and bfloat16 side by side, the
same config and seeds, in one process: return curves, final returns, speed.

    python benchmarks/ppo/matmul_dtype.py --out benchmarks/results/cpu_avx512/matmul_dtype \
        [--config ppo_default] [--seeds 3] [key=value ...]

Each arm is the config (by default the main job's, `configs/ppo_default.yaml`) with `matmul_dtype`
set, its seeds vmapped in one program (`num_seeds`; seed s of both arms starts from the same key,
so from the same parameters and worlds), compiled ahead (compile time recorded apart), then run once
over the whole `total_timesteps`. A speed lever may be used only if learning stays the same; here
that means: each bfloat16 seed's final return (mean episode return over the last tenth of its
updates) lies within the float32 seeds' range widened by their standard deviation, and the two
arms' means differ by less than the float32 seeds' spread. The JSON records both and the curves;
the plot shows each arm's mean and range over seeds. `--check` exits 1 when learning differs.

Writes OUT/matmul_dtype.json, OUT/matmul_dtype.md and OUT/matmul_dtype.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import jaxrl_hier  # noqa: E402,F401  (sets XLA flags before JAX starts)
import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_hier.algorithms.ppo import PPOConfig, make_train, summarize  # noqa: E402
from jaxrl_hier.bench import device_info  # noqa: E402
from jaxrl_hier.config import ConfigError, load_config  # noqa: E402
from jaxrl_hier.io import atomic_write_json, atomic_write_text  # noqa: E402
from jaxrl_hier.networks.precision import MATMUL_DTYPES  # noqa: E402


def run_arm(config: PPOConfig, log=print) -> dict:
    """One arm: compiled ahead, then the whole run timed; curves are [updates, seeds]."""
    trainer = make_train(config)
    key = jax.random.PRNGKey(config.seed)
    t0 = time.perf_counter()
    runner = trainer.init(key)
    compiled = trainer._compiled_chunk(config.num_updates, runner).lower(runner).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, raw = jax.block_until_ready(compiled(runner))
    run_s = time.perf_counter() - t0
    curves = np.asarray(summarize(raw)["episode_return"], dtype=np.float64)  # [updates, seeds]
    tail = max(1, config.num_updates // 10)
    final = np.nanmean(curves[-tail:], axis=0)
    steps = config.num_updates * config.steps_per_update
    log(f"  {config.matmul_dtype}: compile {compile_s:.1f} s, run {run_s:.1f} s ({steps / run_s:,.0f} env steps/s), "
        f"final return by seed {np.round(final, 2).tolist()}")
    return {"matmul_dtype": config.matmul_dtype, "compile_s": compile_s, "run_s": run_s, "env_steps": steps,
            "fps": steps / run_s, "final_return": final.tolist(), "tail_updates": tail,
            "curve": np.where(np.isnan(curves), None, curves).tolist()}


def compare(f32: dict, bf16: dict) -> dict:
    """Learning the same: every bf16 seed within the f32 seeds' range widened by their standard
    deviation, and the means apart by less than that standard deviation."""
    a, b = np.asarray(f32["final_return"]), np.asarray(bf16["final_return"])
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    lo, hi = float(a.min()) - sd, float(a.max()) + sd
    within = bool(np.all((b >= lo) & (b <= hi)))
    gap = float(b.mean() - a.mean())
    return {"float32_mean": float(a.mean()), "float32_sd": sd, "bfloat16_mean": float(b.mean()),
            "bfloat16_sd": float(b.std(ddof=1)) if b.size > 1 else 0.0, "band": [lo, hi],
            "every_bf16_seed_in_band": within, "mean_gap": gap, "same": within and abs(gap) < max(sd, 1e-9),
            "speedup": bf16["fps"] / f32["fps"]}


def write_outputs(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "matmul_dtype.json", result)
    c, info, cfg = result["comparison"], result["device"], result["config"]
    lines = ["| matmul dtype | env steps/s | compile s | run s | final return by seed | mean ± s.d. |",
             "|---|---:|---:|---:|---|---:|"]
    for arm in result["arms"]:
        fr = np.asarray(arm["final_return"])
        sd = fr.std(ddof=1) if fr.size > 1 else 0.0
        lines.append(f"| {arm['matmul_dtype']} | {arm['fps']:,.0f} | {arm['compile_s']:.1f} | {arm['run_s']:.1f} | "
                     f"{', '.join(f'{x:.2f}' for x in fr)} | {fr.mean():.2f} ± {sd:.2f} |")
    lines += ["", f"bfloat16 / float32 env steps/s: {c['speedup']:.2f}x. Learning the same: "
              f"{'yes' if c['same'] else 'no'} (every bfloat16 seed within the float32 range ± its s.d. "
              f"[{c['band'][0]:.2f}, {c['band'][1]:.2f}]: {c['every_bf16_seed_in_band']}; means apart by "
              f"{c['mean_gap']:+.2f} against the float32 s.d. {c['float32_sd']:.2f}).",
              f"{cfg['env']}, {result['env_steps']:,} env steps a seed, {cfg['num_seeds']} seeds vmapped, "
              f"{cfg['num_envs']} envs x {cfg['num_steps']} steps, width {cfg['hidden_size']} x {cfg['num_layers']}; "
              f"final return: the mean episode return over each seed's last {result['arms'][0]['tail_updates']} "
              f"updates. Device {info.get('device')} ({info.get('cpu_model')}, {info.get('cpu_count')} cores"
              f"{', with ' + info['cpu_flags'] if info.get('cpu_flags') else ''}), "
              f"jax {info.get('jax')}, flax {info.get('flax')}; {result['date']}."]
    atomic_write_text(out / "matmul_dtype.md", "\n".join(lines) + "\n")

    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    per_update = result["steps_per_update_per_seed"]
    for arm in result["arms"]:
        curve = np.asarray(arm["curve"], dtype=np.float64)
        seen = ~np.all(np.isnan(curve), axis=1)  # the first updates, where no episode has ended yet
        x = np.arange(1, curve.shape[0] + 1)[seen] * per_update
        curve = curve[seen]
        ax.plot(x, np.nanmean(curve, axis=1), label=f"{arm['matmul_dtype']} (mean of seeds)")
        ax.fill_between(x, np.nanmin(curve, axis=1), np.nanmax(curve, axis=1), alpha=0.2)
    ax.set(xlabel="env steps (a seed)", ylabel="mean episode return", title=f"{cfg['env']}: PPO, products in f32 vs bf16")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{info.get('device')} ({info.get('cpu_model')}), jax {info.get('jax')}", fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "matmul_dtype.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default="ppo_default", help="a PPO config file or packaged config name")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of each arm, vmapped in one program")
    parser.add_argument("--check", action="store_true", help="exit 1 unless bfloat16 learns as float32 does")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    args = parser.parse_args(argv)
    try:
        base = load_config(PPOConfig, args.config, args.overrides)
        base = dataclasses.replace(base, num_seeds=args.seeds, checkpoint_every=0)
        configs = [dataclasses.replace(base, matmul_dtype=d) for d in MATMUL_DTYPES]
        for c in configs:
            c.validate()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = device_info()
    print(f"{base.env}, {base.num_updates} updates x {base.steps_per_update:,} env steps, {args.seeds} seeds", flush=True)
    arms = [run_arm(c) for c in configs]
    comparison = compare(*arms)
    result = {"arms": arms, "comparison": comparison, "config": dataclasses.asdict(base), "device": info,
              "env_steps": base.num_updates * base.num_envs * base.num_steps,
              "steps_per_update_per_seed": base.num_envs * base.num_steps, "date": args.date}
    write_outputs(result, args.out)
    print(open(args.out / "matmul_dtype.md").read(), flush=True)
    if args.check and not comparison["same"]:
        print("check failed: bfloat16 products did not learn as float32 does", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
