"""`python -m jaxrl_hier.train --config configs/ppo_cartpole.yaml`: PPO through the CLI.

The `ppo` entry of `jaxrl_hier.train.ALGORITHMS` (the default algorithm). Python only orchestrates
here: it validates the config (exit code 2 on bad input, before anything compiles and before any
file of the run directory is written), then loops over compiled chunks of `log_every` updates
(`ppo.train_chunk`), writing metrics.jsonl, a progress bar, and Orbax checkpoints between them. A
run directory holds:

    config.yaml            the config, `algorithm: ppo` first
    metrics.jsonl          one record per log_every updates: losses, episode return and length,
                           achievement rates (Craftax), env steps, fps
    checkpoints/           Orbax checkpoints of the runner state (--resume continues exactly)
    learning_curve.png     episode return and length against env steps
    episode.gif            Craftax only (eval_gif): one evaluation episode
    tensorboard/           with tensorboard=true
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from typing import Any

from jaxrl_hier.algorithms.ppo import PPOConfig, make_train, train_chunk
from jaxrl_hier.config import ConfigError, config_from_args, to_dict
from jaxrl_hier.runs import (ResumableRun, RunConfigFile, check_resume_changes, is_primary, load_saved_config, log,
                             refuse_existing_run, resolve_output_dir, sync_processes,
                             use_compilation_cache)

# PPOConfig keys a resume may change: they touch logging, outputs and checkpoint retention only,
# never what is learned. Every other key is refused on resume: total_timesteps, num_minibatches
# and update_epochs change the learning-rate schedule midway, the sizes change array shapes, and
# seed/env_shards/num_devices change the RNG streams or the layout the checkpoint was saved with.
PPO_RESUME_SAFE_KEYS = ("log_every", "checkpoint_every", "keep_checkpoints", "eval_gif", "eval_max_steps",
                        "tensorboard", "wandb", "wandb_project")

# Config keys that fix the shapes inside a checkpoint; a resume must match them.
STRUCTURAL_KEYS = ("env", "num_envs", "num_seeds", "network", "hidden_size", "rnn_hidden_size", "num_layers",
                   "reset_mode", "reset_ratio")


def check_logging_deps(config) -> None:
    """Optional sinks need their packages; say so before anything compiles."""
    for enabled, module, extra in ((config.tensorboard, "tensorboardX", "tensorboard"), (config.wandb, "wandb", "wandb")):
        if enabled and importlib.util.find_spec(module) is None:
            raise ConfigError(f"{extra}=true needs the {module} package: pip install -e '.[{extra}]'")


def checkpoint_meta(trainer) -> dict:
    c = trainer.config
    meta = {k: getattr(c, k) for k in STRUCTURAL_KEYS}
    meta["env_shards"] = trainer.num_shards
    meta["obs_shape"] = list(trainer.env.observation_space(trainer.env_params).shape)
    meta["num_actions"] = int(trainer.env.action_space(trainer.env_params).n)
    return meta


def run_ppo(args: argparse.Namespace, raw_config: dict) -> int:
    """The `ppo` entry of jaxrl_hier.train.ALGORITHMS (contract in that module)."""
    # Everything that can be wrong with the input is checked here, before any compile or write.
    config = config_from_args(PPOConfig, raw_config, args)
    check_logging_deps(config)
    if args.resume:
        output_dir = args.output_dir
        check_resume_changes(load_saved_config(PPOConfig, output_dir), config, PPO_RESUME_SAFE_KEYS)
    else:
        output_dir = resolve_output_dir(args, config.env)
        refuse_existing_run(output_dir)

    import jax

    use_compilation_cache(output_dir)  # a resume loads the compiled programs (runs.compile_cache)

    from jaxrl_hier.logging import plot_learning_curve, read_jsonl

    trainer = make_train(config)
    sync_processes("jaxrl_hier.ppo:checked")  # every process has looked at the directory before any writes
    primary = is_primary()
    t0 = time.perf_counter()
    runner = trainer.init(jax.random.PRNGKey(config.seed))
    total = config.num_updates
    steps_per_update = config.steps_per_update
    # Every check passed: the run directory's files change only once the checkpoint is restored.
    config_file = RunConfigFile(output_dir, "ppo", config, resume=args.resume)
    with ResumableRun(output_dir / "checkpoints", checkpoint_meta(trainer), keep=config.keep_checkpoints,
                      every=config.checkpoint_every, total=total, resume=args.resume, primary=primary,
                      config_file=config_file) as run:
        runner, start = run.restore(runner)
        if start:
            log(f"resumed {output_dir} at update {start}")
        elif args.resume:
            log(f"no checkpoint in {output_dir}/checkpoints yet: starting from scratch")
        writer = run.log(output_dir, tensorboard=config.tensorboard, wandb=config.wandb,
                         wandb_project=config.wandb_project, config=to_dict(config))
        chunk_s: list[float] = []  # the first chunk's time includes its compile

        def step(runner: Any, done: int) -> tuple[Any, int, dict]:
            n = min(config.log_every, total - done)
            runner, rec, elapsed = train_chunk(trainer, runner, n)
            chunk_s.append(elapsed)
            update = done + n
            rec.update(update=update, env_steps=update * steps_per_update, fps=n * steps_per_update / elapsed,
                       time_s=time.perf_counter() - t0)
            writer.write(rec)
            ret = rec.get("episode_return")
            return runner, n, dict(fps=f"{rec['fps']:.0f}",
                                   ret="n/a" if ret is None or math.isnan(ret) else f"{ret:.2f}")

        runner, update = run.run_steps(args, runner, total=total, desc=config.env, step=step, unit=steps_per_update)

    if not primary:
        return 0
    records = read_jsonl(output_dir / "metrics.jsonl")
    plot_learning_curve(records, output_dir / "learning_curve.png", title=config.env)
    if config.eval_gif and trainer.env.name.startswith("Craftax"):
        from jaxrl_hier.logging.episode_gif import write_episode_gif

        write_episode_gif(trainer, runner, output_dir / "episode.gif", max_steps=config.eval_max_steps)
    first = next((r["episode_return"] for r in records if r.get("episode_return") is not None), None)
    last = next((r["episode_return"] for r in reversed(records) if r.get("episode_return") is not None), None)
    compile_s = chunk_s[0] if chunk_s else 0.0
    log(f"done: {update} updates, {update * steps_per_update} env steps in {time.perf_counter() - t0:.1f}s "
        f"(first compile {compile_s:.1f}s); episode return {first} -> {last}; outputs in {output_dir}")
    return 0


__all__ = ["run_ppo", "checkpoint_meta", "PPO_RESUME_SAFE_KEYS", "STRUCTURAL_KEYS"]
