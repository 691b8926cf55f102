"""Bottom-up skills against flat PPO at the same total env steps, both judged from fresh worlds.

For each seed:
1. the skills run (`python -m jaxrl_hier.skills run --config CONFIG seed=S`), or an existing run
   directory (`--skills-runs`); its budget is every env step of every skill, failed attempts included,
   plus the chain fine-tuning's (`chain_timesteps`, skills.chain), whose tuned experts are the final agent;
2. flat PPO on the same env (the skills config's `env` and `env_params`) for that budget, with the
   skills config's own `ppo` section (same envs, rollout, widths, learning rate; annealed, since
   flat PPO knows its budget), or the fields of `--ppo-config`;
3. the agents played greedy and sampled from `--episodes` fresh worlds for full-length episodes:
   the composed agent of the completed skills (`skills.composed`), the run's managed agent where it
   has a manager stage (`skills.manager`, whose steps the budget counts), PPO's final policy, and
   with `--variant-runs` the managed agent of a copy of the run whose manager stage ran with other
   settings (say `manager.primitives: true` in the copy's config.yaml before its manager stage).

`--ppo-budget N` runs flat PPO alone for N env steps (a control set against a skills run of N steps,
say flat PPO with `--ppo-config` holding another learning-rate schedule), and `--validation-worlds-seed`
plays its final policy from a second set of worlds too, to choose such settings on.

The curve of achievements against env steps: flat PPO evaluated the same way after every chunk of
`--ppo-chunks`; the skills at each skill's completion (the composed agent of the skills completed
by then, at the env steps all skills had taken by that round: the skills' own experts), then the
final agent at the whole budget (after the chain fine-tuning, when the run has one).

    python benchmarks/skills/skills_vs_ppo.py --config configs/skills_techtree.yaml \
        --out benchmarks/results/cpu/skills_vs_ppo/techtree --seeds 0 1 2

Writes `skills_vs_ppo.json`, `skills_vs_ppo.md` (per-achievement success rates, score, env steps,
wall time, env steps/s, mean and standard error over seeds) and `skills_vs_ppo.png`.
`--throughput RUN` prints a skills run's env steps/s per round from its metrics alone.

Every seed's skills run and flat PPO share one persistent compilation cache, OUT/xla_cache (or the
one `JAX_COMPILATION_CACHE_DIR` names): the seeds after the first load most of their programs
instead of compiling them (a tiny TechTree run: 9 programs cached by seed 0, 7 of them loaded by
seed 1). A cached program is the same executable, so no figure changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import numpy as np
import yaml

from jaxrl_hier.bench import device_info, fmt_mean_se, mean_se
from jaxrl_hier.config import build_dataclass, load_config
from jaxrl_hier.io import atomic_write_json, atomic_write_text
from jaxrl_hier.logging.metrics import read_jsonl
from jaxrl_hier.logging.plots import save_figure
from jaxrl_hier.runs import use_compilation_cache
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composed import (build_composition, choose_target, episode_limit, load_managed, load_run,
                                        play_episodes, summarize)
from jaxrl_hier.skills.composition import play_both_modes
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.state import load_state

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="a skills config (configs/skills_*.yaml)")
    p.add_argument("--out", type=Path)
    p.add_argument("--throughput", type=Path, metavar="RUN",
                   help="only print a skills run directory's env steps/s per round (JSON), from its metrics")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--skills-runs", type=Path, nargs="*", default=None,
                   help="finished skills run directories, one per seed (skips the skills runs)")
    p.add_argument("--skills-wall-s", type=float, nargs="*", default=None,
                   help="the wall time of each --skills-runs run (seconds), for the table")
    p.add_argument("--ppo-config", default=None, help="a PPO YAML whose fields replace the skills config's ppo")
    p.add_argument("--episodes", type=int, default=128, help="fresh-world episodes per agent, mode and seed")
    p.add_argument("--worlds-seed", type=int, default=1000, help="the fresh worlds of seed S come from key "
                   "WORLDS_SEED + S (keep them apart from the worlds a setting was chosen on: `skills eval --seed`)")
    p.add_argument("--ppo-budget", type=int, default=None, metavar="N",
                   help="flat PPO alone for N env steps (no skills run): a control for a skills run of N steps")
    p.add_argument("--validation-worlds-seed", type=int, default=None, metavar="V",
                   help="flat PPO's final policy also played from the worlds of key V + S (validation worlds)")
    p.add_argument("--validation-episodes", type=int, default=64, help="episodes per mode on the validation worlds")
    p.add_argument("--ppo-chunks", type=int, default=8, help="evaluations along flat PPO's run")
    p.add_argument("--no-curve", action="store_true",
                   help="skip the curve (the composed agent at each completion, PPO after each chunk): only the "
                        "final agents are evaluated, so a short GPU run spends its time training")
    p.add_argument("--include-running", action="store_true",
                   help="judge the final composed agent with the running skills' experts too (their latest "
                        "checkpoint): for a run stopped by max_rounds before its frontier skills completed")
    p.add_argument("--variant-runs", type=Path, nargs="*", default=None,
                   help="one per seed: a copy of that seed's skills run whose manager stage ran with other "
                        "settings (the same skills and chain, the same env steps), played as one more agent")
    p.add_argument("--variant-label", default="skills + manager (variant)", help="the variant's name in the table")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the skills config")
    return p.parse_args(argv)


def run_skills(args, seed: int) -> tuple[Path, float]:
    out = args.out / f"skills_seed{seed}"
    cmd = [sys.executable, "-m", "jaxrl_hier.skills", "run", "--config", args.config, "--output-dir", str(out),
           "--no-progress", f"seed={seed}", "eval_episodes=0", *args.overrides]
    env = {**os.environ, **({"JAX_COMPILATION_CACHE_DIR": str(args.xla_cache)} if args.xla_cache else {})}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):  # 1: the target did not complete, which is a result too
        sys.exit(f"skills run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return out, wall


def skills_curve(run_dir: Path, run, state, key, episodes: int, max_steps: int) -> list[dict]:
    """The composed agent at each skill's completion: (env steps of all skills by then, summary).
    `run` and `state` are the run directory's, already loaded (`load_run`, `load_state`): its
    experts and its agent, whose evaluation is compiled once for the final figures and the curve."""
    rows = {r.name: read_jsonl(run_dir / "skills" / r.dirname / "metrics.jsonl") for r in state.skills}

    def steps_by(round_: int) -> int:
        return sum(max((row["total_steps"] for row in rs if row["update"] <= round_), default=0)
                   for rs in rows.values())

    done = sorted((rows[r.name][-1]["update"], r.name) for r in state.by_status("completed"))
    curve, names = [], []
    base = run.env.base
    for round_, name in done:
        names.append(name)
        experts = {n: run.experts[n] for n in names}
        comp, _ = build_composition(run.env, run.library, experts, choose_target(run.library, names, "all"))
        stats = run.agent.evaluate(comp, key, episodes, max_steps, False)
        s = summarize(stats, base.achievement_names, base.achievement_rewards, list(experts))
        curve.append({"env_steps": steps_by(round_), "skill": name,
                      "achievements_per_episode": float(sum(s["achievements"].values()))})
    return curve


def skills_throughput(run_dir: Path, state) -> dict:
    """Env steps/s of the skills program, per round: the steps of every skill that trained in it over
    the round's wall time (`metrics.jsonl`: cumulative `total_steps` and `wall_s` per skill). A round
    that meets a new shape (a new number of running skills, or a longer frozen-expert bank) compiles
    first: `steps_per_s` counts those rounds, the median round's rate does not, and `compile_rounds_s`
    is the time of the rounds over 3x the median round's."""
    rounds: dict[int, list] = {}
    for r in state.skills:
        prev_steps = prev_wall = 0.0
        for row in read_jsonl(run_dir / "skills" / r.dirname / "metrics.jsonl"):
            entry = rounds.setdefault(row["update"], [0, 0.0])
            entry[0] += row["total_steps"] - prev_steps
            entry[1] = max(entry[1], row["wall_s"] - prev_wall)  # every skill of a round shares its time
            prev_steps, prev_wall = row["total_steps"], row["wall_s"]
    if not rounds:
        return {"rounds": 0, "steps_per_s": None, "median_round_steps_per_s": None, "compile_rounds_s": None}
    times = np.array([t for _, t in rounds.values()])
    steps = np.array([n for n, _ in rounds.values()])
    slow = times > 3 * np.median(times)
    return {"rounds": len(rounds), "round_time_s": float(times.sum()), "steps_per_s": float(steps.sum() / times.sum()),
            "median_round_steps_per_s": float(np.median(steps / times)), "compile_rounds": int(slow.sum()),
            "compile_rounds_s": float(times[slow].sum())}


