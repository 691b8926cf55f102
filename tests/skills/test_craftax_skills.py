"""The Craftax-Classic skills program compiled once at a tiny size: the GPU config
(configs/skills_craftax_classic_gpu.yaml) with its sizes cut down, a skill with a frozen dependency
trained for one round, its restarts switched off for the fresh-world phase, the composition routed
towards it, and a chunk of the learned manager over the two skills, played from fresh worlds.
Craftax compiles slowly on a CPU (15-60 s a program), so one test holds all of it, and it compiles
only the Craftax programs a Classic run needs that TechTree's tests cannot stand in for: the
round's greedy evaluation and the composed agent's play run the same env step under policies
that test_multi_device.py and test_composed.py run on TechTree."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from jaxrl_hier.config import load_config
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.composed import build_composition, summarize
from jaxrl_hier.skills.config import SkillsConfig, skills_config_from_dict
from jaxrl_hier.skills.library import craftax_classic_library
from jaxrl_hier.skills.manager import ManagedAgent, ManagerTrainer
from jaxrl_hier.skills.trainer import SkillTrainer

ROOT = Path(__file__).resolve().parents[2]
TINY = {"max_parallel_skills": 1, "max_experts": 2, "updates_per_round": 1, "min_episodes": 1, "eval_episodes": 2}
TINY_PPO = {"num_envs": 4, "num_steps": 4, "num_minibatches": 1, "update_epochs": 1, "hidden_size": 16, "num_layers": 1}


@pytest.mark.slow  # five Craftax programs: the round, two inits, the manager's chunk, its play
def test_craftax_classic_skill_round_and_managed_agent_at_a_tiny_size():
    values = yaml.safe_load((ROOT / "configs" / "skills_craftax_classic_gpu.yaml").read_text())
    config = skills_config_from_dict({**values, **TINY, "ppo": {**values["ppo"], **TINY_PPO}})
    assert config.ppo["num_envs"] == 4 and config.restart_prob > 0
    library = craftax_classic_library()
    trainer = SkillTrainer(config, library)
    trainer.init(jax.random.key(0))
    wood = trainer.policy.init_expert(jax.random.key(1), trainer._obs_dim)
    trainer.start({0: "place_table"}, library, {"collect_wood": wood}, jax.random.key(2))
    assert trainer.restart_prob(0) == config.restart_prob
    (result,) = trainer.train_round(greedy_eval=False)
    assert result.steps == 4 * 4 and np.isfinite(result.episode_return or 0.0)
    trainer.set_restart_prob(0, 0.0)  # the fresh-world phase: the same program, no recompile
    assert trainer.restart_prob(0) == 0.0
    trainer.train_round(greedy_eval=False)

    experts = {"collect_wood": wood, "place_table": trainer.expert(0)}
    comp, plan = build_composition(trainer.env, library, experts, "place_table")
    assert plan == ["collect_wood", "place_table"]
    base = trainer.env.base

    # The learned manager over these two skills, the GPU config's manager section at the tiny size:
    # one chunk of PPO on Craftax's own reward, then the managed agent from fresh worlds.
    assert "collect_wood" in config.manager.skills and config.manager.timesteps > 0
    manager = ManagerTrainer(config, trainer.env, trainer.base_params, library, experts, plan)
    runner, record, _ = manager.train(manager.init(jax.random.key(4)))
    assert np.isfinite(record["loss"])
    managed_agent = ManagedAgent(manager)
    managed = managed_agent.managed(manager, manager.result(runner)["manager"], comp.watch)
    stats = managed_agent.evaluate(managed, jax.random.key(5), 2, 8, greedy=False)
    assert stats.achievements.shape == (2, len(base.achievement_names)) and (stats.length == 8).all()
    report = summarize(stats, base.achievement_names, base.achievement_rewards, list(experts))
    assert report["max_return"] == 22.0 and set(report["skills"]) == {"collect_wood", "place_table"}


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("skills_*.yaml")))
def test_every_shipped_skills_config_passes_the_checks_a_run_makes_before_compiling(name):
    # What `skills run --config` checks first: the keys, the env, the library's quantities against
    # that env's state, and a target the planner can reach (with the chain it would propose).
    config = load_config(SkillsConfig, ROOT / "configs" / name, [])
    catalog = check_config(config)
    targets = catalog.names if config.target == "all" else (config.target,)
    assert all(t in catalog for t in targets) and catalog.closure(targets[-1])[0] == "collect_wood"
