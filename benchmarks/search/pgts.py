"""PGTS against CoT greedy, self-consistency, best-of-N and MCTS, and search throughput.

    python benchmarks/search/pgts.py --out benchmarks/results/cpu/pgts [--run-dir RUN] [--config configs/pgts_arithmetic.yaml]

Without --run-dir the whole pipeline (`python -m jaxrl_hier.train --config ...`) first runs into
OUT/run; with it, the finished stages of that run directory are loaded (same generator, reward
model and policy). Then, on the run's held-out problems:

- every method's accuracy and tokens generated per problem (self-consistency and best-of-N at
  several N, MCTS at several simulation budgets, the trained PGTS policy), written to
  OUT/results.json, OUT/table.md and OUT/accuracy_vs_tokens.png;
- search-env throughput: env steps per second (each Expand/Branch is one generated LLM step) of
  B trees stepped by one vmapped compiled program, against one tree at a time stepped from a
  Python loop (the shape of a server-driven search: one call per step).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def throughput(env, env_params, *, batch: int, steps: int, seed: int = 0) -> dict:
    """Env steps/s with uniformly random valid actions (auto-reset): vmapped over `batch` trees in one
    compiled scan, and one tree stepped from a Python loop through a jitted step."""
    import jax
    import jax.numpy as jnp

    def act(key, obs):
        logits = jnp.where(obs["action_mask"], 0.0, -1e9)
        return jax.random.categorical(key, logits)

    def one_step(carry, key):
        obs, state = carry
        k_act, k_env, k_reset = jax.random.split(key, 3)
        a = act(k_act, obs)
        obs, state, _, done, _, _ = env.step(k_env, state, a, env_params)
        obs_r, state_r = env.reset(k_reset, env_params)
        pick = lambda x, y: jnp.where(done, x, y)  # noqa: E731
        return (jax.tree.map(pick, obs_r, obs), jax.tree.map(pick, state_r, state)), done

    def run_vec(key):
        keys = jax.random.split(key, batch)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)
        step_keys = jax.random.split(jax.random.fold_in(key, 1), (steps, batch))
        _, done = jax.lax.scan(lambda c, k: jax.vmap(one_step)(c, k), (obs, state), step_keys)
        return done.sum()

    vec = jax.jit(run_vec)
    jax.block_until_ready(vec(jax.random.key(seed)))  # compile
    tick = time.perf_counter()
    episodes = int(vec(jax.random.key(seed + 1)))
    vec_s = time.perf_counter() - tick

    single = jax.jit(one_step)
    obs, state = env.reset(jax.random.key(seed), env_params)
    carry = (obs, state)
    carry, _ = single(carry, jax.random.key(0))
    jax.block_until_ready(carry)
    loop_steps = max(steps, 32)
    tick = time.perf_counter()
    for i in range(loop_steps):
        carry, _ = single(carry, jax.random.key(i + 1))
    jax.block_until_ready(carry)
    loop_s = time.perf_counter() - tick
    return {"vectorised_trees": batch, "vectorised_steps_per_s": batch * steps / vec_s,
            "vectorised_episodes": episodes, "python_loop_steps_per_s": loop_steps / loop_s,
            "speedup": (batch * steps / vec_s) / (loop_steps / loop_s)}


def main(argv: list[str] | None = None) -> int:
    from jaxrl_hier.bench import UNROLL_DECODE

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, default=None, help="a finished pgts run (default: run one in OUT/run)")
    parser.add_argument("--config", type=Path, default=Path("configs/pgts_arithmetic.yaml"))
    parser.add_argument("--sc", type=int, nargs="+", default=[1, 2, 4, 8], help="self-consistency / best-of-N sizes")
    parser.add_argument("--mcts", type=int, nargs="+", default=[8, 16, 32], help="MCTS simulation budgets")
    parser.add_argument("--throughput-batch", type=int, default=32)
    parser.add_argument("--throughput-steps", type=int, default=16)
    parser.add_argument("--unroll-decode", choices=list(UNROLL_DECODE), default="auto",
                        help="the generator's decode loop: layers unrolled (on), the layer scan (off), or by size")
    parser.add_argument("--throughput-only", action="store_true",
                        help="only the throughput figure (needs the run's sft/ and reward_model/ stages), to throughput.json")
    args = parser.parse_args(argv)

    from jaxrl_hier import train
    from jaxrl_hier.io import atomic_write_json, atomic_write_text
    from jaxrl_hier.runs import load_saved_config
    from jaxrl_hier.search import cli
    from jaxrl_hier.search.config import PGTSConfig

    run_dir = args.run_dir
    pipeline_s = None
    if run_dir is None:
        run_dir = args.out / "run"
        tick = time.perf_counter()
        rc = train.main(["--config", str(args.config), "--output-dir", str(run_dir), "--no-progress"]
                        + (["--resume"] if (run_dir / "config.yaml").exists() else []))
        if rc:
            return rc
        pipeline_s = time.perf_counter() - tick
    config = load_saved_config(PGTSConfig, run_dir)
    task, tokenizer = cli.make_task_and_tokenizer(config)
    from jaxrl_hier.llm_rl.data import evaluation_problems
    from jaxrl_hier.llm_rl.sft_stage import run_sft_stage
    from jaxrl_hier.llm_rl.model_setup import build_mesh, build_policy

    sft_cfg = config.sft_config()
    mesh = build_mesh(sft_cfg)
    lm, tokenizer = build_policy(sft_cfg, tokenizer, mesh=mesh)
    ns = argparse.Namespace(no_progress=True, resume=True, output_dir=run_dir)
    if config.sft.steps:
        lm, _ = run_sft_stage(sft_cfg.sft_stage(), ns, run_dir, lm, tokenizer, task, mesh)
    rm, rm_params, rm_info = cli.run_reward_model_stage(config, run_dir, lm, tokenizer, task)
    test = evaluation_problems(task, config.eval_problems, config.seed)  # the run's own evaluation set
    if args.unroll_decode != "auto":  # how the generator's decode loop runs the layers (ModelConfig.unroll_decode)
        lm = lm.with_unroll_decode(UNROLL_DECODE[args.unroll_decode])
    if args.throughput_only:
        env = cli.build_env(config, lm, rm, tokenizer)
        env_params = cli.env_params_for(config, env, lm.params, rm_params, tokenizer, test)
        tp = throughput(env, env_params, batch=args.throughput_batch, steps=args.throughput_steps, seed=config.seed)
        tp["unroll_decode"] = args.unroll_decode
        atomic_write_json(args.out / "throughput.json", tp)
        print(json.dumps(tp, indent=1))
        return 0
    search, net_params, start_params = cli.run_ppo_stage(config, ns, run_dir, lm, rm, rm_params, tokenizer, task)

    tick = time.perf_counter()
    rows, trees = cli.evaluate_all(config, lm, rm, rm_params, tokenizer, task, test, (search, net_params),
                                   sc_samples=tuple(args.sc), mcts_simulations=tuple(args.mcts),
                                   start_params=start_params)
    eval_s = time.perf_counter() - tick

    env = cli.build_env(config, lm, rm, tokenizer)
    env_params = cli.env_params_for(config, env, lm.params, rm_params, tokenizer, test)
    tp = throughput(env, env_params, batch=args.throughput_batch, steps=args.throughput_steps, seed=config.seed)

    import jax

    result = {"rows": rows, "problems": len(test), "reward_model": rm_info.get("eval"), "throughput": tp,
              "pipeline_s": pipeline_s, "eval_s": eval_s, "run_dir": str(run_dir),
              "device": f"{jax.devices()[0].platform} ({os.cpu_count()} cores, {platform.processor() or 'cpu'})",
              "command": "python benchmarks/search/pgts.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    table = cli.results_table(rows)
    table += (f"\nSearch throughput (random valid actions, {tp['vectorised_trees']} trees): "
              f"{tp['vectorised_steps_per_s']:.1f} env steps/s vectorised vs {tp['python_loop_steps_per_s']:.1f} "
              f"one tree at a time from a Python loop ({tp['speedup']:.1f}x).\n")
    atomic_write_json(args.out / "results.json", result)
    atomic_write_text(args.out / "table.md", table)
    atomic_write_text(args.out / "trees.txt", "".join(f"=== {k}\n{v}\n\n" for k, v in trees.items()))
    cli.plot_accuracy_vs_tokens(rows, args.out / "accuracy_vs_tokens.png", "PGTS vs baselines, held-out arithmetic")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
