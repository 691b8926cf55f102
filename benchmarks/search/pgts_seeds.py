"""PGTS chosen on validation, reported on test once, at several seeds.

    python benchmarks/search/pgts_seeds.py --out DIR [--config configs/pgts_arithmetic.yaml] [--seeds 0 1 2]
        [--candidates rm_sft_steps=300 rm_sft_steps=600] [--rules 0.1:1 0.2:1 0.3:1 0.5:1 0.3:2 0.5:2]

1. Candidates: for each candidate setting (a space-separated list of `key=value` overrides, one
   string per candidate) and seed, the pipeline up to its reward model (`stop_after=reward_model`:
   the generator's SFT and the verifier, no PPO stage and no evaluation, so nothing looks at the
   test split), in DIR/candidates/<i>/seed<s>.
2. Validation: `benchmarks/search/pgts_rule_search.py` on each candidate run scores chain-of-thought and
   each threshold rule (`--rules`; the teacher PGTS's imitation stage clones) on the run's
   `eval_problems` distinct validation problems.
3. The choice: the candidate and rule with the highest validation accuracy of the rule, averaged
   over seeds (then the fewer tokens). Only validation figures enter it.
4. Test, once: for each seed, the chosen candidate's run goes on through imitation (of the chosen
   rule), PPO and the evaluation stage (its config.yaml rewritten with the chosen rule and no
   stop; the SFT and reward-model stages are kept), in DIR/final/seed<s>. The evaluation stage
   reports every method (CoT, self-consistency, best-of-N, MCTS, the rule, the cloned and the
   trained policy) on the config's distinct test problems.

Writes DIR/pgts_seeds.json (every validation row, the choice, each seed's test rows, and per method
the mean and standard error over seeds), DIR/pgts_seeds.md (the tables) and DIR/pgts_seeds.png
(test accuracy against tokens, mean and standard error). Each step is skipped when its output
exists, so a killed protocol goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jaxrl_hier.bench import run_logged  # noqa: E402  (after the path, for a run from a clone)


def candidate_run(args: argparse.Namespace, i: int, overrides: list[str], seed: int) -> Path:
    out = args.out / "candidates" / str(i) / f"seed{seed}"
    if not (out / "reward_model" / "DONE").is_file():
        resume = ["--resume"] if (out / "config.yaml").is_file() else ["--config", str(args.config)]
        run_logged([sys.executable, "-m", "jaxrl_hier.train", *resume, "--output-dir", str(out), "--no-progress",
                    *([] if resume[0] == "--resume" else [f"seed={seed}", *overrides]), "stop_after=reward_model"],
                   args.out / "logs" / f"candidate{i}_seed{seed}.txt", REPO)
    return out


def rule_search(args: argparse.Namespace, i: int, seed: int, run_dir: Path) -> dict:
    """pgts_rule_search.py's result on the run's validation problems (rows: CoT, then each rule)."""
    out = args.out / "candidates" / str(i) / f"rules_seed{seed}"
    if not (out / "pgts_rule_search.json").is_file():
        run_logged([sys.executable, "benchmarks/search/pgts_rule_search.py", "--run-dir", str(run_dir), "--out", str(out),
                    "--rules", *args.rules], args.out / "logs" / f"rules{i}_seed{seed}.txt", REPO)
    return json.loads((out / "pgts_rule_search.json").read_text())


def validation_options(validation: dict) -> list[dict]:
    """Each candidate's rows (chain-of-thought first, `tau` None; then each rule) averaged over seeds:
    accuracy with its standard error, and tokens."""
    from jaxrl_hier.bench import mean_se

    options = []
    for i, per_seed in validation.items():
        for k in range(len(next(iter(per_seed.values())))):
            rows = [per_seed[s][k] for s in per_seed]
            acc, acc_se = mean_se([r["accuracy"] for r in rows])
            options.append(dict(candidate=i, tau=None if k == 0 else rows[0]["tau"], extra=rows[0]["extra"],
                                accuracy=acc, accuracy_se=acc_se, tokens=mean_se([r["tokens"] for r in rows])[0]))
    return options


def choose(options: list[dict]) -> dict:
    """The rule (never chain-of-thought, a baseline) with the best mean validation accuracy over
    seeds, then the fewer tokens."""
    return max((o for o in options if o["tau"] is not None), key=lambda o: (o["accuracy"], -o["tokens"]))


def final_run(args: argparse.Namespace, chosen: dict, seed: int) -> dict:
    """The chosen candidate's run of `seed`, on through imitation, PPO and evaluation (test, once)."""
    from jaxrl_hier.config import build_dataclass, read_yaml
    from jaxrl_hier.runs import save_run_config
    from jaxrl_hier.search.config import PGTSConfig

    out = args.out / "final" / f"seed{seed}"
    if not (out / "eval" / "results.json").is_file():
        if not (out / "config.yaml").is_file():
            source = args.out / "candidates" / str(chosen["candidate"]) / f"seed{seed}"
            for stage in ("sft", "reward_model"):
                shutil.copytree(source / stage, out / stage, dirs_exist_ok=True)
            raw = {k: v for k, v in read_yaml(source / "config.yaml").items() if k != "algorithm"}
            raw.update(imitation_tau=chosen["tau"], imitation_extra=chosen["extra"], stop_after=None)
            save_run_config(out / "config.yaml", "pgts", build_dataclass(PGTSConfig, raw))
        run_logged([sys.executable, "-m", "jaxrl_hier.train", "--resume", "--output-dir", str(out), "--no-progress"],
                   args.out / "logs" / f"final_seed{seed}.txt", REPO)
    return json.loads((out / "eval" / "results.json").read_text())