def stage_times(run_dir: Path) -> dict:
    """Seconds and env steps/s of each PPO stage after the skills (chain, generalist, manager) that
    the run has: the chunks' wall times in the stage's `metrics.jsonl` (the first chunk compiles)."""
    from jaxrl_hier.skills.chain import CHAIN_DIR
    from jaxrl_hier.skills.manager import GENERALIST_DIR, MANAGER_DIR

    out = {}
    for stage, dirname in (("chain", CHAIN_DIR), ("generalist", GENERALIST_DIR), ("manager", MANAGER_DIR)):
        rows = read_jsonl(Path(run_dir) / dirname / "metrics.jsonl")  # [] for a stage the run did not have
        if rows:
            wall = sum(r["wall_s"] for r in rows)
            out[stage] = {"wall_s": wall, "first_chunk_s": rows[0]["wall_s"], "env_steps": rows[-1]["env_steps"],
                          "steps_per_s": rows[-1]["env_steps"] / wall}
    return out


def wall_parts(skills: dict) -> dict | None:
    """Where a skills run's wall time went: its skill rounds (those that compiled apart), each later
    stage, and the rest (checkpoints, evaluations between rounds, start-up); None without the wall time."""
    if not skills.get("wall_s"):
        return None
    rounds = skills.get("round_time_s") or 0.0
    parts = {"skill rounds": rounds - (skills.get("compile_rounds_s") or 0.0),
             "skill rounds that compiled": skills.get("compile_rounds_s") or 0.0,
             **{stage: t["wall_s"] for stage, t in skills.get("stages", {}).items()}}
    parts["the rest"] = skills["wall_s"] - sum(parts.values())
    return parts


