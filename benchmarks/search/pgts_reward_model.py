"""How far the PGTS reward model gets with more data, more steps or another learning rate.

    python benchmarks/search/pgts_reward_model.py --run-dir RUN --out DIR [--problems 512 4096] [--settings 300:2e-4 1000:2e-4] [--test]

Loads a finished PGTS run's generator (RUN/sft/model, RUN/config.yaml), samples `rm_samples` solutions per
training problem with it for each `--problems` count (and the validation paths of the config:
`search.cli.held_out_paths`, the pipeline's own), labels the
partial paths by final-answer correctness as the pipeline's reward-model stage does
(`search.reward_model.sample_path_data`; `--labels steps`: each prefix by whether all its steps are
right, the pipeline's `rm_labels: steps`), and trains a fresh reward model (the generator's copy plus a
one-logit head) for each `steps:learning_rate` setting. Writes DIR/pgts_reward_model.json: per run the
data size, the final training loss (mean of the last 50 steps), validation accuracy, AUC and BCE, on all
partial paths and on complete paths, and the seconds it took. The sweep sees the validation split only;
`--test` then measures the chosen run (the best validation AUC) once on the test split's paths,
the figure to report (`chosen` in the JSON).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished pgts run (sft/ and config.yaml)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=int, nargs="+", default=[512, 4096], help="training problems sampled")
    parser.add_argument("--labels", nargs="+", choices=("final", "steps"), default=["final"],
                        help="final: every prefix labelled by its solution's final answer (the pipeline's default); "
                             "steps: by whether all its steps are right (process labels)")
    parser.add_argument("--settings", nargs="+", default=["300:2e-4", "1000:2e-4", "1000:1e-3"],
                        help="steps:learning_rate of each training run")
    parser.add_argument("--test", action="store_true",
                        help="after the sweep, evaluate the run with the best validation AUC once on the test split")
    args = parser.parse_args(argv)
    from jaxrl_hier.config import ConfigError

    try:
        settings = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in args.settings]
    except (ValueError, IndexError):
        print(f"error: --settings takes steps:learning_rate pairs such as 1000:2e-4, got {args.settings}",
              file=sys.stderr)
        return 2
    if not (args.run_dir / "sft" / "model").is_dir() or not (args.run_dir / "config.yaml").is_file():
        print(f"error: {args.run_dir} holds no finished pgts SFT stage (sft/model and config.yaml)", file=sys.stderr)
        return 2

    import jax

    from jaxrl_hier.bench import device_info
    from jaxrl_hier.io import atomic_write_json
    from jaxrl_hier.search import cli
    from jaxrl_hier.search.reward_model import (RewardModel, evaluate_reward_model, sample_path_data,
                                                train_reward_model)

    try:
        config, task, tokenizer, lm = cli.load_finished_run(args.run_dir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    common = dict(temperature=config.temperature, prompt_length=config.max_prompt_length,
                  step_tokens=config.step_tokens, max_depth=config.max_depth)
    # the pipeline's own seeds (search/cli.py run_reward_model_stage), so --problems rm_problems is its data
    rm = RewardModel(lm)
    runs, best = [], None
    for labels, n in [(lab, n) for lab in args.labels for n in args.problems]:
        validation, _ = cli.held_out_paths(config, lm, tokenizer, task, split="validation", labels=labels)
        t0 = time.perf_counter()
        train, info = sample_path_data(lm, lm.params, tokenizer, task, task.problems("train", n, config.seed + 1),
                                       samples=config.rm_samples, key=jax.random.key(config.seed + 12),
                                       labels=labels, **common)
        sample_s = time.perf_counter() - t0
        for steps, lr in settings:
            t0 = time.perf_counter()
            params = rm.init(jax.random.key(config.seed + 11), lm.params)
            params, losses = train_reward_model(rm, params, train, steps=steps, batch_size=config.rm_batch_size,
                                                learning_rate=lr, seed=config.seed)
            ev = evaluate_reward_model(rm, params, validation)
            tail = losses[-50:]
            rec = dict(labels=labels, problems=n, paths=info["examples"], positive_rate=info["positive_rate"],
                       validation_positive_rate=float(validation.label.mean()), solutions=info["solutions"],
                       solution_accuracy=info["solution_accuracy"], sample_s=sample_s, steps=steps,
                       learning_rate=lr, final_train_loss=sum(tail) / len(tail), eval=ev,
                       train_s=time.perf_counter() - t0)
            runs.append(rec)
            if args.test and (best is None or ev["auc"] > best[0]["eval"]["auc"]):
                best = (rec, params)
            print(f"labels {labels} problems {n:5d} ({info['examples']} paths) steps {steps:5d} lr {lr:g}: train loss "
                  f"{rec['final_train_loss']:.3f}, validation loss {ev['loss']:.3f}, AUC {ev['auc']:.3f} "
                  f"(complete paths {ev['final_auc']:.3f}), {rec['train_s']:.0f}s", flush=True)
    chosen = None
    if best is not None:  # the one look at the test split, for the setting the validation sweep chose
        rec, params = best
        test, _ = cli.held_out_paths(config, lm, tokenizer, task, split="test", labels=rec["labels"])
        chosen = {k: rec[k] for k in ("labels", "problems", "steps", "learning_rate")}
        chosen.update(validation=rec["eval"], test=evaluate_reward_model(rm, params, test))
        print(f"chosen on validation: {chosen['labels']} labels, {chosen['problems']} problems, {chosen['steps']} "
              f"steps, lr {chosen['learning_rate']:g}: test AUC {chosen['test']['auc']:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "pgts_reward_model.json",
                      {"benchmark": "pgts_reward_model", **device_info(), "run_dir": str(args.run_dir),
                       "split": "validation", "runs": runs, "chosen": chosen})
    print(f"wrote {args.out / 'pgts_reward_model.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
