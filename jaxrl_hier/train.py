"""The train CLI: `python -m jaxrl_hier.train [--config PATH] [--output-dir DIR] [--resume] [key=value ...]`.

Python only orchestrates here: it validates the config (exit code 2 on bad input, before anything
compiles), then loops over compiled chunks of `log_every` PPO updates, writing metrics.jsonl,
a progress bar, and Orbax checkpoints between them. At the end it plots the learning curve and,
for Craftax, renders one evaluation episode to a GIF.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from jaxrl_hier.config import ConfigError, load_config, save_config, to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "ppo_default.yaml"

# Config keys that fix the shapes inside a checkpoint; a resume must match them.
STRUCTURAL_KEYS = ("env", "num_envs", "num_seeds", "network", "hidden_size", "num_layers", "reset_mode",
                   "reset_ratio")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jaxrl_hier.train",
        description="Train PPO with rollout, GAE and updates compiled on the device.",
        epilog="Overrides are key=value pairs, e.g. env=gymnax:CartPole-v1 num_envs=64 total_timesteps=100000.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config (default: the built-in small Craftax-Classic run)")
    parser.add_argument("--output-dir", type=Path, default=None, help="run directory (default: runs/<env>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    parser.add_argument("--distributed", action="store_true",
                        help="call jax.distributed.initialize() first (multi-host; see README)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    return parser.parse_intermixed_args(argv)  # overrides may come before or after the flags


def resolve_config(args: argparse.Namespace):
    """The run's config and output directory, or ConfigError."""
    from jaxrl_hier.algorithms.ppo import PPOConfig

    if args.resume:
        if args.output_dir is None:
            raise ConfigError("--resume needs --output-dir: the run directory to continue.")
        saved = args.output_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"cannot resume: {saved} not found. Is {args.output_dir} a jaxrl_hier run directory?")
        config = load_config(PPOConfig, args.config or saved, args.overrides)
        check_logging_deps(config)
        return config, args.output_dir
    path = args.config if args.config is not None else DEFAULT_CONFIG
    config = load_config(PPOConfig, path, args.overrides)
    check_logging_deps(config)
    output_dir = args.output_dir or Path("runs") / f"{config.env.replace(':', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    ckpt = output_dir / "checkpoints"
    if ckpt.is_dir() and any(ckpt.iterdir()):
        raise ConfigError(f"{output_dir} already holds checkpoints: pass --resume to continue it, "
                          "or choose another --output-dir.")
    return config, output_dir


def check_logging_deps(config) -> None:
    """Optional sinks need their packages; say so before anything compiles."""
    import importlib.util

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


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong with the input is checked here, before any compile.
    config, output_dir = resolve_config(args)
    import jax

    from jaxrl_hier.algorithms.ppo import make_train, metrics_to_records
    from jaxrl_hier.checkpointing import Checkpointer
    from jaxrl_hier.logging import MetricsWriter, plot_learning_curve, read_jsonl

    trainer = make_train(config)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, output_dir / "config.yaml")
    ckpt = Checkpointer(output_dir / "checkpoints", keep=config.keep_checkpoints)
    writer = MetricsWriter(output_dir, tensorboard=config.tensorboard, wandb=config.wandb,
                           wandb_project=config.wandb_project, config=to_dict(config))
    meta = checkpoint_meta(trainer)

    t0 = time.perf_counter()
    runner = trainer.init(jax.random.PRNGKey(config.seed))
    start = 0
    if args.resume and ckpt.latest_step() is not None:
        start = ckpt.latest_step()
        runner, _ = ckpt.restore(start, runner, expect=meta)
        writer.truncate_after(start)
        print(f"resumed {output_dir} at update {start}", file=sys.stderr)
    elif args.resume:
        print(f"no checkpoint in {output_dir}/checkpoints yet: starting from scratch", file=sys.stderr)
        writer.truncate_after(0)

    total = config.num_updates
    steps_per_update = config.steps_per_update
    progress = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=total * steps_per_update, initial=start * steps_per_update, unit="step",
                        unit_scale=True, dynamic_ncols=True, desc=config.env)
    update = start
    compile_s = None
    try:
        while update < total:
            n = min(config.log_every, total - update)
            tick = time.perf_counter()
            runner, metrics = trainer.update(runner, n)
            metrics = jax.block_until_ready(metrics)
            elapsed = time.perf_counter() - tick
            if compile_s is None:
                compile_s = elapsed
            update += n
            rec = _merge_chunk(metrics_to_records(metrics, trainer.achievement_names))
            rec.update(update=update, env_steps=update * steps_per_update, fps=n * steps_per_update / elapsed,
                       time_s=time.perf_counter() - t0)
            writer.write(rec)
            if progress is not None:
                progress.update(n * steps_per_update)
                ret = rec.get("episode_return")
                progress.set_postfix(fps=f"{rec['fps']:.0f}",
                                     ret="n/a" if ret is None or math.isnan(ret) else f"{ret:.2f}")
            if update == total or (config.checkpoint_every and update % config.checkpoint_every == 0):
                ckpt.save(update, runner, meta)
    finally:
        if progress is not None:
            progress.close()
        ckpt.close()
        writer.close()

    records = read_jsonl(output_dir / "metrics.jsonl")
    plot_learning_curve(records, output_dir / "learning_curve.png", title=config.env)
    if config.eval_gif and trainer.env.name.startswith("Craftax"):
        from jaxrl_hier.logging.episode_gif import write_episode_gif

        write_episode_gif(trainer, runner, output_dir / "episode.gif", max_steps=config.eval_max_steps)
    first = next((r["episode_return"] for r in records if r.get("episode_return") is not None), None)
    last = next((r["episode_return"] for r in reversed(records) if r.get("episode_return") is not None), None)
    print(f"done: {update} updates, {update * steps_per_update} env steps in {time.perf_counter() - t0:.1f}s "
          f"(first compile {compile_s or 0:.1f}s); episode return {first} -> {last}; outputs in {output_dir}",
          file=sys.stderr)
    return 0


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.distributed:
        import jax

        jax.distributed.initialize()
    try:
        return run(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a checkpoint that cannot be restored is bad input too
        from jaxrl_hier.checkpointing import CheckpointError

        if not isinstance(err, CheckpointError):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: resume with --resume --output-dir <dir>", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
