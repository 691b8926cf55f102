"""Branch a skills run: a new run directory with another run's skills and chain, its manager stage
(and, unless kept, its generalist stage) dropped, and new manager settings, so that `resume` trains
the dropped stages again over the same skills.

    python -m jaxrl_hier.skills branch SRC DST [--keep-generalist] [manager.KEY=VALUE ...]
    python -m jaxrl_hier.skills resume DST

A study of the manager (a teacher or none, its budget, its options) compares settings over the same
skills this way; training the skills again would change them too. With the same settings the
branch's stages give the source's numbers exactly: the seeds, the skills' experts and the saved
generalist are the same.

The copy is taken under the source's lock (a running source is refused, as a second `resume` of it
would be) and appears whole or not at all (`io.atomic_directory`). What is dropped: the stages'
directories and records, the final agent's report (RUN/eval), the lock and the previous state file.
The composed agent's reports and the compilation cache stay: they hold for the same skills.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Sequence

from jaxrl_hier.config import ConfigError, closest, parse_overrides, save_config
from jaxrl_hier.io import atomic_directory
from jaxrl_hier.skills.composed import EVAL_DIR
from jaxrl_hier.skills.config import CONFIG_FILE, ManagerConfig, SkillsConfig, saved_config
from jaxrl_hier.skills.manager import GENERALIST_DIR, MANAGER_DIR
from jaxrl_hier.skills.state import LOCK_FILE, MUTEX_FILE, PREV_FILE, RunLock, load_state, save_state

# Keys outside the manager section a branch may set: none changes the skills.
RUN_KEYS = ("eval_episodes", "eval_gif_steps", "greedy_eval_every", "max_wall_s", "stale_lock_s", "stuck_after_s")
# With the generalist kept, the manager stage's own keys: the others shape the generalist's network
# (its options, inputs, base actions) or its training, which the branch does not repeat.
MANAGER_STAGE_KEYS = ("timesteps", "option_steps", "lr", "update_epochs", "ent_coef", "dispatch", "greedy_experts",
                      "anneal_lr", "skill_prior", "restart_prob", "restart_from", "tune_experts", "expert_kl")


def branch_config(src: Path, overrides: Sequence[str], keep_generalist: bool = False) -> SkillsConfig:
    """The branch's config: SRC's config.yaml with `overrides` (manager keys and RUN_KEYS) applied and
    validated. Refused, before anything is written, for a key a branch may not change, or a kept
    generalist that SRC has not finished."""
    saved_config(src)  # a directory without config.yaml is refused with what it should hold
    state = load_state(src)  # missing or corrupt: refused with its recovery hint
    every_manager_key = tuple(f.name for f in dataclasses.fields(ManagerConfig))
    manager_keys = MANAGER_STAGE_KEYS if keep_generalist else every_manager_key
    allowed = (*RUN_KEYS, *(f"manager.{k}" for k in manager_keys))
    fields = {f.name for f in dataclasses.fields(SkillsConfig)} | {f"manager.{k}" for k in every_manager_key}
    for key in parse_overrides(list(overrides)):
        if key in allowed:
            continue
        if key not in fields and not key.startswith("ppo."):
            why = f"unknown config key '{key}'.{closest(key, allowed)}"
        elif keep_generalist and key.startswith("manager."):
            why = (f"'{key}' cannot be changed by a branch that keeps the generalist: only the manager "
                   "stage's own keys may change; drop --keep-generalist to train the generalist again too.")
        else:
            why = (f"'{key}' cannot be changed by a branch: it keeps the skills, so their settings stay; for "
                   "other changes start a new run with `run --output-dir NEW_DIR`.")
        raise ConfigError(f"{why} A branch accepts: {', '.join(allowed)}.")
    if keep_generalist and state.generalist.get("status") != "done":
        raise ConfigError(f"--keep-generalist: {src} has no finished generalist stage "
                          f"({state.generalist.get('status') or 'none'}); drop the flag to train one in the branch.")
    return saved_config(src, list(overrides))


def branch_run(src: Path, dst: Path, config: SkillsConfig, keep_generalist: bool = False) -> None:
    """Copy SRC to DST without the stages to train again, with `config` (from `branch_config`) as
    DST's config.yaml. DST must not exist or be empty."""
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConfigError(f"{dst} already exists and is not empty; choose a new directory for the branch.")
    dropped = {MANAGER_DIR, EVAL_DIR, LOCK_FILE, MUTEX_FILE, PREV_FILE} | (set() if keep_generalist else {GENERALIST_DIR})
    lock = RunLock(src, stale_after_s=config.stale_lock_s)
    lock.acquire()  # a live run of SRC is refused; the copy sees no half-finished transition
    try:
        with atomic_directory(dst) as tmp:
            shutil.copytree(src, tmp, dirs_exist_ok=True,
                            ignore=lambda where, names: [n for n in names if Path(where) == src and n in dropped])
            state = load_state(tmp)
            state.manager = {}
            if not keep_generalist:
                state.generalist = {}
            save_state(tmp, state)
            save_config(config, tmp / CONFIG_FILE)
    finally:
        lock.release()
