"""The generalist alone: flat PPO that also sees the skill library's conditions, an ablation of the
managed agent.

The managed agent (`skills.manager`) trains its own base actions first as a generalist, with every
skill closed: PPO on the base reward in the manager's network, whose inputs are the env's
observation plus which of the manager's skills may start (the skills' success conditions that do
not hold yet). This script trains that network, skills closed, for a whole budget with flat PPO's
kind of schedule, and plays it from fresh worlds as `skills eval` plays a managed agent. Set
against flat PPO at the same budget and schedule (`skills_vs_ppo.py --ppo-budget`), it tells what
the condition inputs alone are worth; set against the managed agent, what the skills and the
manager stage add.

    python benchmarks/skills/generalist_alone.py --config configs/skills_craftax_classic.yaml \
        --budget 8478720 --anneal-start 0.7875 --out DIR --seed 0

No skill is trained: the experts the closed options would route to are never run, so their bank
holds zeros. Writes `DIR/generalist_alone.json` (settings, device, training curve, wall time, and the
sampled and greedy reports on the validation and test worlds). Training is a resumable run
(`jaxrl_hier.runs.ResumableRun`): the runner under `DIR/checkpoints/` every `--checkpoint-every`
chunks and at the end, one row a chunk in `DIR/metrics.jsonl`; after a kill, the same command with
`--resume` goes on from the last checkpoint to the same numbers, and a fresh command refuses a
directory that holds a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import numpy as np

from jaxrl_hier.bench import device_info
from jaxrl_hier.config import ConfigError, load_config
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.runs import ResumableRun, refuse_existing_run
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composition import episode_limit, play_both_modes
from jaxrl_hier.skills.composed import summarize
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.manager import ManagedAgent, ManagerTrainer
from jaxrl_hier.skills.trainer import skill_env_and_policy


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a skills config with a manager section")
    p.add_argument("--out", "--output-dir", dest="out", type=Path, required=True)
    p.add_argument("--resume", action="store_true", help="go on from the run in --out (after a kill)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="chunks between checkpoints")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, required=True, help="env steps (rounded down to whole chunks)")
    p.add_argument("--anneal-start", type=float, default=0.0,
                   help="share of the updates at the constant rate before it decays linearly to 0 (PPO anneal_start)")
    p.add_argument("--worlds-seed", type=int, default=2000, help="test worlds: key WORLDS_SEED + seed")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--validation-worlds-seed", type=int, default=1000)
    p.add_argument("--validation-episodes", type=int, default=64)
    p.add_argument("overrides", nargs="*", help="key=value overrides of the skills config")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    config = load_config(SkillsConfig, args.config, [*args.overrides, f"seed={args.seed}"])
    library = check_config(config)
    names = list(config.manager.named_skills)
    if not names or not config.manager.primitives:
        print("error: the config's manager section must name its skills and take base actions (primitives: true)",
              file=sys.stderr)
        return 2
    if not args.resume:
        try:
            refuse_existing_run(args.out)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    chunk = config.updates_per_round * config.steps_per_update
    chunks = args.budget // chunk
    ppo = dataclasses.replace(config.manager_ppo_config(closed=True), anneal_lr=True, anneal_start=args.anneal_start,
                              total_timesteps=chunks * chunk)
    ppo.validate()
    env, base_params, policy = skill_env_and_policy(config, library)
    obs_dim = int(np.prod(env.base.observation_space(base_params).shape))
    zeros = {d: policy.expert_zeros(obs_dim) for s in names for d in (*library.closure(s), s)}
    trainer = ManagerTrainer(config, env, base_params, library, zeros, names, closed=True, ppo=ppo)
    runner = trainer.init(jax.random.PRNGKey(args.seed))
    meta = {"config": str(args.config), "overrides": list(args.overrides), "seed": args.seed, "chunks": chunks,
            "anneal_start": args.anneal_start}
    args.out.mkdir(parents=True, exist_ok=True)
    with ResumableRun(args.out / "checkpoints", meta, keep=2, every=args.checkpoint_every, total=chunks,
                      resume=args.resume) as run:
        runner, _ = run.restore(runner)
        writer = run.log(args.out)

        def chunk_step(runner, done):
            runner, record, seconds = trainer.train(runner)
            writer.write({"update": done + 1, "env_steps": (done + 1) * chunk,
                          "episode_return": record.get("episode_return"), "chunk_s": seconds})
            return runner, 1, {"return": record.get("episode_return")}

        runner, _ = run.run_steps(args, runner, total=chunks, desc="generalist", step=chunk_step)
    rows = read_jsonl(args.out / "metrics.jsonl")
    walls = list(itertools.accumulate(r["chunk_s"] for r in rows))
    curve = [{"env_steps": r["env_steps"], "episode_return": r["episode_return"], "wall_s": w}
             for r, w in zip(rows, walls)]
    wall, first = (walls[-1], rows[0]["chunk_s"]) if rows else (0.0, None)
    agent = ManagedAgent(trainer)
    managed = agent.managed(trainer, trainer.result(runner)["manager"], env.conditions([library[s] for s in names]))
    base = env.base
    achievements, rewards = tuple(base.achievement_names), tuple(base.achievement_rewards)
    max_steps = episode_limit(base_params)
    out = {"config": args.config, "overrides": args.overrides, "seed": args.seed, "skills": names,
           "env_steps": chunks * chunk, "ppo": dataclasses.asdict(ppo), "device": device_info(),
           "train_wall_s": wall, "first_chunk_s": first, "curve": curve,
           "resumed": args.resume}
    for split, seed, episodes in (("validation", args.validation_worlds_seed, args.validation_episodes),
                                  ("test", args.worlds_seed, args.episodes)):
        out[split] = {"worlds_seed": seed + args.seed, "episodes": episodes}
        out[split].update(play_both_modes(lambda k, greedy: summarize(
            agent.evaluate(managed, k, episodes, max_steps, greedy), achievements, rewards, names, agent.labels),
            jax.random.key(seed + args.seed)))
        print(f"{split}: score {out[split]['sampled']['score_percent_of_max']:.1f}% sampled, "
              f"{out[split]['greedy']['score_percent_of_max']:.1f}% greedy", flush=True)
    atomic_write_json(args.out / "generalist_alone.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