def ppo_agent(args, config: SkillsConfig, budget: int, seed: int):
    from jaxrl_hier.algorithms.ppo import PPOConfig, make_train

    values = dict(config.ppo)
    if args.ppo_config:
        values = {k: v for k, v in yaml.safe_load(Path(args.ppo_config).read_text()).items()
                  if k not in ("env", "total_timesteps", "seed")}
    values.update(env=config.env, seed=seed, anneal_lr=True, eval_gif=False, num_seeds=1)
    per_update = values.get("num_envs", PPOConfig.num_envs) * values.get("num_steps", PPOConfig.num_steps)
    # At least the skills' budget, in whole chunks of equal size: a chunk's length is a static
    # argument of the compiled update, and a shorter last chunk would compile a second program.
    chunks = max(1, args.ppo_chunks)
    values["total_timesteps"] = math.ceil(max(budget, per_update) / (per_update * chunks)) * per_update * chunks
    ppo = build_dataclass(PPOConfig, values, source="flat PPO")
    env, env_params = config.make_env()
    return make_train(ppo, env=env, env_params=env_params), ppo


def make_ppo_eval(trainer, episodes: int, max_steps: int):
    """`evaluate(runner, key, greedy)`: seed 0's policy played from fresh worlds, compiled once per
    mode (the policy's parameters are arguments, so every evaluation along the run reuses it)."""

    def play(params, extra, key, greedy):
        def act(obs, state, k):
            pi, _ = trainer.apply(params, extra, obs)
            action = jax.numpy.argmax(pi.logits, -1) if greedy else pi.sample(seed=k)
            return action, jax.numpy.zeros_like(action)  # one label: the flat policy

        return play_episodes(trainer.env, trainer.env_params, act, lambda s: jax.numpy.zeros((episodes, 0), bool),
                             key, episodes, max_steps)

    compiled = jax.jit(play, static_argnums=3)

    def evaluate(runner, key, greedy: bool):
        params, extra = (jax.tree.map(lambda x: x[0], t) for t in (runner.train_state.params, runner.extra_variables))
        return jax.tree.map(np.asarray, compiled(params, extra, key, greedy))

    return evaluate


