"""What every PPO stage after the skills shares (chain fine-tuning, `skills.chain`; the learned
manager, `skills.manager`): one PPO program over the stage's env and policy, which the scheduler
trains in chunks of `updates_per_round` updates (`Scheduler._run_stage`)."""

from __future__ import annotations

from typing import Any

import jax


class PPOStage:
    """A stage's PPO program: `init(key)` gives its runner, `train(runner)` one chunk."""

    def __init__(self, config: Any, ppo_config: Any, env: Any, env_params: Any, policy: Any):
        from jaxrl_hier.algorithms.ppo import make_train

        self.config, self.env, self.params, self.policy = config, env, env_params, policy
        self.ppo = make_train(ppo_config, env=env, env_params=env_params, network=policy)
        self.steps_per_chunk = config.updates_per_round * config.steps_per_update

    def init(self, key: jax.Array) -> Any:
        return self.ppo.init(key)

    def train(self, runner: Any) -> tuple[Any, dict, float]:
        """One chunk of `updates_per_round` updates: (runner, metrics record, seconds)."""
        from jaxrl_hier.algorithms.ppo import train_chunk

        return train_chunk(self.ppo, runner, self.config.updates_per_round)
