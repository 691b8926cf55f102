"""The train CLI: `python -m jaxrl_hier.train [--config PATH] [--output-dir DIR] [--resume] [key=value ...]`.

The config's `algorithm` key (default `ppo`) picks the trainer from `ALGORITHMS`. Python only
orchestrates here: it validates the config (exit code 2 on bad input, before anything compiles
and before any file of the run directory is written), then loops over compiled chunks of
`log_every` updates, writing metrics.jsonl, a progress bar, and Orbax checkpoints between them.
At the end it plots the learning curve and, for Craftax, renders one evaluation episode to a GIF.

The pieces every algorithm's CLI needs (output directory, resume checks, config.yaml, processes,
progress bar) live in `jaxrl_hier.runs`; `main` turns ConfigError and CheckpointError into
`error: ...` and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from jaxrl_hier.config import ConfigError, build_dataclass, closest, parse_overrides, read_yaml, to_dict
from jaxrl_hier.runs import (ResumableRun, check_resume_changes, init_distributed, is_primary, load_saved_config, log,
                             progress_bar, refuse_existing_run, resolve_output_dir, save_run_config, sync_processes)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "ppo_default.yaml"
DEFAULT_ALGORITHM = "ppo"

# The trainers `algorithm: <name>` selects, as "module:function" strings imported only when chosen.
# Contract of the function: `run(args: argparse.Namespace, raw_config: dict) -> int` (exit code).
# - `raw_config` is the YAML mapping (from --config, the default config, or on --resume the run
#   directory's config.yaml, unless --config is given) with the key=value overrides applied and
#   the `algorithm` key removed; `args.config_source` names where it came from (for messages).
# - `args` holds output_dir, resume, no_progress, distributed (jax.distributed is already
#   initialised when set).
# - Bad input raises ConfigError (or CheckpointError) before anything compiles and before any
#   file of the run directory is written; `main` prints it and exits 2. A fresh run calls
#   `jaxrl_hier.runs.refuse_existing_run`, a resume `check_resume_changes` with its own safe keys;
#   config.yaml is written with `save_run_config` (process 0 only) once every check has passed.
ALGORITHMS: dict[str, str] = {"ppo": "jaxrl_hier.train:run_ppo", "grpo": "jaxrl_hier.llm_rl.cli:run_grpo",
                              "sft": "jaxrl_hier.llm_rl.cli:run_sft", "guided": "jaxrl_hier.llm_rl.guided_cli:run_guided",
                              "pgts": "jaxrl_hier.search.cli:run_pgts"}

# PPOConfig keys a resume may change: they touch logging, outputs and checkpoint retention only,
# never what is learned. Every other key is refused on resume: total_timesteps, num_minibatches
# and update_epochs change the learning-rate schedule midway, the sizes change array shapes, and
# seed/env_shards/num_devices change the RNG streams or the layout the checkpoint was saved with.
PPO_RESUME_SAFE_KEYS = ("log_every", "checkpoint_every", "keep_checkpoints", "eval_gif", "eval_max_steps",
                        "tensorboard", "wandb", "wandb_project")

# Config keys that fix the shapes inside a checkpoint; a resume must match them.
STRUCTURAL_KEYS = ("env", "num_envs", "num_seeds", "network", "hidden_size", "rnn_hidden_size", "num_layers", "reset_mode",
                   "reset_ratio")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jaxrl_hier.train",
        description="Train an RL algorithm (the config's `algorithm` key, default ppo) compiled on the device.",
        epilog="Overrides are key=value pairs, e.g. env=gymnax:CartPole-v1 num_envs=64 total_timesteps=100000.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config (default: the built-in small Craftax-Classic run)")
    parser.add_argument("--output-dir", type=Path, default=None, help="run directory (default: runs/<env>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    parser.add_argument("--distributed", action="store_true",
                        help="call jax.distributed.initialize() first; reads JAX_COORDINATOR_ADDRESS, "
                             "JAX_NUM_PROCESSES, JAX_PROCESS_ID (multi-host; see README)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    return parser.parse_intermixed_args(argv)  # overrides may come before or after the flags


# ----------------------------------------------------------------------------- config and dispatch


def load_raw_config(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The config mapping the run starts from, with the overrides applied, and its source path."""
    if args.resume:
        if args.output_dir is None:
            raise ConfigError("--resume needs --output-dir: the run directory to continue.")
        saved = args.output_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"cannot resume: {saved} not found. Is {args.output_dir} a jaxrl_hier run directory?")
        path = args.config or saved
    else:
        path = args.config if args.config is not None else DEFAULT_CONFIG
    raw = read_yaml(path)
    raw.update(parse_overrides(args.overrides))
    return raw, str(path)