def method_name(method: str) -> str:
    """One name per method across seeds (the rule's row names its tau)."""
    return re.sub(r"threshold rule \(tau [0-9.]+, ", "threshold rule (", method)


def summarize(tests: dict) -> list[dict]:
    from jaxrl_hier.bench import mean_se

    rows = {}
    for result in tests.values():
        cot = next(r for r in result["rows"] if r["method"] == "CoT greedy")
        for r in result["rows"]:
            rows.setdefault(method_name(r["method"]), []).append((r, cot))
    out = []
    for method, pairs in rows.items():
        acc, acc_se = mean_se([r["accuracy"] for r, _ in pairs])
        tok, tok_se = mean_se([r["tokens"] for r, _ in pairs])
        gain, gain_se = mean_se([r["accuracy"] - c["accuracy"] for r, c in pairs])
        out.append(dict(method=method, seeds=len(pairs), accuracy=acc, accuracy_se=acc_se, tokens=tok,
                        tokens_se=tok_se, tokens_vs_cot=tok / mean_se([c["tokens"] for _, c in pairs])[0],
                        vs_cot=gain, vs_cot_se=gain_se, per_seed=[r["accuracy"] for r, _ in pairs]))
    return out


def tables(result: dict) -> list[str]:
    from jaxrl_hier.bench import fmt_mean_se

    lines = ["Validation (the choice): each rule's accuracy, mean ± standard error over seeds "
             f"{result['seeds']}, {result['validation_problems']} distinct validation problems a seed", "",
             "| candidate | rule | accuracy (%) | tokens / problem |", "|---|---|---:|---:|"]
    for o in result["options"]:
        mark = " **(chosen)**" if (o["candidate"], o["tau"], o["extra"]) == \
            (result["chosen"]["candidate"], result["chosen"]["tau"], result["chosen"]["extra"]) else ""
        rule = "chain-of-thought" if o["tau"] is None else f"tau {o['tau']:g}, extra {o['extra']}"
        lines.append(f"| {result['candidates'][int(o['candidate'])]} | {rule}{mark} | "
                     f"{fmt_mean_se(o['accuracy'], o['accuracy_se'])} | {o['tokens']:.1f} |")
    lines += ["", f"Test, once (the chosen setting; {result['test_problems']} distinct test problems a seed), mean ± "
              "standard error over seeds:", "",
              "| method | accuracy (%) | vs CoT greedy (points) | tokens / problem | tokens vs CoT | per seed (%) |",
              "|---|---:|---:|---:|---:|---|"]
    for r in result["test"]:
        lines.append(f"| {r['method']} | {fmt_mean_se(r['accuracy'], r['accuracy_se'])} | "
                     f"{fmt_mean_se(r['vs_cot'], r['vs_cot_se'])} | {fmt_mean_se(r['tokens'], r['tokens_se'], False)} | "
                     f"{r['tokens_vs_cot']:.2f}x | {', '.join(f'{100 * a:.1f}' for a in r['per_seed'])} |")
    return lines


