"""Where the TechTree composed agent's chain breaks, from a finished run (the diagnosis in docs/skills.md).

Plays the run's composed agent (sampled) from N fresh worlds for 300 steps, then, for every
episode, finds the first achievement of the tech tree it never unlocked and looks at the episode's
end: tables on the map, how many cells the player visited in its last 100 steps (a stuck agent
visits one or two), which plan position acted, its commonest actions, and whether the tile that
achievement needs (tree, stone, iron, diamond) is reachable over grass from the player, at the end
and after the first step (the map as generated).

    python benchmarks/skills/skills_chain_failures.py RUN [--target make_iron_pickaxe] [--episodes 256]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
import jax
import numpy as np

from jaxrl_hier.config import load_config
from jaxrl_hier.envs import reset_many
from jaxrl_hier.envs.builtin import techtree as tt
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composed import build_composition, choose_target, episode_limit, load_run
from jaxrl_hier.skills.config import SkillsConfig

NEEDS = {"collect_wood": tt.TREE, "collect_stone": tt.STONE, "collect_iron": tt.IRON, "collect_diamond": tt.DIAMOND}


def reachable(grid: np.ndarray, pos: np.ndarray, tile: int) -> bool:
    """A `tile` next to a cell the player can walk to (over grass) from `pos`."""
    seen, todo = {tuple(pos)}, [tuple(pos)]
    while todo:
        y, x = todo.pop()
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            yy, xx = y + dy, x + dx
            if 0 <= yy < grid.shape[0] and 0 <= xx < grid.shape[1]:
                if grid[yy, xx] == tile:
                    return True
                if grid[yy, xx] == tt.GRASS and (yy, xx) not in seen:
                    seen.add((yy, xx))
                    todo.append((yy, xx))
    return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--target", default=None)
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    config = load_config(SkillsConfig, args.run / "config.yaml", [])
    run = load_run(args.run, config, check_config(config), include_running=True)
    if run.env.base.name != "TechTree-v0":
        raise SystemExit("this diagnosis reads TechTree's map; the run is on " + run.env.base.name)
    aim = choose_target(run.library, list(run.experts), args.target or run.target)
    comp, plan = build_composition(run.env, run.library, run.experts, aim)
    base, params, agent, n = run.env.base, run.base_params, run.agent, args.episodes

    def play(key):
        k0, key = jax.random.split(key)
        obs, state = reset_many(base, params, jax.random.split(k0, n))

        def step(carry, _):
            obs, state, key = carry
            key, k_act, k_step = jax.random.split(key, 3)
            action, acting = agent.actions(comp, obs, state, k_act, False)
            obs, state, *_ = jax.vmap(base.step, in_axes=(0, 0, 0, None))(jax.random.split(k_step, n), state,
                                                                          action, params)
            return (obs, state, key), (state.grid, state.pos, state.achievements, acting, action)

        return jax.lax.scan(step, (obs, state, key), None, episode_limit(params))[1]

    grid, pos, ach, acting, action = (np.asarray(x) for x in jax.jit(play)(jax.random.key(args.seed)))
    names = list(tt.ACHIEVEMENTS)
    report = {"run": str(args.run), "target": aim, "plan": plan, "episodes": n,
              "rates": {a: float(ach[-1, :, i].mean()) for i, a in enumerate(names)}, "first_missed": {}}
    by = collections.defaultdict(list)
    for e in range(n):
        missed = next((a for i, a in enumerate(names) if not ach[-1, e, i]), None)
        if missed is not None:
            by[missed].append(e)
    for missed, eps in by.items():
        tile = NEEDS.get(missed)
        row = {"episodes": len(eps),
               "mean_tables_on_map": float(np.mean([(grid[-1, e] == tt.TABLE).sum() for e in eps])),
               "with_2_or_more_tables": int(sum((grid[-1, e] == tt.TABLE).sum() >= 2 for e in eps)),
               "stuck_in_3_cells_or_fewer": int(sum(len({tuple(x) for x in pos[-100:, e]}) <= 3 for e in eps)),
               "acting_plan_position": dict(collections.Counter(int(acting[-1, e]) for e in eps)),
               "commonest_actions_last_100": dict(collections.Counter(
                   tt.ACTIONS[int(a)] for e in eps for a in action[-100:, e]).most_common(4))}
        if tile is not None:
            row["tile_reachable_at_end"] = int(sum(reachable(grid[-1, e], pos[-1, e], tile) for e in eps))
            row["tile_reachable_after_first_step"] = int(sum(reachable(grid[0, e], pos[0, e], tile) for e in eps))
        report["first_missed"][missed] = row
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
