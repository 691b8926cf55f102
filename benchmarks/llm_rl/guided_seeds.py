"""The guided agent's shipped configs at several seeds, on their evaluation episodes.

    python benchmarks/llm_rl/guided_seeds.py --out DIR [--configs configs/guided_arithmetic.yaml
        configs/guided_game.yaml] [--seeds 0 1 2]

For each config and seed, `python -m jaxrl_hier.train --config CONFIG seed=S` in DIR/<config>/seed<S>
(resumed or skipped where a killed sweep left it: `bench.train_run`). No setting is chosen here: the
figures are the configs' as shipped, greedy, on each run's test episodes, which a run plays twice:
with the warm-start (iteration 0) and with the trained agent (the last iteration) (`eval_episodes`
distinct test problems for the two-turn task; for guess-the-number every secret of 1..game_high
once, the training range, since the game has no held-out secrets: see `GuessNumberEnv`). Writes
DIR/guided_seeds.json (every run's evaluations, and per config and metric the mean and standard
error over seeds after SFT, after RL and the change), DIR/guided_seeds.md and DIR/guided_seeds.png
(the config's headline metric on validation against iterations, the curve runs watch, mean and
standard error over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SHARES = {"turn2_accuracy", "turn1_accuracy", "accuracy_gain", "success", "accuracy", "call_rate"}  # shown in %


def metrics(env: str) -> tuple[str, ...]:
    """The evaluation metrics reported for an env (the first is the plot's): its class's METRICS."""
    from jaxrl_hier.llm_rl.guided import env_class

    return tuple(key for key, _ in env_class(env).METRICS)


def evaluations(out: Path) -> dict:
    """The run's env, its greedy test evaluations (iteration 0: the warm-start; the last) and their episode
    count, and its validation curve of the env's headline metric."""
    from jaxrl_hier.config import read_yaml

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    env = read_yaml(out / "config.yaml").get("env", "two_turn")
    head = metrics(env)[0]
    evals = {r["step"]: {k: r[f"test/{k}"] for k in metrics(env)} for r in rows if r.get(f"test/{head}") is not None}
    curve = {r["step"]: r[f"eval/{head}"] for r in rows if r.get(f"eval/{head}") is not None}
    return {"env": env, "episodes": rows[0]["test/episodes"], "evals": evals, "validation": curve,
            "time_s": rows[-1].get("time_s")}


def summarize(per_seed: dict) -> dict:
    """Per metric: mean and standard error over seeds after SFT, after RL, of the change; per seed after RL."""
    from jaxrl_hier.bench import mean_se

    env = next(iter(per_seed.values()))["env"]
    out = {}
    for metric in metrics(env):
        first = [r["evals"][min(r["evals"])][metric] for r in per_seed.values()]
        last = [r["evals"][max(r["evals"])][metric] for r in per_seed.values()]
        out[metric] = {"sft": mean_se(first), "rl": mean_se(last),
                       "change": mean_se([b - a for a, b in zip(first, last)]), "per_seed_rl": last}
    return out


def table(name: str, summary: dict) -> list[str]:
    from jaxrl_hier.bench import fmt_mean_se

    lines = [f"| {name} | after SFT | after RL | change | per seed, after RL |", "|---|---:|---:|---:|---|"]
    for metric, s in summary.items():
        pct = metric in SHARES
        unit, digits = (" (%)", 1) if pct else ("", 2)
        lines.append(f"| {metric}{unit} | {fmt_mean_se(*s['sft'], pct, digits)} | {fmt_mean_se(*s['rl'], pct, digits)} | "
                     f"{fmt_mean_se(*s['change'], pct, digits)} | "
                     f"{', '.join(f'{(100 if pct else 1) * x:.{1 if pct else 2}f}' for x in s['per_seed_rl'])} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--configs", type=Path, nargs="+",
                        default=[REPO / "configs" / "guided_arithmetic.yaml", REPO / "configs" / "guided_game.yaml"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    from jaxrl_hier.bench import seed_sweep_error

    for config in args.configs:
        if error := seed_sweep_error(config, args.seeds):
            print(f"error: {error}", file=sys.stderr)
            return 2

    from jaxrl_hier.bench import device_info, train_run
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    runs: dict = {}
    for config in args.configs:
        for seed in args.seeds:
            out = args.out / config.stem / f"seed{seed}"
            train_run(config, out, [f"seed={seed}"], out.parent / f"log_seed{seed}.txt", REPO)
            runs.setdefault(config.stem, {})[seed] = evaluations(out)
    summary = {name: summarize(per_seed) for name, per_seed in runs.items()}
    lines = [f"Greedy evaluation on test, mean ± standard error over seeds {args.seeds} (configs as shipped):", ""]
    for name, per_seed in runs.items():
        episodes = sorted({r["episodes"] for r in per_seed.values()})
        lines += [f"{name}: {episodes} evaluation episodes, after {max(next(iter(per_seed.values()))['evals'])} "
                  "iterations", "", *table(name, summary[name]), ""]
    atomic_write_json(args.out / "guided_seeds.json", {"benchmark": "guided_seeds", **device_info(),
                                                       "configs": [str(c) for c in args.configs],
                                                       "seeds": args.seeds, "runs": runs, "summary": summary})
    atomic_write_text(args.out / "guided_seeds.md", "\n".join(lines))
    plot(runs, args.out / "guided_seeds.png")
    print("\n".join(lines))
    return 0


def plot(runs: dict, path: Path) -> None:
    from jaxrl_hier.bench import mean_se
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, (name, per_seed) in zip(axes[0], runs.items()):
        metric = metrics(next(iter(per_seed.values()))["env"])[0]
        scale = 100 if metric in SHARES else 1
        steps = sorted(set.intersection(*(set(r["validation"]) for r in per_seed.values())))
        stats = [mean_se([r["validation"][s] for r in per_seed.values()]) for s in steps]
        ax.errorbar(steps, [scale * m for m, _ in stats], yerr=[scale * (se or 0) for _, se in stats], capsize=2)
        ax.set_xlabel("iteration (0: after SFT)")
        ax.set_ylabel(f"{metric}, validation" + (" (%)" if scale == 100 else ""))
        ax.set_title(f"{name}, seeds {sorted(per_seed)} (mean ± s.e.)")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
