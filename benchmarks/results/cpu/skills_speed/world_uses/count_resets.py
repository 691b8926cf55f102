"""How often the reset pool refills and how often it takes its full-reset branch, in collect_wood's
first three training rounds from a fresh expert (the shipped Classic config, overrides from the
command line). Run from the repository root:

    python benchmarks/results/cpu/skills_speed/world_uses/count_resets.py [skill_world_uses=4]

Debug callbacks count the vec env's world generations (all `num_envs` worlds: the full-reset branch;
fewer: a pool refill) and the envs that finish on each step. The callbacks run only where their
branch runs, so the counts are the branches' real runs.
"""

import sys

import jax

import jaxrl_hier  # noqa: F401  (sets XLA flags before JAX starts)
from jaxrl_hier.config import load_config, resolve_config
from jaxrl_hier.envs import vec as vec_module
from jaxrl_hier.skills.cli import check_config
from jaxrl_hier.skills.config import SkillsConfig
from jaxrl_hier.skills.trainer import SkillTrainer

sys.path.insert(0, "benchmarks/skills")
from skills_speed import random_experts  # noqa: E402

counts: dict[str, int] = {}
generate, apply_resets = vec_module.VecEnv._reset_many, vec_module.VecEnv._apply_resets


def counted_generate(self, key, n):
    kind = "full_reset" if n == self.num_envs else "refill"
    jax.debug.callback(lambda: counts.__setitem__(kind, counts.get(kind, 0) + 1))
    return generate(self, key, n)


def counted_apply_resets(self, key, vstate, obs, done):
    def record(finished):
        counts["finished"] = counts.get("finished", 0) + int(finished)
        counts["most_in_one_step"] = max(counts.get("most_in_one_step", 0), int(finished))
    jax.debug.callback(record, done.sum())
    return apply_resets(self, key, vstate, obs, done)


vec_module.VecEnv._reset_many = counted_generate
vec_module.VecEnv._apply_resets = counted_apply_resets

config = load_config(SkillsConfig, resolve_config("configs/skills_craftax_classic.yaml"), sys.argv[1:])
library = check_config(config)
trainer = SkillTrainer(config, library)
trainer.init(jax.random.key(0))
trainer.start({0: "collect_wood"}, library, random_experts(trainer, set(), jax.random.key(0)), jax.random.key(1))
for r in range(3):
    counts.clear()
    trainer.train_round(greedy_eval=False)
    jax.effects_barrier()
    print(f"round {r}: {counts}", flush=True)
