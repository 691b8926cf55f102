"""`PPOConfig`: every setting of a PPO run, validated at load. Apart from `algorithms.ppo` (which
re-exports it) so that a config that nests a `ppo:` section (PGTS) loads without importing JAX."""

from __future__ import annotations

from dataclasses import dataclass

from jaxrl_hier.config import ConfigError


@dataclass(frozen=True)
class PPOConfig:
    """Everything a PPO run needs. Defaults are a small, fast CPU run on Craftax-Classic."""

    env: str = "Craftax-Classic-Symbolic-v1"
    total_timesteps: int = 1_000_000
    num_envs: int = 256
    num_steps: int = 16
    update_epochs: int = 4
    num_minibatches: int = 8
    lr: float = 3e-4
    anneal_lr: bool = True
    # Share of the run's updates at the constant rate before the linear decay to 0 begins
    # (anneal_lr only): 0 decays from the first update, as PureJaxRL does; 0.79 holds the rate for
    # 79% of the run and decays over the rest (a warmup-stable-decay schedule without the warmup).
    anneal_start: float = 0.0
    gamma: float = 0.99
    gae_lambda: float = 0.8
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 1.0
    network: str = "auto"  # "mlp", "cnn", "gru" (recurrent), "gps" (search trees), or "auto" (cnn for images, else mlp)
    hidden_size: int = 512
    rnn_hidden_size: int = 0  # GRU units for network "gru"; 0: hidden_size
    num_layers: int = 3
    activation: str = "tanh"
    # The MLP's matrix products: "float32", or "bfloat16" (operands rounded to bf16, accumulated in
    # float32, parameters and optimiser float32; `jaxrl_hier.networks.precision`). bfloat16 pays on
    # CPUs with AVX-512 BF16 (figures with their machine and learning curves: docs/ppo.md); on CPUs
    # without native bf16 it is slower; on GPUs not yet timed in this form. The names are
    # `networks.precision.MATMUL_DTYPES`, repeated here so that a config loads without JAX.
    matmul_dtype: str = "float32"
    seed: int = 0
    num_seeds: int = 1
    reset_mode: str = "pool"  # see jaxrl_hier.envs.make_vec_env
    reset_ratio: int = 16
    # Episodes each fresh world of the reset pool starts ("pool" only): above 1 for envs whose
    # episodes end within a few steps, where generating worlds is most of a step (see envs/vec.py).
    world_uses: int = 1
    num_devices: int = 0  # 0: every local device
    env_shards: int = 0  # 0: one env group per device
    checkpoint_every: int = 0  # updates between checkpoints; 0: only at the end
    keep_checkpoints: int = 3
    log_every: int = 1  # updates per compiled chunk and per metrics.jsonl record
    eval_gif: bool = True  # Craftax only: a GIF of one evaluation episode at the end
    eval_max_steps: int = 400
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "jaxrl_hier"

    def validate(self) -> None:
        """Check sizes and divisibility; device counts are checked in `resolve_devices`."""
        positive = ["total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                    "num_seeds", "reset_ratio", "world_uses", "log_every", "keep_checkpoints", "hidden_size",
                    "num_layers", "eval_max_steps"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"'{name}' must be positive, got {getattr(self, name)}.")
        for name in ["num_devices", "env_shards", "checkpoint_every", "rnn_hidden_size"]:
            if getattr(self, name) < 0:
                raise ConfigError(f"'{name}' must be >= 0, got {getattr(self, name)}.")
        if not 0.0 < self.lr:
            raise ConfigError(f"'lr' must be positive, got {self.lr}.")
        if not 0.0 <= self.anneal_start < 1.0:
            raise ConfigError(f"'anneal_start' must lie in [0, 1) (the share of the run before the rate decays), "
                              f"got {self.anneal_start}.")
        if self.anneal_start and not self.anneal_lr:
            raise ConfigError(f"'anneal_start' ({self.anneal_start}) needs 'anneal_lr: true': with a constant "
                              "rate there is no decay to start. Set anneal_lr or remove anneal_start.")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ConfigError("'gamma' and 'gae_lambda' must lie in [0, 1].")
        if self.network not in ("auto", "mlp", "cnn", "gru", "gps"):
            raise ConfigError(f"'network' must be 'auto', 'mlp', 'cnn', 'gru' or 'gps', got '{self.network}'.")
        if self.activation not in ("tanh", "relu", "gelu"):
            raise ConfigError(f"'activation' must be 'tanh', 'relu' or 'gelu', got '{self.activation}'.")
        if self.world_uses > 1 and self.reset_mode != "pool":
            raise ConfigError(f"'world_uses: {self.world_uses}' needs reset_mode 'pool' (got '{self.reset_mode}'): "
                              "only the pool serves a world more than once. Set reset_mode: pool or world_uses: 1.")
        if self.matmul_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"'matmul_dtype' must be 'float32' or 'bfloat16', got '{self.matmul_dtype}'.")
        if self.matmul_dtype != "float32" and self.network not in ("auto", "mlp"):
            raise ConfigError(f"'matmul_dtype: {self.matmul_dtype}' applies to the MLP network only, not "
                              f"'{self.network}': set network: mlp or matmul_dtype: float32.")
        self.check_minibatches(recurrent=self.network == "gru", env_shards=1)
        if self.checkpoint_every and self.checkpoint_every % self.log_every:
            raise ConfigError(
                f"checkpoint_every ({self.checkpoint_every}) must be a multiple of log_every ({self.log_every})."
            )
        if self.num_updates < 1:
            raise ConfigError(
                f"total_timesteps ({self.total_timesteps}) is smaller than one update of "
                f"num_envs x num_steps = {self.num_envs * self.num_steps} steps."
            )

    def check_minibatches(self, recurrent: bool, env_shards: int) -> None:
        """The one divisibility each minibatch split needs (see the module docstring)."""
        mb = self.num_minibatches
        if not recurrent and self.num_steps % mb:
            raise ConfigError(
                f"num_steps ({self.num_steps}) must be divisible by num_minibatches ({mb}): every minibatch takes "
                "num_steps / num_minibatches time steps of every env. Change num_minibatches or num_steps."
            )
        if recurrent and (self.num_envs // env_shards) % mb:
            per_shard = f" per env shard ({self.num_envs // env_shards} with {env_shards} shards)" if env_shards > 1 else ""
            raise ConfigError(
                f"num_envs ({self.num_envs}){per_shard} must be divisible by num_minibatches ({mb}): a recurrent "
                "network trains on whole env trajectories, num_envs / num_minibatches of them per minibatch. "
                "Change num_minibatches or num_envs."
            )

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // (self.num_envs * self.num_steps)

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.num_steps * self.num_seeds


__all__ = ["PPOConfig"]