def plot(result: dict, path: Path) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in result["test"]:
        ax.errorbar(r["tokens"], 100 * r["accuracy"], yerr=100 * (r["accuracy_se"] or 0),
                    xerr=r["tokens_se"] or 0, fmt="o", capsize=3, label=r["method"])
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"PGTS and baselines, seeds {result['seeds']} (mean ± s.e.)")
    ax.legend(fontsize=7, loc="best")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "pgts_arithmetic.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--candidates", nargs="+", default=["rm_sft_steps=300", "rm_sft_steps=600"],
                        help="one string of space-separated key=value overrides per candidate")
    parser.add_argument("--rules", nargs="+", default=["0.1:1", "0.2:1", "0.3:1", "0.5:1", "0.3:2", "0.5:2"])
    args = parser.parse_args(argv)
    from jaxrl_hier.bench import seed_sweep_error

    if error := seed_sweep_error(args.config, args.seeds):
        print(f"error: {error}", file=sys.stderr)
        return 2
    candidates = [c.split() for c in args.candidates]
    if any(not c or any("=" not in kv for kv in c) for c in candidates):
        print(f"error: --candidates takes strings of key=value overrides, got {args.candidates}", file=sys.stderr)
        return 2
    (args.out / "logs").mkdir(parents=True, exist_ok=True)

    from jaxrl_hier.bench import device_info
    from jaxrl_hier.io import atomic_write_json, atomic_write_text

    t0 = time.perf_counter()
    validation: dict = {}
    problems = set()
    for i, overrides in enumerate(candidates):
        for seed in args.seeds:
            print(f"candidate {i} ({' '.join(overrides)}), seed {seed}", flush=True)
            searched = rule_search(args, i, seed, candidate_run(args, i, overrides, seed))
            validation.setdefault(str(i), {})[seed] = searched["rows"]
            problems.add(searched["problems"])
    options = validation_options(validation)
    chosen = choose(options)
    print(f"chosen on validation: candidate {chosen['candidate']} ({args.candidates[int(chosen['candidate'])]}), "
          f"rule tau {chosen['tau']:g} extra {chosen['extra']}: {100 * chosen['accuracy']:.1f}%", flush=True)
    tests = {seed: final_run(args, chosen, seed) for seed in args.seeds}
    result = {"benchmark": "pgts_seeds", **device_info(), "config": str(args.config), "seeds": args.seeds,
              "candidates": args.candidates, "rules": args.rules,
              "validation_problems": max(problems),
              "validation": validation, "options": options, "chosen": chosen,
              "test_problems": next(iter(tests.values()))["problems"], "test_per_seed": tests,
              "test": summarize(tests), "wall_s": time.perf_counter() - t0}
    atomic_write_json(args.out / "pgts_seeds.json", result)
    lines = tables(result)
    atomic_write_text(args.out / "pgts_seeds.md", "\n".join(lines) + "\n")
    plot(result, args.out / "pgts_seeds.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
