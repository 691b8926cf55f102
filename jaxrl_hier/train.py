"""The train CLI: `python -m jaxrl_hier.train [--config PATH] [--output-dir DIR] [--resume] [key=value ...]`.

Argument parsing and dispatch only. The config (--config, the default PPO config, or on --resume
the run directory's config.yaml) with the key=value overrides applied picks its trainer by its
`algorithm` key (default `ppo`) from `ALGORITHMS`; each trainer lives in its family's CLI module
(`algorithms/ppo_cli.py`, `llm_rl/cli.py`, `llm_rl/guided_cli.py`, `search/cli.py`) and uses the
run-directory services of `jaxrl_hier.runs`. `main` turns ConfigError and CheckpointError into
`error: ...` and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from jaxrl_hier.config import ConfigError, closest, parse_overrides, read_yaml, resolve_config
from jaxrl_hier.runs import init_distributed

DEFAULT_CONFIG = "ppo_default"  # a packaged config (jaxrl_hier/configs/ppo_default.yaml), found by resolve_config
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
#   config.yaml is written through `RunConfigFile` (process 0 only): a fresh run's once every check
#   has passed, a resumed run's only once its checkpoint is restored.
ALGORITHMS: dict[str, str] = {"ppo": "jaxrl_hier.algorithms.ppo_cli:run_ppo", "grpo": "jaxrl_hier.llm_rl.cli:run_grpo",
                              "sft": "jaxrl_hier.llm_rl.cli:run_sft", "guided": "jaxrl_hier.llm_rl.guided_cli:run_guided",
                              "pgts": "jaxrl_hier.search.cli:run_pgts"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jaxrl_hier.train",
        description="Train an RL algorithm (the config's `algorithm` key, default ppo) compiled on the device.",
        epilog="Overrides are key=value pairs, e.g. env=gymnax:CartPole-v1 num_envs=64 total_timesteps=100000.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="a YAML file, or the name of a packaged config (ppo_cartpole, grpo_arithmetic, ...); "
                             "default: ppo_default, a small Craftax-Classic run")
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
        path = resolve_config(args.config) if args.config is not None else saved
    else:
        path = resolve_config(args.config if args.config is not None else DEFAULT_CONFIG)
    raw = read_yaml(path)
    overrides = parse_overrides(args.overrides)
    raw.update(overrides)
    args.override_keys = set(overrides)  # so a message about one of them names the command line (config_from_args)
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
