"""The shipped GRPO config's variants at several seeds, reported on the distinct test problems.

    python benchmarks/llm_rl/grpo_seeds.py --out DIR [--config configs/grpo_arithmetic.yaml]
        [--variants grpo dapo dr_grpo] [--seeds 0 1 2]

For each variant (`loss_type`) and seed, `python -m jaxrl_hier.train --config CONFIG loss_type=V
seed=S` in DIR/<variant>/seed<S> (skipped when the run's model is already saved, so a killed
sweep goes on). No setting is chosen here: the figures are the config's as shipped, on every
distinct problem of the test split (each run's `eval_problems`), which a run evaluates twice: the
SFT model at step 0 and the policy at the last step (`test/accuracy`). Writes DIR/grpo_seeds.json
(every run's evaluations, and per variant the mean and standard error over seeds of the test
accuracy after SFT, after RL and the gain), DIR/grpo_seeds.md and DIR/grpo_seeds.png (validation
accuracy against GRPO steps, the curve runs watch, mean and standard error over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def evaluations(out: Path) -> dict:
    """The run's test accuracy at step 0 (the SFT model) and its last step, its validation accuracy by
    GRPO step, and their problem counts."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tests = {r["step"]: r["test/accuracy"] for r in rows if r.get("test/accuracy") is not None}
    curve = {r["step"]: r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None}
    return {"problems": rows[0]["test/problems"], "accuracy": tests, "validation_problems": rows[0]["eval/problems"],
            "validation": curve, "time_s": rows[-1].get("time_s")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "grpo_arithmetic.yaml")
    parser.add_argument("--variants", nargs="+", default=["grpo", "dapo", "dr_grpo"],
                        choices=["grpo", "dapo", "dr_grpo"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    from jaxrl_hier.bench import seed_sweep_error

    if error := seed_sweep_error(args.config, args.seeds):
        print(f"error: {error}", file=sys.stderr)
        return 2

    from jaxrl_hier.bench import device_info, fmt_mean_se, mean_se, train_run
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    runs = {}
    for seed in args.seeds:
        for variant in args.variants:
            out = args.out / variant / f"seed{seed}"
            train_run(args.config, out, [f"loss_type={variant}", f"seed={seed}"],
                      out.parent / f"log_seed{seed}.txt", REPO)
            runs.setdefault(variant, {})[seed] = evaluations(out)
    summary, lines = {}, ["| variant | after SFT (%) | after RL (%) | gain (points) | per seed, after RL (%) |",
                          "|---|---:|---:|---:|---|"]
    for variant, per_seed in runs.items():
        first = [r["accuracy"][min(r["accuracy"])] for r in per_seed.values()]
        last = [r["accuracy"][max(r["accuracy"])] for r in per_seed.values()]
        summary[variant] = {"sft": mean_se(first), "rl": mean_se(last),
                            "gain": mean_se([b - a for a, b in zip(first, last)]), "per_seed_rl": last}
        s = summary[variant]
        lines.append(f"| {variant} | {fmt_mean_se(*s['sft'])} | {fmt_mean_se(*s['rl'])} | {fmt_mean_se(*s['gain'])} | "
                     f"{', '.join(f'{100 * x:.1f}' for x in last)} |")
    problems = sorted({r["problems"] for per_seed in runs.values() for r in per_seed.values()})
    header = [f"Test greedy accuracy, mean ± standard error over seeds {args.seeds}, on {problems} distinct "
              f"test problems ({args.config.name} as shipped, variants by loss_type):", ""]
    atomic_write_json(args.out / "grpo_seeds.json", {"benchmark": "grpo_seeds", **device_info(),
                                                     "config": str(args.config), "seeds": args.seeds,
                                                     "problems": problems, "runs": runs, "summary": summary})
    atomic_write_text(args.out / "grpo_seeds.md", "\n".join(header + lines) + "\n")
    plot(runs, args.out / "grpo_seeds.png")
    print("\n".join(header + lines))
    return 0


def plot(runs: dict, path: Path) -> None:
    from jaxrl_hier.bench import mean_se
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, per_seed in runs.items():
        steps = sorted(set.intersection(*(set(r["validation"]) for r in per_seed.values())))
        stats = [mean_se([r["validation"][s] for r in per_seed.values()]) for s in steps]
        ax.errorbar(steps, [100 * m for m, _ in stats], yerr=[100 * (se or 0) for _, se in stats], capsize=2,
                    label=variant)
    ax.set_xlabel("GRPO step (0: after SFT)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"seeds {sorted(next(iter(runs.values())))} (mean ± s.e.)")
    ax.legend()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
