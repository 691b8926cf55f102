"""What an option is worth to a run's learned manager: its agent played with that option forced
wherever a condition holds, beside the same agent as trained, from the same fresh worlds.

    python benchmarks/skills/forced_option.py RUN --option quench --when "drink <= 4" [--seed 1000]
        [--episodes 64] [--out DIR]

At each decision (no option running) where `--when` holds (conditions over the run's quantities, as
a skill's success is written: `"drink <= 4"`, several joined by `,`) and the option may start, the
manager's choice is replaced by `--option`, which then runs as it would had the manager chosen it
(to its skill's conditions or `option_steps`). Elsewhere the manager chooses as trained. A manager
that never calls an option leaves open whether the option is useless or the manager never learnt
its worth; an agent that scores more with the option forced says the second. Writes
OUT/forced_option.json (default RUN/eval/): score, achievements, mean length and the share of steps
each skill's expert acted, greedy and sampled, for the agent as trained and with the option forced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import jaxrl_hier  # noqa: E402,F401  (sets XLA flags before JAX starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxrl_hier.config import ConfigError, load_config  # noqa: E402
from jaxrl_hier.io import atomic_write_json  # noqa: E402
from jaxrl_hier.skills.cli import check_config  # noqa: E402
from jaxrl_hier.skills.composed import episode_limit, load_run, summarize  # noqa: E402
from jaxrl_hier.skills.composition import play_both_modes  # noqa: E402
from jaxrl_hier.skills.config import SkillsConfig  # noqa: E402
from jaxrl_hier.skills.env import Conditions, conditions_hold  # noqa: E402
from jaxrl_hier.skills.manager import ManagedAgent, ManagerTrainer, load_manager  # noqa: E402
from jaxrl_hier.skills.spec import Condition, Skill, SkillError  # noqa: E402


class ForcedAgent(ManagedAgent):
    """A `ManagedAgent` whose manager takes option `option` at every decision where `when` holds and
    the option may start: the action mask there holds that option alone (the network's inputs, which
    read the open choices, are unchanged)."""

    def __init__(self, trainer: ManagerTrainer, option: int, when: Conditions):
        self.option, self.when = option, jax.tree.map(jnp.asarray, when)
        super().__init__(trainer)

    def forced_obs(self, obs: dict, state) -> dict:
        q = jax.vmap(self.skill_env.quantities)(state.base)
        when = jax.vmap(conditions_hold, in_axes=(0, None))(q, self.when)
        force = when & ~obs["running"] & obs["action_mask"][:, self.option]
        only = jnp.arange(obs["action_mask"].shape[1]) == self.option
        return {**obs, "action_mask": jnp.where(force[:, None], only, obs["action_mask"])}

    def act(self, managed, obs, state, key, greedy):
        return super().act(managed, self.forced_obs(obs, state), state, key, greedy)


def parse_when(text: str) -> tuple[Condition, ...]:
    """"drink <= 4, food <= 4" -> its conditions (a skill's success syntax)."""
    return tuple(Condition.parse(part.strip()) for part in text.split(",") if part.strip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--option", required=True, help="one of the manager's skills")
    parser.add_argument("--when", required=True, help='conditions, e.g. "drink <= 4" (several joined by ",")')
    parser.add_argument("--seed", type=int, default=1000, help="the worlds' seed (1000: the validation worlds)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_config(SkillsConfig, args.run / "config.yaml", [])
    catalog = check_config(config)
    run = load_run(args.run, config, catalog)
    skills = list(run.manager.get("skills", [])) if run.manager.get("status") == "done" else []
    if args.option not in skills:
        print(f"error: '{args.option}' is not an option of {args.run}'s finished manager "
              f"(its options: {', '.join(skills) or 'none'}).", file=sys.stderr)
        return 2
    try:
        when = run.env.conditions([Skill("when", (), parse_when(args.when))])
    except (ConfigError, SkillError, ValueError) as err:
        print(f"error: --when '{args.when}': {err}", file=sys.stderr)
        return 2
    trainer = ManagerTrainer(config, run.env, run.base_params, run.library, run.experts, skills)
    params = load_manager(args.run, trainer.params_like())["manager"]
    watch = run.env.conditions([run.library[s] for s in run.experts])
    base = run.env.base
    names, rewards = tuple(base.achievement_names), tuple(base.achievement_rewards)
    limit = episode_limit(run.base_params)
    result = {"run": str(args.run), "option": args.option, "when": args.when, "seed": args.seed,
              "episodes": args.episodes}
    forced = ForcedAgent(trainer, skills.index(args.option), jax.tree.map(lambda x: x[0], when))
    for name, agent in (("as_trained", ManagedAgent(trainer)), ("forced", forced)):
        managed = agent.managed(trainer, params, watch)
        result[name] = play_both_modes(lambda k, greedy: summarize(
            agent.evaluate(managed, k, args.episodes, limit, greedy), names, rewards, list(run.experts), agent.labels),
            jax.random.key(args.seed))
    out = args.out or args.run / "eval"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "forced_option.json", result)
    for name in ("as_trained", "forced"):
        for mode in ("greedy", "sampled"):
            r = result[name][mode]
            print(f"{name} {mode}: score {r['score_percent_of_max']:.1f}% of max, length {r['mean_length']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
