"""Multi-turn RL on text games: the group baseline against ArCHer's critic, success against episodes.

    python benchmarks/llm_rl/multiturn.py --out DIR [--configs configs/guided_guess64.yaml] [--seeds 0 1 2]
        [--algorithms group archer] [--speed] [--report-only]

For each config, algorithm and seed: `python -m jaxrl_hier.train --config CONFIG seed=S advantage=A`
in DIR/<config>/<A>/seed<S> (`bench.train_run`: resumed or skipped where a killed sweep left it).
The algorithms are the guided trainer's advantages on one backbone, roles and schedule:

- group: multi-turn GRPO. An utterance's observed return-to-go against the mean over the plays of
  the same problem at the same turn (`group_size` plays of each secret per iteration);
- archer: ArCHer. min(Q1, Q2)(s, a) - min(V1, V2)(s) from the utterance-level double critic with its
  Polyak target, trained from the replay buffer every iteration (it trains in group runs too, unused).

Same warm-start: the SFT stage is deterministic on the CPU given the seed, and the benchmark checks
that every algorithm's iteration-0 evaluations of a seed agree (they are the same model). Runs from
a GPU (`--report-only` over benchmarks/device/multiturn_gpu.sh's runs) are not bitwise deterministic:
there the difference is reported, not refused.

What is compared, and on which split:
- the curves against episodes played (iterations x episodes_per_iteration): greedy success on the
  validation split (`eval/success`, every `eval_every` iterations), and the sampled training episodes'
  success (`train/success`, every iteration; what the policy plays while it learns: a tiny policy's
  greedy play can stay at 0 while its sampled play moves);
- sample efficiency, per seed, on each curve: the episodes each algorithm needs to reach the group
  baseline's final success (the training curve smoothed over 5 iterations; None where it never
  does), and that count over the group baseline's own;
- the reported figures: greedy success and turns on the test split, evaluated twice per run (the
  warm-start and the end), and the sampled training success over the first and the last 10
  iterations, mean and standard error over seeds;
- diagnostics over the last 10 iterations: the actor's KL to the reference; the critic's Q regression
  loss; its V(s) and its Q(s, a) against the Monte-Carlo return-to-go of the iteration's utterances (mean
  squared errors, beside the returns' variance: what predicting their mean scores; a Q that knows what an
  utterance changes fits them better than V); and the correlation of its
  advantage with the observed one (`guided.critic_diagnostics`). The critic trains in group runs too,
  so these compare like with like.

Nothing is tuned here: the configs run as shipped. Guess-the-number has no held-out secrets (its
splits play the same secrets, `GuessNumberEnv` says why), so with `eval_episodes` covering every
secret its validation and test figures coincide; Wordle's and Twenty Questions' splits are disjoint.

`--speed` also runs benchmarks/llm_rl/multiturn_rollout.py into DIR/speed: episodes per second of one compiled
batch of games against a Python loop over turns. Writes DIR/multiturn.json, DIR/multiturn.md and
DIR/multiturn.png (validation success against episodes, mean and standard error over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ALGORITHMS = ("group", "archer")


def read_run(out: Path) -> dict:
    """A game run's curves against episodes played, its test evaluations (iteration 0 and the last) and the
    per-iteration diagnostics (the actor's KL to the reference, the critic's Q regression loss)."""
    from jaxrl_hier.config import read_yaml

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_iter = int(read_yaml(out / "config.yaml")["episodes_per_iteration"])

    def curve(key: str) -> dict[int, float]:
        # a row's `step` counts the iterations done: its evaluations judge the policy trained on step x
        # per_iter episodes, and its train/ figures summarise the last per_iter of them (played before that update)
        return {r["step"] * per_iter: r[key] for r in rows if r.get(key) is not None}

    test = {r["step"]: {"success": r["test/success"], "turns": r["test/turns"]}
            for r in rows if r.get("test/success") is not None}
    return {"validation": curve("eval/success"), "train": curve("train/success"), "kl": curve("actor/kl"),
            "q1_loss": curve("critic/q1_loss"), "v_return_mse": curve("actor/v_return_mse"),
            "q_return_mse": curve("actor/q_return_mse"),
            "return_var": curve("actor/return_var"), "agreement": curve("actor/advantage_agreement"),
            "test": test, "episodes_per_iteration": per_iter,
            "time_s": rows[-1].get("time_s")}


def smoothed(curve: dict[int, float], window: int) -> dict[int, float]:
    """Each point's mean with the `window - 1` points before it (the sampled training success is noisy)."""
    xs = sorted(curve)
    return {x: sum(curve[y] for y in xs[max(0, i - window + 1):i + 1]) / len(xs[max(0, i - window + 1):i + 1])
            for i, x in enumerate(xs)}


def episodes_to_reach(curve: dict[int, float], target: float) -> int | None:
    """The fewest episodes after which `curve` (episodes -> success) is at or above `target`; None if never."""
    return next((e for e in sorted(curve) if curve[e] >= target - 1e-9), None)