def algorithm_function(name: Any) -> Callable[[argparse.Namespace, dict], int]:
    """The registered trainer for `name`, or ConfigError naming the known ones."""
    if not isinstance(name, str) or name not in ALGORITHMS:
        hint = closest(name, list(ALGORITHMS)) if isinstance(name, str) else ""
        raise ConfigError(f"unknown algorithm {name!r}.{hint} Known algorithms: {', '.join(sorted(ALGORITHMS))}.")
    module, function = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), function)


def saved_algorithm(output_dir: Path) -> str:
    return read_yaml(output_dir / "config.yaml").get("algorithm", DEFAULT_ALGORITHM)


def check_logging_deps(config) -> None:
    """Optional sinks need their packages; say so before anything compiles."""
    import importlib.util

    for enabled, module, extra in ((config.tensorboard, "tensorboardX", "tensorboard"), (config.wandb, "wandb", "wandb")):
        if enabled and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{extra}=true needs the {module} package: pip install -e '.[{extra}]'")


# ----------------------------------------------------------------------------- PPO


def checkpoint_meta(trainer) -> dict:
    c = trainer.config
    meta = {k: getattr(c, k) for k in STRUCTURAL_KEYS}
    meta["env_shards"] = trainer.num_shards
    meta["obs_shape"] = list(trainer.env.observation_space(trainer.env_params).shape)
    meta["num_actions"] = int(trainer.env.action_space(trainer.env_params).n)
    return meta


