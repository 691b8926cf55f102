"""`GuidedConfig`: the two-turn guided agent (ArCHer-style critic) and its multi-turn text game.

One frozen dataclass, loaded from YAML by `jaxrl_hier.config.build_dataclass` and checked by
`validate()` before anything compiles (ConfigError -> exit code 2 in the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm_rl.config import MODEL_MOVED_KEYS, SFT_MOVED_KEYS, ModelSection, SFTSection


@dataclass(frozen=True)
class GuidedConfig:
    seed: int = 0

    # ---- environment: "two_turn" (answer, hint, answer on a task), "guess_number" (higher/lower game) or
    # "wordle" (five-letter words with letter feedback; game_max_turns guesses) or "twenty_questions" (find an
    # object of a closed set by asking its attributes, answered from a table; game_max_turns turns) or
    # "calculator" (the task's problems with a calculator tool: `calc <expr>` calls, then the answer line) or
    # "maze" (walk to a goal cell of a maze seen from inside, one move n/e/s/w a turn; game_max_turns turns)
    env: Literal["two_turn", "guess_number", "wordle", "twenty_questions", "calculator", "maze"] = "two_turn"
    task: str = "arithmetic"
    task_operators: str = "+-"
    task_digits: int = 1
    task_steps: int = 2
    task_path: str | None = None  # GSM8K-format JSONL (task: gsm8k)
    hint_wrong_fraction: float = 0.5  # two_turn warm-start: share of hint / turn-2 examples after a wrong answer
    hint_max_offset: int = 3          # ... whose wrong turn-1 answers are the answer +- 1..hint_max_offset
    # the rule's warm-start hints: "verdict" (lower / higher / right / none), "step" (right, else the
    # first step of the worked solution: arithmetic, or GSM8K-format files with worked answers) or
    # "reduce" (arithmetic worked out up to its last operation, whatever turn 1 said)
    hint_kind: Literal["verdict", "step", "reduce"] = "verdict"
    # two_turn: turn 1 is rewarded with its own correctness and the last turn with the change, so the hint's
    # return is what it added (the episode's return is unchanged; TwoTurnEnv.shaped)
    reward_shaping: bool = False
    game_high: int = 16           # guess_number: secrets 1..game_high
    game_max_turns: int = 5
    tool_max_calls: int = 2         # calculator: calls before the answer (tasks.tool_use)
    tool_direct_fraction: float = 0.5  # calculator warm-start: share of examples answered without a call
    max_prompt_length: int = 8    # tokens of the task's prompt (with BOS); states are longer, see GuidedAgent
    max_new_tokens: int = 9       # tokens of an utterance (answer or hint, EOS included)
    # how a batch of episodes is played: "compiled" = one jitted loop over turns, the env's replies computed
    # from token ids in JAX (tasks.text_games_jax; guess_number), "host" = one generation call per turn and
    # the env in host Python between them, "auto" = compiled where the env has a JAX form
    turn_loop: Literal["auto", "compiled", "host"] = "auto"

    # ---- the backbone: a local Hugging Face directory, or a tiny Qwen2-shaped model built from scratch
    model: ModelSection = field(default_factory=ModelSection)
    mesh_data: int = 1
    mesh_fsdp: int = -1
    mesh_tensor: int = 1
    # roles: actor and guidance are two LoRA adapters on the one frozen backbone (reference = adapters off)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    guidance_model_path: str | None = None  # a separate (e.g. smaller) guidance model with its own adapter

    # ---- supervised warm-start of the backbone (full fine-tuning on the env's warm-start examples):
    # the `sft:` section (steps 0: none)
    sft: SFTSection = field(default_factory=lambda: SFTSection(steps=0))

    # ---- critic (ArCHer): "encoder" = its own small RoBERTa, "backbone" = heads on the frozen backbone
    critic: Literal["encoder", "backbone"] = "encoder"
    critic_hidden_size: int = 64
    critic_layers: int = 1
    critic_heads: int = 2
    critic_intermediate_size: int = 128
    critic_mlp_hidden: int = 64
    critic_learning_rate: float = 1e-3
    critic_batch_size: int = 64
    tau: float = 0.1
    gamma: float = 1.0
    replay_capacity: int = 4096

    # ---- the agent's schedule and policy gradient
    iterations: int = 40
    episodes_per_iteration: int = 64
    critic_steps: int = 8           # per iteration
    actor_steps: int = 1            # per iteration
    actor_micro_batch_size: int = 0  # episodes per micro-batch of a policy step (0 = all); gradients accumulate
    warmup_iterations: int = 2      # critic-only iterations first
    learning_rate: float = 5e-4     # actor and guidance adapters
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    beta: float = 0.0               # KL penalty to the reference (the backbone, adapters off)
    kl_estimator: Literal["k1", "k3"] = "k3"
    clip_eps: float = 0.0           # > 0: PPO clipping of the ratio to the sampler's policy
    normalize_advantages: bool = True
    # "archer": min(Q1, Q2)(s, a) - min(V1, V2)(s) from the critic alone; "return": the episode's observed
    # return from the utterance on minus min(V1, V2)(s) (REINFORCE with the critic's V as the baseline);
    # "group": that return minus the mean over the `group_size` episodes of the same problem (as GRPO)
    advantage: Literal["archer", "return", "group"] = "archer"
    group_size: int = 1             # episodes per problem in an iteration (adjacent); "group" needs >= 2
    train_guidance: bool = True     # two_turn: also update the guidance adapter

    # ---- evaluation, logging, checkpoints
    eval_every: int = 10
    eval_episodes: int = 256  # distinct test problems, or secrets (every one of 1..game_high at most)
    log_every: int = 1
    sample_log_count: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 2

    #: the flat keys the nested `sft:` and `model:` sections replaced (an old config gets a message
    #: naming the new key)
    MOVED_KEYS: ClassVar[dict[str, str]] = {**SFT_MOVED_KEYS, **MODEL_MOVED_KEYS}

    @property
    def on_task(self) -> bool:
        """The env plays a task's problems (two_turn, calculator): its states start with a task prompt."""
        return self.env in ("two_turn", "calculator")

    @property
    def max_turns(self) -> int:
        """Utterances per episode at most."""
        return {"two_turn": 3, "calculator": self.tool_max_calls + 1}.get(self.env, self.game_max_turns)

    def validate(self) -> None:
        def at_least(low: int, *names: str) -> None:
            for n in names:
                v = getattr(self, n)
                if isinstance(v, bool) or not isinstance(v, int) or v < low:
                    raise ConfigError(f"'{n}' must be an integer >= {low}, got {v!r}.")

        at_least(1, "iterations", "episodes_per_iteration", "group_size", "critic_steps", "max_prompt_length", "max_new_tokens",
                 "lora_rank", "critic_hidden_size", "critic_layers", "critic_heads",
                 "critic_intermediate_size", "critic_mlp_hidden", "critic_batch_size", "replay_capacity",
                 "eval_episodes", "log_every", "keep_checkpoints", "game_max_turns", "tool_max_calls")
        at_least(0, "actor_steps", "actor_micro_batch_size", "warmup_iterations",
                 "eval_every", "sample_log_count", "checkpoint_every")
        if not 0.0 <= self.hint_wrong_fraction <= 1.0 or self.hint_max_offset < 1:
            raise ConfigError(f"hint_wrong_fraction must be in [0, 1] and hint_max_offset >= 1, got "
                              f"{self.hint_wrong_fraction} and {self.hint_max_offset}.")
        if self.episodes_per_iteration % self.group_size:
            raise ConfigError(f"group_size={self.group_size} must divide episodes_per_iteration="
                              f"{self.episodes_per_iteration} (each problem is played group_size times).")
        if self.reward_shaping and self.env != "two_turn":
            raise ConfigError(f"reward_shaping shapes the two_turn environment's rewards; env: {self.env} has its own "
                              "per-turn rewards. Remove reward_shaping.")
        if self.advantage == "group" and self.group_size < 2:
            raise ConfigError("advantage: group compares the episodes of one problem: set group_size >= 2.")
        if self.actor_micro_batch_size and self.episodes_per_iteration % self.actor_micro_batch_size:
            raise ConfigError(f"actor_micro_batch_size={self.actor_micro_batch_size} must divide "
                              f"episodes_per_iteration={self.episodes_per_iteration} (a policy step's micro-batches "
                              "cut each role's utterances into equal parts).")
        if self.hint_kind == "step" and self.env == "two_turn" and self.task not in ("arithmetic", "gsm8k"):
            raise ConfigError(f"hint_kind: step needs a task with worked solutions (arithmetic or gsm8k), got "
                              f"task: {self.task}; use hint_kind: verdict.")
        if self.hint_kind == "reduce" and self.env == "two_turn" and self.task != "arithmetic":
            raise ConfigError(f"hint_kind: reduce works out an arithmetic expression up to its last operation; "
                              f"task: {self.task} has none. Use hint_kind: step or verdict.")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"tau (the Polyak step of the target critic) must be in (0, 1], got {self.tau}.")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}.")
        for n in ("learning_rate", "critic_learning_rate", "temperature", "max_grad_norm"):
            if getattr(self, n) <= 0:
                raise ConfigError(f"'{n}' must be > 0, got {getattr(self, n)}.")
        if self.beta < 0 or self.clip_eps < 0:
            raise ConfigError(f"beta and clip_eps must be >= 0, got beta={self.beta}, clip_eps={self.clip_eps}.")
        if self.warmup_iterations >= self.iterations and self.actor_steps:
            raise ConfigError(f"warmup_iterations={self.warmup_iterations} leaves no actor update in "
                              f"iterations={self.iterations}; lower it below iterations.")
        if self.critic_heads and self.critic_hidden_size % self.critic_heads:
            raise ConfigError(f"critic_hidden_size={self.critic_hidden_size} must be a multiple of "
                              f"critic_heads={self.critic_heads}.")
        if self.task == "gsm8k" and not self.task_path:
            raise ConfigError("task: gsm8k needs task_path: a local GSM8K-format JSONL file.")
        if self.checkpoint_every and self.checkpoint_every % self.log_every:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be a multiple of log_every={self.log_every}.")
        turns = self.max_turns
        if self.replay_capacity < self.episodes_per_iteration * turns:
            raise ConfigError(f"replay_capacity={self.replay_capacity} is smaller than one iteration's utterances "
                              f"(episodes_per_iteration x {turns} turns = {self.episodes_per_iteration * turns}); "
                              "raise it.")
        if self.turn_loop == "compiled" and self.on_task:
            raise ConfigError("turn_loop: compiled needs an env with a JAX form (guess_number, wordle, twenty_questions, "
                              "maze); "
                              f"env: {self.env} replies from host Python: use turn_loop: auto or host.")
        if not 0.0 <= self.tool_direct_fraction <= 1.0:
            raise ConfigError(f"tool_direct_fraction must be in [0, 1], got {self.tool_direct_fraction}.")
        if self.env != "two_turn" and self.guidance_model_path:
            raise ConfigError(f"guidance_model_path applies to env: two_turn only ({self.env} has no guidance turn).")
        if self.env == "wordle" and self.max_new_tokens < 6:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} cannot hold a five-letter guess plus EOS; "
                              "raise it to 6.")
        if self.env == "twenty_questions":
            from jaxrl_hier.tasks.text_games import LONGEST_PHRASE

            need = LONGEST_PHRASE + 1
            if self.max_new_tokens < need:
                raise ConfigError(f"max_new_tokens={self.max_new_tokens} cannot hold the longest object or attribute "
                                  f"plus EOS; raise it to {need}.")
        if self.env == "maze" and self.max_new_tokens < 2:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} cannot hold a move (n, e, s or w) plus EOS; raise it to 2.")
        if self.env == "guess_number" and self.max_new_tokens < len(str(self.game_high)) + 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens} cannot hold a guess up to {self.game_high} plus "
                              f"EOS; raise it to {len(str(self.game_high)) + 1}.")


__all__ = ["GuidedConfig"]
