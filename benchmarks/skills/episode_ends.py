"""What ends a Craftax skills run's episodes: the needs that run out, and when health runs low.

    python benchmarks/skills/episode_ends.py RUN [--seed 1000] [--episodes 64] [--out DIR] [--no-manager]

Plays the run's final agent (its learned manager when it has one, else the composed agent) from
the fresh worlds of `skills eval --seed`, greedy and sampled, the same episodes, while watching state conditions instead
of skills: food, drink and energy at 0 and at 3 or less, and health at 3 or less. For each it
reports the share of episodes where it held at some step and the mean step at which it first did.
On Craftax a need at 0 drains health; an episode that ends with none of them ever at 0 ended by
damage (zombies, skeletons, arrows, lava). On Craftax-Classic, whose light level is a function of
the time step alone (its `calculate_light_level`: dark, under 0.5, from step 148 to 272 of each
300-step day, when zombies spawn up to six times as often), it also gives, over the episodes that
ended before the step limit, the share whose last step fell in the dark and the share that ended
on each day (1, 2, 3 or later).
Writes OUT/episode_ends.json (default RUN/eval/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.config import load_config
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composed import episode_limit, final_agent, load_run
from jaxrl_hier.skills.composition import play_both_modes
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.spec import Condition, Skill

# (name, quantity, op, value): conditions watched instead of skills
PROBES = (("food at 0", "food", "<=", 0.0), ("drink at 0", "drink", "<=", 0.0), ("energy at 0", "energy", "<=", 0.0),
          ("food <= 3", "food", "<=", 3.0), ("drink <= 3", "drink", "<=", 3.0), ("energy <= 3", "energy", "<=", 3.0),
          ("health <= 3", "health", "<=", 3.0))


def summarise(stats, names, light: Callable[[np.ndarray], np.ndarray] | None = None, limit: int = 0,
              day_length: int = 0) -> dict:
    """The figures of one mode; with `light` (time step -> light level), `day_length` and the step
    `limit`, also when the episodes that ended before the limit ended: the share in the dark (light
    under 0.5) and the share on each day."""
    held, first, length = np.asarray(stats.held), np.asarray(stats.first), np.asarray(stats.length)
    need_out = held[:, :3].any(axis=1)  # some need reached 0
    ended = length[length < limit]
    dark = {}
    if light is not None and ended.size:
        day = ended // day_length + 1
        dark = {"ended_in_the_dark": float((np.asarray(light(ended)) < 0.5).mean()),
                "ended_on_day": {"1": float((day == 1).mean()), "2": float((day == 2).mean()),
                                 "3+": float((day >= 3).mean())}}
    return {"mean_length": float(length.mean()), "median_length": float(np.median(length)), **dark,
            "no_need_at_0": float((~need_out).mean()),
            "probes": {n: {"share": float(held[:, i].mean()),
                           "mean_first_step": float(first[held[:, i], i].mean()) if held[:, i].any() else None}
                       for i, n in enumerate(names)}}


def classic_light(params) -> Callable[[np.ndarray], np.ndarray]:
    """Time step -> Craftax-Classic's light level under `params` (its day length)."""
    from craftax.craftax_classic.game_logic import calculate_light_level

    return lambda t: np.asarray(calculate_light_level(np.asarray(t, np.float32), params))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--seed", type=int, default=1000, help="the worlds' seed (1000: the validation worlds)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-manager", action="store_true", help="the composed agent even where a manager exists")
    args = parser.parse_args(argv)
    config = load_config(SkillsConfig, args.run / "config.yaml", [])
    catalog = check_config(config)
    run = load_run(args.run, config, catalog, False, True)
    probes = [Skill(f"probe{i}", (), (Condition(q, op, v),)) for i, (_, q, op, v) in enumerate(PROBES)]
    watch = jax.tree.map(jnp.asarray, run.env.conditions(probes))
    final = final_agent(args.run, config, run, use_manager=not args.no_manager)
    agent, played = final.agent, final.played.replace(watch=watch)
    result = {"run": str(args.run), "agent": final.kind, "seed": args.seed, "episodes": args.episodes}
    limit = episode_limit(run.base_params)
    light = classic_light(run.base_params) if config.env.startswith("Craftax-Classic") else None
    result.update(play_both_modes(  # the worlds of `skills eval --seed`
        lambda k, greedy: summarise(agent.evaluate(played, k, args.episodes, limit, greedy),
                                    [p[0] for p in PROBES], light, limit, getattr(run.base_params, "day_length", 0)),
        jax.random.key(args.seed)))
    out = args.out or args.run / "eval"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "episode_ends.json", result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