def run_ppo(args, config, budget: int, seed: int, key, max_steps: int, names, rewards) -> dict:
    trainer, ppo = ppo_agent(args, config, budget, seed)
    evaluate = make_ppo_eval(trainer, args.episodes, max_steps)
    runner = trainer.init(jax.random.PRNGKey(seed))
    total = ppo.num_updates
    chunk = max(1, math.ceil(total / args.ppo_chunks))
    curve, done, train_s, compile_s, first_n = [], 0, 0.0, None, 0
    while done < total:
        n = min(chunk, total - done)
        t0 = time.perf_counter()
        runner, metrics = trainer.update(runner, n)
        jax.block_until_ready(metrics)
        elapsed = time.perf_counter() - t0
        if compile_s is None:
            compile_s, first_n = elapsed, n
        train_s += elapsed
        done += n
        if not args.no_curve or done == total:
            stats = evaluate(runner, key, greedy=False)
            s = summarize(stats, names, rewards, [])
            curve.append({"env_steps": done * ppo.steps_per_update,
                          "achievements_per_episode": float(sum(s["achievements"].values()))})
    # the first chunk holds the compilation; the steady rate is over the chunks after it
    steady = ((total - first_n) * ppo.steps_per_update / (train_s - compile_s)) if total > first_n else None
    out = {"env_steps": total * ppo.steps_per_update, "wall_s": train_s, "first_chunk_s": compile_s,
           "steps_per_s": total * ppo.steps_per_update / train_s, "steady_steps_per_s": steady, "curve": curve}
    def both_modes(evaluate, worlds) -> dict:
        return play_both_modes(lambda k, greedy: summarize(evaluate(runner, k, greedy), names, rewards, []), worlds)

    out.update(both_modes(evaluate, key))
    if args.validation_worlds_seed is not None:
        worlds = args.validation_worlds_seed + seed
        out["validation"] = {"worlds_seed": worlds, "episodes": args.validation_episodes,
                             **both_modes(make_ppo_eval(trainer, args.validation_episodes, max_steps),
                                          jax.random.key(worlds))}
    return out


def table(results: dict, names) -> str:
    seeds = results["seeds"]
    lines = [f"{len(seeds)} seed(s) {seeds}; {results['episodes']} fresh-world episodes per agent, mode and seed, "
             f"up to {results['max_steps']} steps; mean ± standard error over seeds",
             ""]
    agents = [a for a in ("skills", "manager", "variant", "ppo") if all(a in r for r in results["runs"])]
    label = {"skills": "skills (composed)", "manager": "skills + manager", "ppo": "flat PPO",
             "variant": results.get("variant_label")}
    lines += ["| | " + " | ".join(f"{label[a]} ({m})" for a in agents for m in ("greedy", "sampled")) + " |",
              "|---|" + "---:|" * (2 * len(agents))]

    def cell(agent, mode, field, sub=None, pct=True):
        vals = [(r[agent][mode][field] if sub is None else r[agent][mode][field][sub]) for r in results["runs"]]
        if field == "score_percent_of_max":
            vals = [None if v is None else v / 100 for v in vals]
        return fmt_mean_se(*mean_se(vals), pct=pct)

    for n in names:
        lines.append(f"| {n} (%) | " + " | ".join(cell(a, m, "achievements", n) for a in agents
                                                 for m in ("greedy", "sampled")) + " |")
    lines.append("| mean return | " + " | ".join(cell(a, m, "mean_return", pct=False) for a in agents
                                                for m in ("greedy", "sampled")) + " |")
    lines.append("| score (% of max) | " + " | ".join(cell(a, m, "score_percent_of_max") for a in agents
                                                     for m in ("greedy", "sampled")) + " |")
    def rate(agent, field):
        return fmt_mean_se(*mean_se([r[agent].get(field) for r in results["runs"]]), pct=False)

    lines += ["", "| | env steps | wall time (s) | env steps/s, compiles included | env steps/s, steady |",
              "|---|---:|---:|---:|---:|",
              *([f"| skills run | {np.mean([r['skills']['env_steps'] for r in results['runs']]):,.0f} "
                 f"| {rate('skills', 'wall_s')} | {rate('skills', 'steps_per_s')} "
                 f"| {rate('skills', 'median_round_steps_per_s')} (median round) |"] if "skills" in agents else []),
              *([f"| the same run with its manager stage | {np.mean([r['manager']['env_steps'] for r in results['runs']]):,.0f} "
                 f"| (in the run's wall time) | | |"] if "manager" in agents else []),
              f"| flat PPO | {np.mean([r['ppo']['env_steps'] for r in results['runs']]):,.0f} | "
              f"{rate('ppo', 'wall_s')} (training only) | {rate('ppo', 'steps_per_s')} "
              f"| {rate('ppo', 'steady_steps_per_s')} (after the first chunk) |"]
    parts = [wall_parts(r["skills"]) for r in results["runs"] if "skills" in r]
    if parts and all(parts):
        keys = list(dict.fromkeys(k for p in parts for k in p))  # a seed may lack a stage another has
        lines += ["", "Where the skills run's wall time went, s (mean ± s.e. over seeds):", "",
                  "| " + " | ".join(keys) + " |", "|" + "---:|" * len(keys),
                  "| " + " | ".join(fmt_mean_se(*mean_se([p.get(k) for p in parts]), pct=False) for k in keys) + " |"]
        stages = {k for r in results["runs"] for k in r["skills"].get("stages", {})}
        lines += [f"\n{k}: " + fmt_mean_se(*mean_se([r["skills"]["stages"][k]["steps_per_s"] for r in results["runs"]
                                                      if k in r["skills"].get("stages", {})]), pct=False, digits=0)
                  + " env steps/s over its chunks, the first (compiling) included" for k in sorted(stages)]
    for r in (r for r in results["runs"] if "skills" in r):
        s = r["skills"]
        lines.append(f"\nseed {r['seed']}: composed agent towards {s['target']}; completed: {', '.join(s['completed'])}"
                     + (f"; still training (latest checkpoint): {', '.join(s['running'])}" if s.get("running") else ""))
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    from jaxrl_hier.logging.plots import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(results["runs"]):  # one legend entry per agent, however many seeds
        for agent, colour, marker, label in (("ppo", "tab:blue", ".", "flat PPO"),
                                             ("skills", "tab:orange", "o", "skills (composed agent)"),
                                             ("manager", "tab:green", "*", "skills + manager"),
                                             ("variant", "tab:red", "P", results.get("variant_label"))):
            if agent not in r:
                continue
            curve = r[agent]["curve"]
            ax.plot([p["env_steps"] for p in curve], [p["achievements_per_episode"] for p in curve], color=colour,
                    marker=marker, label=label if i == 0 else None)
    ax.set(xlabel="env steps (all skills counted)", ylabel="achievements per fresh-world episode (sampled)",
           title=results["env"])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def stage_steps(state) -> int:
    """Env steps of the run's finished manager stage, its generalist stage's included (0: no manager)."""
    if state.manager.get("status") != "done":
        return 0
    return int(state.manager.get("steps", 0)) + int(state.generalist.get("steps", 0))


