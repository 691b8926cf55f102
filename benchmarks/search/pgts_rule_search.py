"""What a search in PGTS's action space can gain with a run's generator and reward model: a hand-written rule.

    python benchmarks/search/pgts_rule_search.py --run-dir RUN --out DIR [--rules 0.1:1 0.3:1 0.3:2] [--test]

Loads a finished PGTS run (RUN/config.yaml, its SFT generator and reward model), and searches
`eval_problems` distinct validation problems (never the test split the pipeline reports on, so
the sweep cannot fit it; `--test` then runs CoT and the rule with the best validation accuracy
once on the config's test problems: the figures to report) with a fixed rule instead of the
trained policy, in the same env
(`search.cli.build_env`, no token budget): Expand, and Terminate on an answer line; but when the
step just generated scores below `tau` by the reward model and its parent has at most `extra`
children, Branch (a sibling of that step replaces it as the current node: sampled, or with
`--sibling swap` the step with its least-confident token swapped for the generator's second choice).
This is `search.imitation.threshold_rule`, the teacher of the pipeline's imitation stage. With the
config's `greedy_first_child`, `tau` below every score is chain-of-thought greedy (but for a path
that reaches max_depth without an answer line: the rule then Branches or Backtracks, since a
policy may not Terminate there; the `nodes` column shows when that happened). The
`oracle` column is how often some answer line in the searched tree is right: what a perfect choice
among the tree's final nodes would reach, so the gap to `accuracy` is the reward model's. A rule that
beats CoT shows what a policy could learn; one that cannot says the env's actions, this generator
and this reward model leave a search little to gain. Writes DIR/pgts_rule_search.json and
DIR/pgts_rule_search.md (accuracy, tokens per problem and nodes per search of each rule on
validation, and with `--test` the chosen rule's test rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def make_rule_runner(env, max_actions: int = 64):
    """A jitted `run((tau, extra), env_params, problem_ids [P], key) -> (final TreeState [P], actions [P])`
    of the rule (module docstring, `search.imitation.threshold_rule`) on `search.baselines.make_runner`;
    tau and extra are traced, so every rule runs on one compiled program."""
    from jaxrl_hier.search.baselines import make_runner
    from jaxrl_hier.search.imitation import threshold_rule

    return make_runner(env, threshold_rule(env), max_actions)


def any_final_right(env, state, params):
    """Whether some answer line (final node) in one searched tree is right."""
    import jax
    import jax.numpy as jnp

    nodes = jnp.arange(env.max_nodes)
    right = jax.vmap(lambda n: env.is_correct(state, n, params))(nodes)
    return jnp.any(right & state.final & (nodes < state.num_nodes))


def score_rules(run, oracle_fn, env_params, count: int, rules: list, seed: int) -> list[dict]:
    """One row per rule (CoT greedy first, then each (tau, extra)) on the `count` problems of `env_params`:
    accuracy, oracle, tokens, nodes, seconds and tokens against CoT's."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rows = []
    for tau, extra in [(-np.inf, 0), *rules]:
        t0 = time.perf_counter()
        rule = (jnp.float32(tau), jnp.int32(extra))
        states, _ = run(rule, env_params, jnp.arange(count), jax.random.key(seed))
        correct, tokens, nodes, oracle = jax.device_get((states.correct, states.tokens_used, states.num_nodes,
                                                         oracle_fn(states, env_params)))
        rows.append(dict(rule="chain-of-thought (never branch)" if tau == -np.inf else f"branch below {tau:g}, "
                         f"up to {extra} extra sibling{'s' if extra > 1 else ''}", tau=float(tau), extra=extra,
                         accuracy=float(np.mean(correct)), oracle=float(np.mean(oracle)), tokens=float(np.mean(tokens)),
                         nodes=float(np.mean(nodes)), seconds=time.perf_counter() - t0))
        r = rows[-1]
        r["tokens_vs_cot"] = r["tokens"] / rows[0]["tokens"]
        print(f"{r['rule']}: {100 * r['accuracy']:.1f}% (oracle {100 * r['oracle']:.1f}%) at {r['tokens']:.1f} tokens "
              f"({r['tokens_vs_cot']:.2f}x), {r['nodes']:.2f} nodes", flush=True)
    return rows


