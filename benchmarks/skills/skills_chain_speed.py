"""What a chunk of chain fine-tuning costs (`skills.chain`), from a finished skills run: the chain's
PPO program built as the scheduler builds it, its compile timed apart from the chunks once compiled,
for each expert dispatch (`chain_moe_dispatch`: gather or mask) and any config overrides.

In a chain every expert trains, so `mask` (every expert on every row) pays the backward pass of all
of them; in a skill's round only the new expert trains. This measures which dispatch the chain
phase should use on a machine, and how its chunk time compares to a skill round's.

    python benchmarks/skills/skills_chain_speed.py RUN --out DIR [--chunks 3] [--dispatch mask gather] [key=value ...]

Beside each chunk it times the optimizer alone: one Adam step (`PPO.optimizer`, gradient clipping
included) on the chain's parameter tree, as each minibatch of the update takes it (a compiled scan
of a chunk's steps), and on flat PPO's network with the same `ppo` section, times the steps a chunk
takes (`updates_per_round` x `update_epochs` x `num_minibatches`). Every expert of the chain
trains, so its tree is the bank of actors and one critic; an Adam step reads and writes each
parameter and both moments.

Writes DIR/skills_chain_speed.json and a markdown table (device, versions, compile and chunk times).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import jaxrl_hier  # noqa: E402,F401  (sets XLA flags before JAX starts)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks.skills.skills_speed import flat_trainer  # noqa: E402

from jaxrl_hier.config import load_config  # noqa: E402
from jaxrl_hier.io import atomic_write_json, atomic_write_text  # noqa: E402
from jaxrl_hier.skills.chain import ChainTuner, chain_target, failed_experts  # noqa: E402
from jaxrl_hier.skills.cli import check_config  # noqa: E402
from jaxrl_hier.skills.composed import load_run  # noqa: E402
from jaxrl_hier.skills.config import SkillsConfig  # noqa: E402
from jaxrl_hier.skills.state import load_state, run_library  # noqa: E402
from jaxrl_hier.skills.trainer import load_expert, skill_env_and_policy  # noqa: E402


def chain_experts(run_dir: Path, config: SkillsConfig, catalog) -> dict:
    """The experts the chain phase starts from: the completed skills', then the failed ones' last attempts."""
    env, base_params, policy = skill_env_and_policy(config, catalog)
    like = policy.expert_zeros(int(np.prod(env.base.observation_space(base_params).shape)))
    completed = load_run(run_dir, config, catalog, use_chain=False).experts
    return {**completed, **failed_experts(run_dir, load_state(run_dir), lambda d: load_expert(d, like))}


def optimizer_step_s(ppo, params, steps: int, repeats: int = 5) -> float:
    """One optimizer step of `ppo` (its `optimizer()`) on `params`, as the update's scan takes it: a
    compiled scan of `steps` steps, the median of `repeats` calls divided by `steps`."""
    tx = ppo.optimizer()
    grads = jax.tree.map(lambda p: jax.numpy.full_like(p, 1e-3), params)

    @jax.jit
    def run(params, opt_state):
        def step(carry, _):
            params, opt_state = carry
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), None
        return jax.lax.scan(step, (params, opt_state), None, length=steps)[0]

    state = jax.block_until_ready(run(params, tx.init(params)))
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        state = jax.block_until_ready(run(*state))
        times.append(time.perf_counter() - tick)
    return float(np.median(times)) / steps


def optimizer_row(ppo, params, updates: int, chunk_s: float) -> dict:
    """One optimizer step's time on `params`, and the time of a chunk's steps (`updates` updates)
    as a share of the chain's chunk time `chunk_s`."""
    c = ppo.config
    steps = updates * c.update_epochs * c.num_minibatches
    step = optimizer_step_s(ppo, params, steps)
    return {"params": int(sum(np.size(p) for p in jax.tree.leaves(params))), "step_ms": step * 1e3,
            "steps_per_chunk": steps, "chunk_share": step * steps / chunk_s}


def time_chunks(config: SkillsConfig, catalog, experts: dict, library, chunks: int) -> dict:
    from jaxrl_hier.algorithms.ppo import train_chunk

    env, base_params, _ = skill_env_and_policy(config, catalog)
    target = chain_target(library, list(experts), config.target)
    tuner = ChainTuner(config, env, base_params, library, experts, target)
    runner = tuner.init(jax.random.key(config.seed))
    tick = time.perf_counter()
    runner, _, _ = train_chunk(tuner.ppo, runner, config.updates_per_round)  # compile + one chunk
    first = time.perf_counter() - tick
    times = []
    for _ in range(chunks):
        runner, _, elapsed = train_chunk(tuner.ppo, runner, config.updates_per_round)
        times.append(elapsed)
    chunk = float(np.median(times))
    one_seed = jax.tree.map(lambda p: p[0], runner.train_state.params)  # the runner's leading seed axis
    flat = flat_trainer(config)  # flat PPO's network, the same ppo section
    flat_params = jax.tree.map(lambda p: p[0], flat.init(jax.random.key(0)).train_state.params)
    chain_opt, flat_opt = (optimizer_row(p, params, config.updates_per_round, chunk)
                           for p, params in ((tuner.ppo, one_seed), (flat, flat_params)))
    return {"target": target, "plan": list(tuner.plan), "dispatch": config.chain_moe_dispatch,
            "first_chunk_s": first, "compile_s": max(first - chunk, 0.0), "chunk_s": times,
            "median_chunk_s": chunk, "env_steps_per_chunk": tuner.steps_per_chunk,
            "env_steps_per_s": tuner.steps_per_chunk / chunk, "optimizer": chain_opt, "flat_optimizer": flat_opt}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--dispatch", nargs="+", default=["mask", "gather"], choices=["mask", "gather"])
    p.add_argument("overrides", nargs="*", help="key=value overrides of the run's skills config")
    args = p.parse_args()
    config = load_config(SkillsConfig, args.run / "config.yaml", args.overrides)
    catalog = check_config(config)
    library = run_library(load_state(args.run), catalog)
    experts = chain_experts(args.run, config, catalog)
    rows = [time_chunks(dataclasses.replace(config, chain_moe_dispatch=d), catalog, experts, library, args.chunks)
            for d in args.dispatch]
    device = jax.devices()[0]
    result = {"device": f"{device.platform}:{device.device_kind}", "cpu": platform.processor() or platform.machine(),
              "jax": jax.__version__, "run": str(args.run), "overrides": args.overrides, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "skills_chain_speed.json", result)
    lines = [f"device: {result['device']}, jax {jax.__version__}; run {args.run}", "",
             "| dispatch | experts | compile (s) | chunk (s) | env steps/s |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['dispatch']} | {len(r['plan'])} | {r['compile_s']:.1f} | {r['median_chunk_s']:.2f} | "
              f"{r['env_steps_per_s']:,.0f} |" for r in rows]
    lines += ["", "One optimizer step (Adam, clipping included), on the chain's parameters and on flat PPO's network "
              "with the same ppo section; a chunk's steps and their time against the chunk's:", "",
              "| dispatch | tree | parameters | step (ms) | steps a chunk | their time (s) | share of the chain's chunk |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for name, o in (("chain", r["optimizer"]), ("flat PPO", r["flat_optimizer"])):
            lines.append(f"| {r['dispatch']} | {name} | {o['params']:,} | {o['step_ms']:.2f} | {o['steps_per_chunk']} | "
                         f"{o['step_ms'] * 1e-3 * o['steps_per_chunk']:.3f} | {o['chunk_share']:.0%} |")
    atomic_write_text(args.out / "skills_chain_speed.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
