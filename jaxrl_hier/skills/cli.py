"""`python -m jaxrl_hier.skills run | status | resume`.

    python -m jaxrl_hier.skills run --config configs/skills_craftax_classic.yaml --output-dir DIR [key=value ...]
    python -m jaxrl_hier.skills status DIR
    python -m jaxrl_hier.skills eval DIR [--episodes N] [--target SKILL] [--max-steps N] [--seed N] [--before-chain]
                                         [--no-manager]
    python -m jaxrl_hier.skills resume DIR [key=value ...]   (only RESUME_SAFE_KEYS)
    python -m jaxrl_hier.skills branch SRC DST [--keep-generalist] [manager.key=value ...]   (skills.branch)

Bad input (config, skills, a corrupt or locked run directory) is one message and exit code 2,
before anything compiles. `run` and `resume` exit 0 when the run's final agent is trained
(`final_agent_trained`: the target skill completed, chain fine-tuning trained the agent towards it, or
the manager stage finished), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

from jaxrl_hier.config import ConfigError, closest, load_config, parse_overrides, save_config
from jaxrl_hier.runs import is_primary, use_compilation_cache
from jaxrl_hier.skills.config import CONFIG_FILE, SkillsConfig, saved_config
from jaxrl_hier.skills.spec import check_conditions
from jaxrl_hier.skills.state import PREV_FILE, STATE_FILE, SchedulerState, load_state

# Keys `resume` may change: none of them changes what the running skills compute (their env,
# network, PPO, seeds, round length, completion test and budget stay as the checkpoints hold them).
# They bound the whole run, retry failed skills, reach the generator, or judge the lock; a larger
# `chain_timesteps` goes on with the chain fine-tuning from its last chunk (skills.chain), a larger
# `manager.generalist_timesteps` with the generalist until the manager stage has begun.
RESUME_SAFE_KEYS = ("max_rounds", "max_wall_s", "max_retries", "stale_lock_s", "stuck_after_s", "generator",
                    "llm_base_url", "llm_model", "llm_api_key_env", "llm_timeout_s", "llm_max_retries", "llm_path",
                    "eval_episodes", "eval_gif_steps", "greedy_eval_every", "chain_timesteps", "manager.timesteps",
                    "manager.generalist_timesteps")


def build_catalog(config: SkillsConfig):
    """The skills the planner knows and whose Python predicates the env compiles."""
    from jaxrl_hier.skills.library import builtin_library, default_library_for
    from jaxrl_hier.skills.spec import load_skills_yaml

    name = config.library or default_library_for(config.env)
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return load_skills_yaml(name)
    return builtin_library(name)


def build_generator(config: SkillsConfig, catalog):
    from jaxrl_hier.skills.generators import TechTreePlanner

    if config.generator == "planner":
        planner = TechTreePlanner(catalog, config.manager.named_skills)
        planner.targets(config.target)  # an unknown target or manager skill is a config error, found now
        return planner
    if config.generator == "openai":
        from jaxrl_hier.skills.llm_generator import OpenAIChatGenerator

        try:
            return OpenAIChatGenerator(config.llm_base_url, config.llm_model, api_key_env=config.llm_api_key_env,
                                       timeout_s=config.llm_timeout_s, max_retries=config.llm_max_retries)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    from jaxrl_hier.skills.llm_generator import LocalLLMGenerator

    if not Path(config.llm_path).is_dir():
        raise ConfigError(f"llm_path {config.llm_path} is not a directory; give a local Hugging Face model "
                          "directory (nothing is downloaded).")
    return LocalLLMGenerator(config.llm_path)


def check_config(config: SkillsConfig):
    """Everything that can be checked before compiling: library, target, quantities."""
    from jaxrl_hier.skills.trainer import quantities_for

    catalog = build_catalog(config)
    env, _ = config.make_env()
    quantities = quantities_for(env, catalog)
    catalog.check_quantities(quantities)
    check_conditions("'manager.kickstart_when'", config.manager.teach_conditions, quantities)
    if config.target != "all" and config.generator == "planner" and config.target not in catalog:
        raise ConfigError(f"target '{config.target}' is not in the skill library ({', '.join(catalog.names)}).")
    for what, names in (("manager.skills", config.manager.named_skills), ("manager.features", config.manager.named_features),
                        ("skill_budgets", config.skill_budgets),
                        ("manager.restart_from", (config.manager.restart_from,) if config.manager.restart_from else ())):
        unknown = [s for s in names if s not in catalog]
        if unknown:
            raise ConfigError(f"{what} names {', '.join(repr(s) for s in unknown)}, not in the skill library."
                              f"{closest(unknown[0], list(catalog.names))} The library has: {', '.join(catalog.names)}.")
    named = config.manager.named_skills
    if config.manager.kickstart and (config.target == "all" or (named and config.target not in named)):
        raise ConfigError(f"'manager.kickstart' teaches the generalist the target's chain, but the target "
                          f"'{config.target}' is not {'one skill' if config.target == 'all' else 'in manager.skills'}: "
                          "name the target there or set kickstart to 0.")
    return catalog


def _progress(enabled: bool):
    start = time.monotonic()

    def show(state: SchedulerState) -> None:
        if not enabled:
            return
        running = ", ".join(f"{r.name} {_rate(r.success_rate)} ({r.steps:,} steps)" for r in state.by_status("running"))
        done = len(state.by_status("completed"))
        gen = state.generation + (f" ({state.generation_reason})" if state.generation_reason else "")
        elapsed = time.strftime("%H:%M:%S", time.gmtime(time.monotonic() - start))
        print(f"[round {state.round} {elapsed}] running: {running or '-'} | completed {done}/{len(state.skills)} | "
              f"generation {gen}", file=sys.stderr, flush=True)

    return show


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def status_table(state: SchedulerState, report: dict | None = None) -> str:
    """One row per skill. `success` is the training rate (episodes its own expert controlled); with a
    composed-agent report (`skills eval`), `fresh greedy` / `fresh sampled` give the share of the
    composed agent's fresh-world episodes in which the skill's conditions held."""
    fresh = ("fresh greedy", "fresh sampled") if report else ()
    rows = [("id", "skill", "status", "requires", "success", *fresh, "steps", "time", "note")]
    for r in state.skills:
        rates = tuple(_rate(report[m]["skills"].get(r.name)) for m in ("greedy", "sampled")) if report else ()
        where = "" if r.slot is None else f" (slot {r.slot}{', fresh worlds' if r.phase == 'fresh' else ''})"
        rows.append((str(r.id), r.name, r.status + where,
                     ", ".join(r.spec.get("requires", [])) or "-", _rate(r.success_rate), *rates,
                     f"{r.total_steps:,}", time.strftime("%H:%M:%S", time.gmtime(r.wall_s)), r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"target {state.target}; round {state.round}; generation {state.generation}"
                 + (f": {state.generation_reason}" if state.generation_reason else ""))
    if state.chain:
        c = state.chain
        lines.append(f"chain fine-tuning towards {c['target']} ({', '.join(c['plan'])}): {c['status']}, "
                     f"{c['steps']:,} env steps")
    if state.generalist:
        g = state.generalist
        taught = f", taught by {g['teacher']}'s chain" if g.get("teacher") else ""
        lines.append(f"generalist (the manager with its skills closed): {g['status']}, {g['steps']:,} env steps"
                     + taught)
    if state.manager.get("status") == "skipped":
        lines.append(f"manager: skipped, {state.manager['reason']}")
    elif state.manager:
        m = state.manager
        lines.append(f"manager over {len(m['skills'])} skills ({', '.join(m['skills'])}): {m['status']}, "
                     f"{m['steps']:,} env steps")
    if report:
        from jaxrl_hier.skills.composed import report_lines

        lines.extend(report_lines(report))
    return "\n".join(lines)


def _execute(config: SkillsConfig, catalog, output_dir: Path, resume: bool, progress: bool, on_lock=None) -> int:
    from jaxrl_hier.skills.scheduler import Scheduler
    from jaxrl_hier.skills.trainer import SkillTrainer

    use_compilation_cache(output_dir)  # a resume loads the compiled programs (runs.compile_cache)
    generator = build_generator(config, catalog)
    trainer = SkillTrainer(config, catalog)
    scheduler = Scheduler(config, output_dir, trainer, generator, catalog, progress=_progress(progress))
    state = scheduler.run(resume=resume, on_lock=on_lock)
    report = None
    if config.eval_episodes and state.by_status("completed") and is_primary():
        from jaxrl_hier.skills.composed import evaluate_run

        report = evaluate_run(output_dir, config, catalog, episodes=config.eval_episodes,
                              gif_steps=config.eval_gif_steps)
    print(status_table(state, report))
    return 0 if final_agent_trained(state) else 1


def final_agent_trained(state: SchedulerState) -> bool:
    """Every skill completed (target "all"), the target skill completed, the chain phase finished
    training the composed agent towards the target (then the final agent is the chain's, whether or
    not the target passed as a skill of its own: on TechTree it failed at every seed, and the chain
    took the agent to 79-87% diamonds), or the manager stage finished: the managed agent plays the
    base game over the completed skills, and a target that failed as a skill may still have taught
    its generalist (`manager.kickstart_from: attempted`)."""
    if state.manager.get("status") == "done":
        return True
    if state.target == "all":
        return all(r.status == "completed" for r in state.skills)
    chained = state.chain.get("status") == "done" and state.chain.get("target") == state.target
    return chained or any(r.name == state.target and r.status == "completed" for r in state.skills)


def cmd_run(args) -> int:
    config = load_config(SkillsConfig, args.config, args.overrides)
    out = Path(args.output_dir)
    if (out / STATE_FILE).exists() or (out / PREV_FILE).exists():
        raise ConfigError(f"{out} already holds a skills run; continue it with `python -m jaxrl_hier.skills resume "
                          f"{out}` or choose a new --output-dir.")
    catalog = check_config(config)
    out.mkdir(parents=True, exist_ok=True)
    if is_primary():  # in a multi-process run, process 0 writes the run directory
        save_config(config, out / CONFIG_FILE)
    return _execute(config, catalog, out, resume=False, progress=not args.no_progress)


def resume_overrides(items: list[str]) -> dict:
    """The `key=value` overrides of `resume`, refused unless every key is in RESUME_SAFE_KEYS."""
    overrides = parse_overrides(items)
    known = {f.name for f in dataclasses.fields(SkillsConfig)}
    for key in overrides:
        if key not in known and key.split(".")[0] not in ("ppo", "manager"):
            raise ConfigError(f"unknown config key '{key}'.{closest(key, RESUME_SAFE_KEYS)} resume accepts "
                              f"{', '.join(RESUME_SAFE_KEYS)}.")
        if key not in RESUME_SAFE_KEYS:
            raise ConfigError(f"'{key}' cannot be changed on resume: it would change what the running skills "
                              f"compute. resume accepts {', '.join(RESUME_SAFE_KEYS)}; for other changes start a "
                              "new run with `run --output-dir NEW_DIR`.")
    return overrides


def cmd_resume(args) -> int:
    out = Path(args.output_dir)
    overrides = resume_overrides(args.overrides)  # refused before anything is read or written
    load_state(out)  # a missing or corrupt state file is refused before anything compiles
    config = saved_config(out, overrides)
    catalog = check_config(config)
    # Written once the run directory is locked, so that later resumes keep the overrides.
    record = (lambda: save_config(config, out / CONFIG_FILE)) if overrides else None
    return _execute(config, catalog, out, resume=True, progress=not args.no_progress, on_lock=record)


def cmd_branch(args) -> int:
    """A copy of a run's skills with its later stages dropped and new manager settings (skills.branch);
    `resume DST` trains those stages."""
    from jaxrl_hier.skills.branch import branch_config, branch_run

    src, dst = Path(args.src), Path(args.dst)
    config = branch_config(src, args.overrides, args.keep_generalist)  # refused before anything is written
    check_config(config)
    branch_run(src, dst, config, args.keep_generalist)
    stages = "the manager stage" if args.keep_generalist else "the generalist and manager stages"
    print(f"branched {src} to {dst}; train {stages} with `python -m jaxrl_hier.skills resume {dst}`")
    return 0


def cmd_status(args) -> int:
    from jaxrl_hier.skills.composed import read_report

    out = Path(args.output_dir)
    print(status_table(load_state(out), read_report(out)))
    return 0


def cmd_eval(args) -> int:
    """The composed agent of a run, from fresh worlds: report in DIR/eval/ (see skills.composed)."""
    from jaxrl_hier.skills.composed import evaluate_run, report_dir

    out = Path(args.output_dir)
    state = load_state(out)
    config = saved_config(out)
    for flag in ("episodes", "max_steps"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}.")
    catalog = check_config(config)
    known = set(catalog.names) | {r.name for r in state.skills}
    if args.target is not None and args.target not in known:
        raise ConfigError(f"--target '{args.target}' is not a skill of this run or its library."
                          f"{closest(args.target, sorted(known))}")
    if not state.by_status("completed"):
        raise ConfigError(f"no skill of {out} has completed yet: there is no composed agent to evaluate.")
    use_compilation_cache(out)  # the run's own programs, and a second eval of it
    report = evaluate_run(out, config, catalog, episodes=args.episodes or config.eval_episodes or 64,
                          target=args.target, max_steps=args.max_steps, seed=args.seed,
                          gif_steps=config.eval_gif_steps, include_running=args.include_running,
                          use_chain=not args.before_chain, use_manager=not args.no_manager)
    print(status_table(state, report))
    print(f"report: {report_dir(out, not args.before_chain, not args.no_manager and args.target is None)}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxrl_hier.skills", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a skills run")
    run.add_argument("--config", required=True, help="a skills YAML config (configs/skills_*.yaml)")
    run.add_argument("--output-dir", required=True)
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    status = sub.add_parser("status", help="print the skills table of a run directory")
    status.add_argument("output_dir")
    ev = sub.add_parser("eval", help="play the composed agent of a run's completed skills from fresh worlds")
    ev.add_argument("output_dir")
    ev.add_argument("--episodes", type=int, default=None, help="fresh-world episodes per mode (default: "
                    "the config's eval_episodes)")
    ev.add_argument("--target", default=None, help="route towards this completed skill (default: the run's "
                    "target; for 'all' the deepest completed skill)")
    ev.add_argument("--max-steps", type=int, default=None, help="episode length (default: the env's own)")
    ev.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    ev.add_argument("--include-running", action="store_true", help="also route through the running skills' "
                    "experts as of the latest checkpoint (a run stopped before its frontier skills completed)")
    ev.add_argument("--before-chain", action="store_true", help="play the skills' own experts, not those of the "
                    "run's chain fine-tuning (report in DIR/eval_before_chain/)")
    ev.add_argument("--no-manager", action="store_true", help="play the composed agent routed towards the target, "
                    "not the run's learned manager (report in DIR/eval_composed/)")
    resume = sub.add_parser("resume", help="continue a run after a crash or a stop")
    resume.add_argument("output_dir")
    resume.add_argument("--no-progress", action="store_true")
    resume.add_argument("overrides", nargs="*", help=f"key=value, only for {', '.join(RESUME_SAFE_KEYS)}")
    branch = sub.add_parser("branch", help="copy a run's skills into a new run directory whose later stages "
                            "`resume` trains again with other manager settings")
    branch.add_argument("src")
    branch.add_argument("dst")
    branch.add_argument("--keep-generalist", action="store_true", help="keep SRC's finished generalist: only "
                        "the manager stage trains again")
    branch.add_argument("overrides", nargs="*", help="manager.key=value (any key; with --keep-generalist the "
                        "manager stage's own), eval_episodes, max_wall_s, ...")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    # key=value may come before or after the flags; argparse alone takes them only before.
    args, extra = p.parse_known_args(argv)
    bad = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    # Our own lines at INFO; libraries (Orbax logs every save at INFO through absl) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("jaxrl_hier").setLevel(logging.INFO)
    try:
        return {"run": cmd_run, "resume": cmd_resume, "status": cmd_status, "eval": cmd_eval,
                "branch": cmd_branch}[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from jaxrl_hier.checkpointing.checkpoints import CheckpointError

        if isinstance(err, CheckpointError):
            print(f"error: {err}", file=sys.stderr)
            return 2
        raise