def run_ppo(args: argparse.Namespace, raw_config: dict) -> int:
    """PPO through the CLI (the `ppo` entry of ALGORITHMS)."""
    from jaxrl_hier.algorithms.ppo import PPOConfig

    # Everything that can be wrong with the input is checked here, before any compile or write.
    config = build_dataclass(PPOConfig, raw_config, source=getattr(args, "config_source", "config"))
    check_logging_deps(config)
    if args.resume:
        output_dir = args.output_dir
        check_resume_changes(load_saved_config(PPOConfig, output_dir), config, PPO_RESUME_SAFE_KEYS)
    else:
        output_dir = resolve_output_dir(args, config.env)
        refuse_existing_run(output_dir)

    import jax

    from jaxrl_hier.algorithms.ppo import make_train
    from jaxrl_hier.logging import plot_learning_curve, read_jsonl

    trainer = make_train(config)
    sync_processes("jaxrl_hier.train:checked")  # every process has looked at the directory before any writes
    primary = is_primary()
    t0 = time.perf_counter()
    runner = trainer.init(jax.random.PRNGKey(config.seed))
    total = config.num_updates
    steps_per_update = config.steps_per_update
    with ResumableRun(output_dir / "checkpoints", checkpoint_meta(trainer), keep=config.keep_checkpoints,
                      every=config.checkpoint_every, total=total, resume=args.resume, primary=primary) as run:
        runner, start = run.restore(runner)
        if start:
            log(f"resumed {output_dir} at update {start}")
        elif args.resume:
            log(f"no checkpoint in {output_dir}/checkpoints yet: starting from scratch")
        # Every check passed (the checkpoint is restored): only now the run directory's files change.
        save_run_config(output_dir / "config.yaml", "ppo", config)
        writer = run.log(output_dir, tensorboard=config.tensorboard, wandb=config.wandb,
                         wandb_project=config.wandb_project, config=to_dict(config))
        progress = progress_bar(args, total * steps_per_update, start * steps_per_update, config.env)
        update = start
        compile_s = None
        try:
            while update < total:
                n = min(config.log_every, total - update)
                runner, rec, elapsed = train_chunk(trainer, runner, n)
                if compile_s is None:
                    compile_s = elapsed
                update += n
                rec.update(update=update, env_steps=update * steps_per_update, fps=n * steps_per_update / elapsed,
                           time_s=time.perf_counter() - t0)
                writer.write(rec)
                if progress is not None:
                    progress.update(n * steps_per_update)
                    ret = rec.get("episode_return")
                    progress.set_postfix(fps=f"{rec['fps']:.0f}",
                                         ret="n/a" if ret is None or math.isnan(ret) else f"{ret:.2f}")
                run.save_if_due(update, runner)
        finally:
            if progress is not None:
                progress.close()

    if not primary:
        return 0
    records = read_jsonl(output_dir / "metrics.jsonl")
    plot_learning_curve(records, output_dir / "learning_curve.png", title=config.env)
    if config.eval_gif and trainer.env.name.startswith("Craftax"):
        from jaxrl_hier.logging.episode_gif import write_episode_gif

        write_episode_gif(trainer, runner, output_dir / "episode.gif", max_steps=config.eval_max_steps)
    first = next((r["episode_return"] for r in records if r.get("episode_return") is not None), None)
    last = next((r["episode_return"] for r in reversed(records) if r.get("episode_return") is not None), None)
    log(f"done: {update} updates, {update * steps_per_update} env steps in {time.perf_counter() - t0:.1f}s "
        f"(first compile {compile_s or 0:.1f}s); episode return {first} -> {last}; outputs in {output_dir}")
    return 0


def train_chunk(trainer, runner, n: int) -> tuple[Any, dict, float]:
    """`n` PPO updates in one compiled call: (runner, one record for the chunk, seconds it took)."""
    import jax

    from jaxrl_hier.algorithms.ppo import metrics_to_records

    tick = time.perf_counter()
    runner, metrics = trainer.update(runner, n)
    metrics = jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - tick
    return runner, _merge_chunk(metrics_to_records(metrics, trainer.achievement_names)), elapsed


def _merge_chunk(all_records: list[dict]) -> dict:
    """One record per chunk: losses of the last update, episode statistics over the whole chunk
    (episodes are sparse per update, so averaging over the chunk is the less noisy figure)."""
    episodes = [r.get("episodes") or 0.0 for r in all_records]
    total = sum(episodes)
    out = dict(all_records[-1])
    for key in out:
        if key == "episode_return" or key == "episode_length" or key.startswith("achievement/"):
            vals = [(r[key], w) for r, w in zip(all_records, episodes) if w and not math.isnan(r[key])]
            out[key] = sum(v * w for v, w in vals) / total if total else math.nan
    out["episodes"] = total
    return out


# ----------------------------------------------------------------------------- entry point


def run(args: argparse.Namespace) -> int:
    """Read the config, pick the algorithm, and hand over to its trainer."""
    raw, args.config_source = load_raw_config(args)
    name = raw.pop("algorithm", DEFAULT_ALGORITHM)
    function = algorithm_function(name)
    if args.resume and name != saved_algorithm(args.output_dir):
        raise ConfigError(f"cannot change 'algorithm' on --resume: {args.output_dir} is a "
                          f"{saved_algorithm(args.output_dir)} run, not {name}.")
    return function(args, raw)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if args.distributed:
            init_distributed()
        return run(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: resume with --resume --output-dir <dir>", file=sys.stderr)
        return 130
    except Exception as err:  # a checkpoint that cannot be restored is bad input too
        from jaxrl_hier.checkpointing import CheckpointError  # imported late: Orbax is slow to import

        if not isinstance(err, CheckpointError):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