def managed_figures(run_dir: Path, run_config: SkillsConfig, run, state, budget: int, key, episodes: int,
                    max_steps: int) -> dict:
    """The run's managed agent from the fresh worlds of `key`, greedy and sampled."""
    agent, managed = load_managed(run_dir, run_config, run)
    names, rewards = tuple(run.env.base.achievement_names), tuple(run.env.base.achievement_rewards)
    out = {"env_steps": budget, "manager_steps": int(run.manager["steps"]),
           "generalist_steps": int(state.generalist.get("steps", 0)), "skills": run.manager["skills"],
           "manager_config": dataclasses.asdict(run_config.manager)}
    out.update(play_both_modes(lambda k, greedy: summarize(agent.evaluate(managed, k, episodes, max_steps, greedy),
                                                           names, rewards, list(run.experts), agent.labels), key))
    out["curve"] = [{"env_steps": budget, "achievements_per_episode":
                     float(sum(out["sampled"]["achievements"].values()))}]
    return out


def variant_figures(run_dir: Path, catalog, include_running: bool, state, budget: int, key, episodes: int,
                    max_steps: int) -> dict:
    """`managed_figures` of a copy of the run whose manager stage ran with other settings; refused
    unless its skills and chain are the run's own and its manager stage spent the same env steps."""
    run_config = load_config(SkillsConfig, run_dir / "config.yaml", [])
    other = load_state(run_dir)
    same = ([(r.name, r.total_steps) for r in other.skills] == [(r.name, r.total_steps) for r in state.skills]
            and other.chain.get("steps") == state.chain.get("steps") and stage_steps(other) == stage_steps(state) > 0)
    if not same:
        sys.exit(f"{run_dir}: not a copy of the skills run with a finished manager stage of the same length")
    return managed_figures(run_dir, run_config, load_run(run_dir, run_config, catalog, include_running), other, budget,
                           key, episodes, max_steps)


