"""`PGTSConfig`: one frozen config for the whole PGTS pipeline (generator SFT, reward model, PGTS
PPO, evaluation against the baselines), validated at load (`validate`) before anything compiles.

The generator's warm-start and the search policy's PPO are nested sections of their own types:
`sft:` (`llm_rl.config.SFTSection`) and `ppo:` (`algorithms.ppo_config.PPOConfig`, with PGTS's
defaults: the `PGTS-v0` env, the `gps` network); in YAML a section gives only the keys it changes,
on the command line `ppo.lr=1e-3`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from jaxrl_hier.algorithms.ppo_config import PPOConfig
from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm_rl.config import MODEL_MOVED_KEYS, SFT_MOVED_KEYS, ModelSection, SFTSection

#: PGTS's search policy: PPO on the search env with the tree network (`search.gps`). `env` and
#: `network` are PGTS's own; seed, logging and checkpoint keys come from the top level (`ppo_config`).
PGTS_PPO = PPOConfig(env="PGTS-v0", network="gps", activation="relu", total_timesteps=16384, num_envs=32,
                     num_steps=16, update_epochs=4, num_minibatches=4, lr=3e-4, gamma=1.0, gae_lambda=0.95,
                     clip_eps=0.2, ent_coef=0.01, vf_coef=0.5, hidden_size=64, num_layers=2, reset_mode="auto",
                     num_devices=1, eval_gif=False)
_PPO_FROM_TOP = ("seed", "log_every", "checkpoint_every", "keep_checkpoints")


@dataclass(frozen=True)
class PGTSConfig:
    seed: int = 0

    # ---- task: procedural arithmetic with worked steps (one operation per line)
    task: Literal["arithmetic"] = "arithmetic"
    task_operators: str = "+-"
    task_digits: int = 1
    task_steps: int = 3

    # ---- generator: a tiny Qwen2-shaped model trained from scratch by SFT (or a local HF directory)
    model: ModelSection = field(default_factory=ModelSection)
    max_prompt_length: int = 10  # BOS + prompt, left-padded
    sft: SFTSection = field(default_factory=SFTSection)  # the generator's warm-start on worked solutions

    # ---- the search tree
    max_nodes: int = 12
    max_depth: int = 5
    max_children: int = 3
    step_tokens: int = 10
    token_budget: int = 60
    temperature: float = 1.0  # the generator's sampling temperature for steps (search, self-consistency, MCTS)
    greedy_first_child: bool = False  # a node's first child is the greedy step, siblings are sampled (search, MCTS)
    # later children: "sample" at `temperature`, or "swap": the first child's step with its k-th
    # least-confident token replaced by the generator's second choice, continued greedily (needs
    # greedy_first_child; search env and MCTS)
    sibling: Literal["sample", "swap"] = "sample"
    cost_expand: float = 0.1
    cost_branch: float = 0.2
    cost_backtrack: float = 0.5
    cost_terminate: float = 0.0
    correct_reward: float = 1.0

    # ---- reward model: sampled solutions of training problems, each partial path labelled by its
    # solution's final answer ("final", the paper's phase 1) or by whether all its steps are right
    # ("steps", process labels from the task's worked solutions: `steps_correct`)
    rm_labels: Literal["final", "steps"] = "final"
    # "classifier": the above; "likelihood": instead a second decoder of the generator's shape trained
    # by SFT on the worked solutions (rm_sft_steps, seed + 1) scores a path by the probability of its
    # least likely step token (search.reward_model.LikelihoodVerifier); the labelled held-out paths
    # still measure it
    rm_kind: Literal["classifier", "likelihood"] = "classifier"
    rm_sft_steps: int = 300
    rm_problems: int = 512
    rm_samples: int = 4
    rm_eval_problems: int = 128  # distinct validation problems whose paths measure the reward model
    rm_steps: int = 300
    rm_batch_size: int = 64
    rm_learning_rate: float = 1e-4

    # ---- PGTS policy trained by PPO (jaxrl_hier.algorithms.ppo, network: gps; hidden_size and
    # num_layers size the policy; the initial logit bias of Expand and Terminate (GPSActorCritic.prior)
    # starts it near CoT)
    train_problems: int = 1000
    ppo: PPOConfig = field(default_factory=lambda: PGTS_PPO)
    policy_prior: float = 2.0
    # imitation warm-start (search.imitation): before PPO, behaviour cloning of the threshold rule
    # (Branch when the new step scores below imitation_tau and its parent has at most imitation_extra
    # children) on its searches of imitation_problems training problems; 0 steps: PPO from the prior
    imitation_steps: int = 0
    imitation_problems: int = 512
    imitation_tau: float = 0.3
    imitation_extra: int = 1
    imitation_batch_size: int = 256
    imitation_learning_rate: float = 1e-3

    # ---- evaluation (held-out problems) and baselines
    eval_problems: int = 256  # distinct problems: test for the evaluation stage, validation for the PPO curve
    # and the rule-search benchmark
    eval_every: int = 8  # PPO updates between PGTS evaluations (0: only at the end)
    sc_samples: tuple[int, ...] = (2, 4)  # self-consistency and best-of-N sizes
    mcts_simulations: int = 16
    mcts_children: int = 3
    mcts_c: float = 1.0

    # ---- logging and checkpoints
    log_every: int = 1
    checkpoint_every: int = 8
    keep_checkpoints: int = 2
    # end the pipeline after this stage (null: run it all): e.g. "reward_model" for the models a
    # validation sweep compares (benchmarks/search/pgts_rule_search.py) with no look at the test split, which
    # the PPO stage's evaluations and the evaluation stage report; a --resume may lift it
    stop_after: Literal["sft", "reward_model", "ppo"] | None = None

    #: the flat keys the nested sections replaced (an old config gets a message naming the new key)
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        **SFT_MOVED_KEYS, **MODEL_MOVED_KEYS, "policy_hidden_size": "ppo.hidden_size", "policy_layers": "ppo.num_layers",
        **{k: f"ppo.{k}" for k in ("total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                                    "lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef")}}

    @property
    def cot_max_tokens(self) -> int:
        """The longest solution: max_depth steps of step_tokens (CoT and sampled paths)."""
        return self.max_depth * self.step_tokens

    @property
    def max_search_actions(self) -> int:
        """A bound on one search's actions: between two generated nodes (at most max_nodes) a policy
        can only backtrack, at most max_depth times in a row."""
        return self.max_nodes * (self.max_depth + 1) + 1

    @property
    def num_updates(self) -> int:
        return self.ppo.num_updates

    def validate(self) -> None:
        positive = ("task_digits", "task_steps", "max_prompt_length", "max_nodes", "max_depth",
                    "max_children", "step_tokens", "token_budget", "rm_problems", "rm_samples", "rm_eval_problems",
                    "rm_steps", "rm_batch_size", "rm_sft_steps", "train_problems", "eval_problems",
                    "mcts_simulations", "mcts_children", "log_every", "keep_checkpoints", "imitation_problems",
                    "imitation_batch_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"'{name}' must be a positive integer, got {value!r}.")
        for name in ("eval_every", "checkpoint_every", "imitation_steps", "imitation_extra"):
            if getattr(self, name) < 0:
                raise ConfigError(f"'{name}' must be >= 0, got {getattr(self, name)}.")
        for name in ("temperature", "rm_learning_rate", "imitation_learning_rate"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"'{name}' must be > 0, got {getattr(self, name)}.")
        for name in ("cost_expand", "cost_branch", "cost_backtrack", "cost_terminate", "correct_reward", "mcts_c"):
            if getattr(self, name) < 0:
                raise ConfigError(f"'{name}' must be >= 0, got {getattr(self, name)}.")
        for name, own in (("env", "PGTS-v0"), ("network", "gps"), ("num_seeds", 1), ("num_devices", 1)):
            if getattr(self.ppo, name) != own:  # the pipeline trains one search policy on one device
                raise ConfigError(f"'ppo.{name}' is PGTS's own ({own}), got {getattr(self.ppo, name)!r}: remove it.")
        for name in _PPO_FROM_TOP:
            if getattr(self.ppo, name) != getattr(PGTS_PPO, name):
                raise ConfigError(f"'ppo.{name}' comes from the top-level '{name}' of a PGTS config: set '{name}' "
                                  f"instead of 'ppo.{name}'.")
        if self.max_nodes < 2:
            raise ConfigError(f"'max_nodes' must be >= 2 (the root and one step), got {self.max_nodes}.")
        if self.sibling == "swap" and not self.greedy_first_child:
            raise ConfigError("sibling: swap changes the greedy first child's step at its least-confident token, so "
                              "it needs greedy_first_child: true.")
        if not self.sc_samples or any(not isinstance(n, int) or n < 1 for n in self.sc_samples):
            raise ConfigError(f"'sc_samples' must be a non-empty list of positive integers, got {self.sc_samples!r}.")
        if self.checkpoint_every and self.checkpoint_every % self.log_every:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be a multiple of log_every={self.log_every}.")
        if self.eval_every and self.eval_every % self.log_every:
            raise ConfigError(f"eval_every={self.eval_every} must be a multiple of log_every={self.log_every}.")

    def sft_config(self):
        """The GRPOConfig the shared SFT stage and model set-up (jaxrl_hier.llm_rl) read."""
        from jaxrl_hier.llm_rl.config import GRPOConfig, GRPOSFTSection

        return GRPOConfig(seed=self.seed, task="arithmetic", task_operators=self.task_operators,
                          task_digits=self.task_digits, task_steps=self.task_steps, task_worked=True,
                          model=self.model, sft=GRPOSFTSection.of(self.sft), max_prompt_length=self.max_prompt_length,
                          max_new_tokens=self.cot_max_tokens, eval_problems=self.eval_problems,
                          log_every=self.log_every, keep_checkpoints=self.keep_checkpoints).resolved()

    def ppo_config(self) -> PPOConfig:
        """The `ppo:` section with the run's seed, logging and checkpoint keys."""
        return dataclasses.replace(self.ppo, **{k: getattr(self, k) for k in _PPO_FROM_TOP})


#: keys a resume may change: logging, evaluation and retention only. Not total_timesteps: PPO anneals
#: its learning rate over num_updates, so a new length would change the rate of every update still
#: to come (PPO's own CLI refuses it too).
PGTS_RESUME_SAFE_KEYS = ("log_every", "checkpoint_every", "keep_checkpoints", "eval_every", "stop_after")

__all__ = ["PGTSConfig", "PGTS_RESUME_SAFE_KEYS"]