def chosen_rule(rows: list[dict]) -> tuple[float, int]:
    """The (tau, extra) of the best rule row after CoT's: highest accuracy, then fewest tokens."""
    best = max(rows[1:], key=lambda r: (r["accuracy"], -r["tokens"]))
    return best["tau"], best["extra"]


def rule_table(rows: list[dict]) -> list[str]:
    table = ["| rule | accuracy | oracle | tokens / problem | tokens vs CoT | nodes |",
             "|---|---:|---:|---:|---:|---:|"]
    return table + [f"| {r['rule']} | {100 * r['accuracy']:.1f}% | {100 * r['oracle']:.1f}% | {r['tokens']:.1f} "
                    f"| {r['tokens_vs_cot']:.2f}x | {r['nodes']:.2f} |" for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished pgts run (sft/, reward_model/)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rules", nargs="+", default=["0.1:1", "0.2:1", "0.3:1", "0.5:1", "0.3:2", "0.5:2"],
                        help="tau:extra pairs (module docstring); chain-of-thought greedy is always run first")
    parser.add_argument("--sibling", choices=("sample", "swap"), default=None,
                        help="how Branch makes a sibling (default: the run's config)")
    parser.add_argument("--test", action="store_true",
                        help="after the validation sweep, run CoT and the chosen rule once on the test split")
    args = parser.parse_args(argv)
    try:
        rules = [(float(r.split(":")[0]), int(r.split(":")[1])) for r in args.rules]
    except (ValueError, IndexError):
        print(f"error: --rules takes tau:extra pairs such as 0.3:1, got {args.rules}", file=sys.stderr)
        return 2
    if not (args.run_dir / "reward_model" / "DONE").is_file() or not (args.run_dir / "sft" / "model").is_dir():
        print(f"error: {args.run_dir} holds no finished pgts SFT and reward-model stages "
              "(sft/model, reward_model/DONE); run the pipeline first", file=sys.stderr)
        return 2

    import jax

    from jaxrl_hier.bench import device_info
    from jaxrl_hier.config import ConfigError
    from jaxrl_hier.io import atomic_write_json, atomic_write_text
    from jaxrl_hier.llm_rl.data import evaluation_problems
    from jaxrl_hier.search import cli

    try:
        config, task, tokenizer, lm = cli.load_finished_run(args.run_dir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rm, rm_params, rm_info = cli.run_reward_model_stage(config, args.run_dir, lm, tokenizer, task)
    validation = evaluation_problems(task, config.eval_problems, config.seed, "validation")
    test = evaluation_problems(task, config.eval_problems, config.seed) if args.test else []
    if args.sibling is not None:
        config = dataclasses.replace(config, sibling=args.sibling, greedy_first_child=True)
    env = cli.build_env(config, lm, rm, tokenizer, token_budget=10**9)
    oracle_fn = jax.jit(jax.vmap(lambda state, params: any_final_right(env, state, params), in_axes=(0, None)))
    run = make_rule_runner(env)
    score = lambda problems, rules: score_rules(run, oracle_fn, cli.env_params_for(  # noqa: E731
        config, env, lm.params, rm_params, tokenizer, problems), len(problems), rules, config.seed)
    rows = score(validation, rules)
    test_rows = score(test, [chosen_rule(rows)]) if args.test else []
    table = rule_table(rows)
    if test_rows:
        table += ["", "test split, CoT and the rule chosen on validation:", *rule_table(test_rows)]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "pgts_rule_search.json",
                      {"benchmark": "pgts_rule_search", **device_info(), "run_dir": str(args.run_dir),
                       "rm_labels": config.rm_labels, "rm_kind": config.rm_kind, "sibling": config.sibling,
                       "reward_model": rm_info.get("eval"), "split": "validation", "problems": len(validation),
                       "rows": rows, "test_problems": len(test), "test_rows": test_rows})
    atomic_write_text(args.out / "pgts_rule_search.md", "\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