def write_results(args, config: SkillsConfig, max_steps: int, runs: list, partial: bool = False) -> dict:
    """`skills_vs_ppo.json`; `partial` while a seed's flat PPO is still to run (that seed has no `ppo`)."""
    results = {"env": config.env, "config": args.config, "overrides": args.overrides, "seeds": args.seeds,
               "episodes": args.episodes, "worlds_seed": args.worlds_seed, "max_steps": max_steps,
               "variant_label": args.variant_label if args.variant_runs else None,
               "device": device_info(), "partial": partial,
               "runs": runs}
    atomic_write_json(args.out / "skills_vs_ppo.json", results)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.throughput:
        print(json.dumps(skills_throughput(args.throughput, load_state(args.throughput)), indent=1))
        return 0
    if not (args.config and args.out):
        sys.exit("give --config and --out (or --throughput RUN)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.xla_cache = use_compilation_cache(args.out)  # shared by every seed's skills run and flat PPO
    config = load_config(SkillsConfig, args.config, args.overrides)
    catalog = check_config(config)
    base, base_params = config.make_env()
    names, rewards = tuple(base.achievement_names), tuple(base.achievement_rewards)
    max_steps = episode_limit(base_params)
    if args.skills_runs and len(args.skills_runs) != len(args.seeds):
        sys.exit("give one --skills-runs directory per seed")
    if args.variant_runs and len(args.variant_runs) != len(args.seeds):
        sys.exit("give one --variant-runs directory per seed")
    if args.ppo_budget and (args.skills_runs or args.variant_runs):
        sys.exit("--ppo-budget runs flat PPO alone: give it without --skills-runs and --variant-runs")
    runs = []
    for i, seed in enumerate(args.seeds):
        key = jax.random.key(args.worlds_seed + seed)  # the same fresh worlds for both agents
        if args.ppo_budget:
            runs.append({"seed": seed, "ppo": run_ppo(args, config, args.ppo_budget, seed, key, max_steps, names,
                                                      rewards)})
            write_results(args, config, max_steps, runs, partial=seed != args.seeds[-1])
            continue
        if args.skills_runs:
            run_dir, wall = args.skills_runs[i], args.skills_wall_s[i] if args.skills_wall_s else None
        else:
            run_dir, wall = run_skills(args, seed)
        run_config = load_config(SkillsConfig, run_dir / "config.yaml", [])
        state = load_state(run_dir)
        # every skill's steps, failed attempts included, the chain fine-tuning's (skills.chain) and the
        # manager's with its generalist stage's (skills.manager)
        chain_steps = int(state.chain.get("steps", 0))
        manager_steps = stage_steps(state)
        budget = sum(r.total_steps for r in state.skills) + chain_steps + manager_steps
        run = load_run(run_dir, run_config, catalog, args.include_running)
        # the curve's points before the chain are the skills' own experts, not the tuned ones
        own = load_run(run_dir, run_config, catalog, args.include_running, use_chain=False) if run.chain else run
        aim = choose_target(run.library, list(run.experts), run.target)
        comp, plan = build_composition(run.env, run.library, run.experts, aim)
        skills = {"run_dir": str(run_dir), "env_steps": budget - manager_steps, "chain_steps": chain_steps,
                  "wall_s": wall,
                  "target": aim, "plan": plan,
                  **skills_throughput(run_dir, state), "stages": stage_times(run_dir),
                  "completed": [r.name for r in state.by_status("completed")], "running": list(run.running),
                  "skills_total": len(state.skills)}
        skills.update(play_both_modes(lambda k, greedy: summarize(
            run.agent.evaluate(comp, k, args.episodes, max_steps, greedy), names, rewards, list(run.experts), plan),
            key))
        skills["curve"] = [] if args.no_curve else skills_curve(run_dir, own, state, key, args.episodes, max_steps)
        # the composed agent at the skills' and chain's budget (failed attempts after the last completion
        # included); the managed agent, trained after them, at the whole budget
        skills["curve"].append({"env_steps": budget - manager_steps, "skill": "(composed agent)",
                                "achievements_per_episode": float(sum(skills["sampled"]["achievements"].values()))})
        entry = {"seed": seed, "skills": skills}
        if run.manager:
            entry["manager"] = managed_figures(run_dir, run_config, run, state, budget, key, args.episodes, max_steps)
        if args.variant_runs:
            entry["variant"] = variant_figures(args.variant_runs[i], catalog, args.include_running, state, budget, key,
                                               args.episodes, max_steps)
        # written now too: a run killed during flat PPO (a GPU machine's time running out) keeps the skills' figures
        write_results(args, config, max_steps, runs + [entry], partial=True)
        entry["ppo"] = run_ppo(args, run_config, budget, seed, key, max_steps, names, rewards)
        runs.append(entry)
        print(f"seed {seed}: skills {budget:,} steps, {len(skills['completed'])}/{len(state.skills)} skills completed; "
              f"target {aim} sampled {skills['sampled']['achievements'].get(aim, skills['sampled']['skills'][aim]):.2f}",
              flush=True)
    results = write_results(args, config, max_steps, runs)
    md = table(results, names)
    atomic_write_text(args.out / "skills_vs_ppo.md", md)
    plot(results, args.out / "skills_vs_ppo.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