def efficiency(runs: dict, curve: str = "validation", window: int = 1) -> dict:
    """Per seed, on one curve (`validation`: greedy; `train`: the sampled training episodes, smoothed over
    `window` iterations): the group baseline's final success, each algorithm's episodes to reach it and
    their ratio to the group baseline's own episodes."""
    out = {}
    for seed, group in runs["group"].items():
        curves = {a: smoothed(runs[a][seed][curve], window) for a in runs if seed in runs[a]}
        target = curves["group"][max(curves["group"])]
        needed = {a: episodes_to_reach(c, target) for a, c in curves.items()}
        base = needed["group"]
        out[seed] = {"target": target, "episodes": needed,
                     "ratio": {a: (n / base if n is not None and base else None) for a, n in needed.items()}}
    return out


def check_same_warm_start(runs: dict) -> list[str]:
    """Seeds whose algorithms disagree on the iteration-0 test evaluation (the warm-start), as messages."""
    problems = []
    for seed in sorted(set.intersection(*(set(per_seed) for per_seed in runs.values()))):
        firsts = {a: runs[a][seed]["test"][min(runs[a][seed]["test"])] for a in runs}
        if len({json.dumps(f, sort_keys=True) for f in firsts.values()}) > 1:
            problems.append(f"seed {seed}: the warm-starts differ ({firsts})")
    return problems


def ends(curve: dict[int, float], n: int) -> tuple[float, float]:
    """The mean of a curve's first and of its last `n` points."""
    xs = sorted(curve)
    return sum(curve[x] for x in xs[:n]) / len(xs[:n]), sum(curve[x] for x in xs[-n:]) / len(xs[-n:])


def summarize(runs: dict, eff: dict, eff_train: dict) -> dict:
    """Per algorithm, mean and s.e. over seeds: test success and turns at the warm-start and the end; the
    sampled training success over the first and the last 10 iterations; the actor's KL and the critic's
    Q loss, V's error against the observed returns (beside their variance) and its advantage's correlation with
    the observed one over the last 10 (n/a for runs from before those metrics); and the episodes-to-reach
    figures on both curves."""
    from jaxrl_hier.bench import mean_se

    out = {}
    for algo, per_seed in runs.items():
        first = [r["test"][min(r["test"])] for r in per_seed.values()]
        last = [r["test"][max(r["test"])] for r in per_seed.values()]
        out[algo] = {k: {"sft": mean_se([f[k] for f in first]), "rl": mean_se([x[k] for x in last]),
                         "per_seed_rl": [x[k] for x in last]} for k in ("success", "turns")}
        train = [ends(r["train"], 10) for r in per_seed.values()]
        out[algo]["train_success"] = {"first10": mean_se([a for a, _ in train]), "last10": mean_se([b for _, b in train]),
                                      "per_seed_last10": [b for _, b in train]}
        for key in ("kl", "q1_loss", "v_return_mse", "q_return_mse", "return_var", "agreement"):  # before a metric: n/a
            out[algo][f"{key}_last10"] = mean_se([ends(r[key], 10)[1] for r in per_seed.values() if r.get(key)])
        for name, e in (("", eff), ("train_", eff_train)):
            out[algo][f"{name}episodes_to_group_final"] = [e[s]["episodes"].get(algo) for s in sorted(e)]
            out[algo][f"{name}ratio_to_group"] = mean_se([e[s]["ratio"].get(algo) for s in sorted(e)])
        out[algo]["episodes_played"] = max(max(r["validation"]) for r in per_seed.values())
    return out


