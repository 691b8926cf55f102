"""What a chunk of chain fine-tuning costs (`skills.chain`), from a finished skills run: the chain's
PPO program built as the scheduler builds it, its compile timed apart from the chunks once compiled,
for each expert dispatch (`chain_moe_dispatch`: gather or mask) and any config overrides.

In a chain every expert trains, so `mask` (every expert on every row) pays the backward pass of all
of them; in a skill's round only the new expert trains. This measures which dispatch the chain
phase should use on a machine, and how its chunk time compares to a skill round's.

    python benchmarks/skills/skills_chain_speed.py RUN --out DIR [--chunks 3] [--dispatch mask gather] [key=value ...]

Writes DIR/skills_chain_speed.json and a markdown table (device, versions, compile and chunk times).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import numpy as np

from jaxrl_hier.config import load_config
from jaxrl_hier.io import atomic_write_json, atomic_write_text
from jaxrl_hier.skills.chain import ChainTuner, chain_target, failed_experts
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composed import load_run
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.state import run_library
from jaxrl_hier.skills.state import load_state
from jaxrl_hier.skills.trainer import load_expert, skill_env_and_policy


def chain_experts(run_dir: Path, config: SkillsConfig, catalog) -> dict:
    """The experts the chain phase starts from: the completed skills', then the failed ones' last attempts."""
    env, base_params, policy = skill_env_and_policy(config, catalog)
    like = policy.expert_zeros(int(np.prod(env.base.observation_space(base_params).shape)))
    completed = load_run(run_dir, config, catalog, use_chain=False).experts
    return {**completed, **failed_experts(run_dir, load_state(run_dir), lambda d: load_expert(d, like))}


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
    return {"target": target, "plan": list(tuner.plan), "dispatch": config.chain_moe_dispatch,
            "first_chunk_s": first, "compile_s": max(first - chunk, 0.0), "chunk_s": times,
            "median_chunk_s": chunk, "env_steps_per_chunk": tuner.steps_per_chunk,
            "env_steps_per_s": tuner.steps_per_chunk / chunk}


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
    atomic_write_text(args.out / "skills_chain_speed.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