def table(name: str, summary: dict, seeds: list[int]) -> list[str]:
    from jaxrl_hier.bench import fmt_mean_se

    lines = [f"| {name}, seeds {seeds} | test success (%), warm-start -> end | test turns, end | "
             "sampled training success (%), first -> last 10 iterations | episodes to the group's final success: "
             "validation (greedy); training (sampled, 5-iteration mean) | actor KL, last 10 | critic Q loss, last 10 | "
             "critic V / Q vs Monte-Carlo return: MSE, and the return variance, last 10 | critic advantage vs observed: "
             "correlation, last 10 |",
             "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for algo, s in summary.items():
        reach = {k: ", ".join("never" if n is None else str(n) for n in s[f"{k}episodes_to_group_final"])
                 for k in ("", "train_")}
        lines.append(f"| {algo} | {fmt_mean_se(*s['success']['sft'])} -> {fmt_mean_se(*s['success']['rl'])} | "
                     f"{fmt_mean_se(*s['turns']['rl'], pct=False, digits=2)} | "
                     f"{fmt_mean_se(*s['train_success']['first10'])} -> {fmt_mean_se(*s['train_success']['last10'])} | "
                     f"{reach['']}; {reach['train_']} (of {s['episodes_played']}) | "
                     f"{fmt_mean_se(*s['kl_last10'], pct=False, digits=3)} | "
                     f"{fmt_mean_se(*s['q1_loss_last10'], pct=False, digits=2)} | "
                     f"{fmt_mean_se(*s['v_return_mse_last10'], pct=False, digits=2)} / "
                     f"{fmt_mean_se(*s['q_return_mse_last10'], pct=False, digits=2)}; "
                     f"{fmt_mean_se(*s['return_var_last10'], pct=False, digits=2)} | "
                     f"{fmt_mean_se(*s['agreement_last10'], pct=False, digits=2)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--configs", type=Path, nargs="+", default=[REPO / "configs" / "guided_guess64.yaml"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--speed", action="store_true", help="also run multiturn_rollout.py into DIR/speed")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: summarise the finished runs in DIR (runs brought back from a device: "
                             "benchmarks/device/multiturn_gpu.sh); seeds without every algorithm finished are left out")
    args = parser.parse_args(argv)
    from jaxrl_hier.bench import seed_sweep_error
    from jaxrl_hier.config import read_yaml

    for config in args.configs:
        if error := seed_sweep_error(config, args.seeds):
            print(f"error: {error}", file=sys.stderr)
            return 2
        if read_yaml(config).get("env") not in ("guess_number", "wordle", "twenty_questions", "maze"):
            print(f"error: {config} is not a multi-turn game config (env: guess_number, wordle, twenty_questions or maze)",
                  file=sys.stderr)
            return 2
    if "group" not in args.algorithms:
        print("error: --algorithms must include group (the baseline the others are measured against)",
              file=sys.stderr)
        return 2

    from jaxrl_hier.bench import device_info, train_run
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    results: dict = {}
    lines = [f"Multi-turn RL from one warm-start, seeds {args.seeds}: greedy test success at the warm-start and the "
             "end (mean ± standard error), and the episodes each algorithm needed for its greedy validation "
             "success to reach the group baseline's final one.", ""]
    for config in args.configs:
        runs: dict = {a: {} for a in args.algorithms}
        seeds = args.seeds
        if args.report_only:
            finished = lambda a, s: (args.out / config.stem / a / f"seed{s}" / "model" / "model.safetensors").is_file()  # noqa: E731
            seeds = [s for s in args.seeds if all(finished(a, s) for a in args.algorithms)]
            print(f"{config.stem}: seeds with every algorithm finished: {seeds} (of {args.seeds})")
            if not seeds:
                print(f"error: no seed of {config.stem} has every algorithm finished in {args.out}", file=sys.stderr)
                return 2
        for algo in args.algorithms:
            for seed in seeds:
                out = args.out / config.stem / algo / f"seed{seed}"
                if not args.report_only:
                    train_run(config, out, [f"seed={seed}", f"advantage={algo}"], out.parent / f"log_seed{seed}.txt",
                              REPO)
                runs[algo][seed] = read_run(out)
        drift = check_same_warm_start(runs)
        if drift and not args.report_only:  # on a CPU the same seed gives the same warm-start, bit for bit
            print("error: " + "; ".join(drift), file=sys.stderr)
            return 1
        eff, eff_train = efficiency(runs), efficiency(runs, "train", window=5)
        summary = summarize(runs, eff, eff_train)
        results[config.stem] = {"runs": runs, "efficiency": eff, "efficiency_train": eff_train, "summary": summary,
                                "warm_start_drift": drift}
        lines += [f"{config.stem}:", "", *table(config.stem, summary, seeds), ""]
        if drift:  # runs from a GPU: its SFT is not bitwise deterministic
            lines += ["Warm-starts of one seed differ between the algorithms (runs from a device, whose SFT is not "
                      "bitwise deterministic): " + "; ".join(drift), ""]
    atomic_write_json(args.out / "multiturn.json", {"benchmark": "multiturn", **device_info(),
                                                    "configs": [str(c) for c in args.configs], "seeds": args.seeds,
                                                    "algorithms": args.algorithms, "results": results})
    atomic_write_text(args.out / "multiturn.md", "\n".join(lines))
    plot(results, args.out / "multiturn.png")
    print("\n".join(lines))
    if args.speed:
        from benchmarks.llm_rl import multiturn_rollout

        return multiturn_rollout.main(["--out", str(args.out / "speed")])
    return 0


def plot(results: dict, path: Path) -> None:
    from jaxrl_hier.bench import mean_se
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        for algo, per_seed in res["runs"].items():
            for curve, style in (("validation", "o-"), ("train", ":")):
                xs = sorted(set.intersection(*(set(r[curve]) for r in per_seed.values())))
                stats = [mean_se([r[curve][x] for r in per_seed.values()]) for x in xs]
                label = f"{algo}, {'validation (greedy)' if curve == 'validation' else 'training episodes (sampled)'}"
                ax.errorbar(xs, [100 * m for m, _ in stats], yerr=[100 * (se or 0) for _, se in stats],
                            fmt=style, capsize=2, label=label)
        ax.set(xlabel="episodes played", ylabel="success (%)",
               title=f"{name}, seeds {sorted(next(iter(res['runs'].values())))} (mean ± s.e.)")
        ax.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
