"""`GRPOConfig`: one frozen config for an SFT warm-start followed by GRPO, DAPO or Dr.GRPO.

`loss_type` picks the variant; the keys it implies (clip-higher, beta, reward scaling, dynamic
sampling, overlong shaping) default to None and `resolved()` fills them in from the variant, so
switching `loss_type: dapo` changes one key in the YAML and gets DAPO's recipe, while any key set
explicitly wins. The saved `config.yaml` holds the resolved values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from jaxrl_hier.config import ConfigError

#: what each variant implies for the keys left at None (REFERENCE: GRPO, DAPO, Dr.GRPO)
VARIANT_DEFAULTS = {
    "grpo": dict(eps_high=None, beta=0.04, scale_rewards="group", dynamic_sampling=False, overlong_filter=False,
                 overlong_buffer=0),
    "dapo": dict(eps_high=0.28, beta=0.0, scale_rewards="group", dynamic_sampling=True, overlong_filter=True,
                 overlong_buffer=-1),  # -1: a quarter of max_new_tokens
    "dr_grpo": dict(eps_high=None, beta=0.0, scale_rewards="none", dynamic_sampling=False, overlong_filter=False,
                    overlong_buffer=0),
}

#: the seed of a step's sampling round r is `... + step * ROUND_STRIDE + r` (GRPO.problems_for), so
#: max_sampling_rounds must stay below it or a step's late rounds would draw the next step's problems
ROUND_STRIDE = 97


@dataclass(frozen=True)
class SFTSection:
    """The `sft:` section of a config that nests its warm-start (GRPO, PGTS, the guided agent): the
    settings the user chooses; the stage's other inputs (lengths, seed, logging) come from the run's
    config."""

    steps: int = 300  # 0: no warm-start
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    checkpoint_every: int = 100

    def validate(self) -> None:
        for name in ("steps", "warmup_steps", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise ConfigError(f"'{name}' must be an integer >= 0, got {value!r}.")
        if self.batch_size < 1:
            raise ConfigError(f"'batch_size' must be a positive integer, got {self.batch_size!r}.")
        if not self.learning_rate > 0:
            raise ConfigError(f"'learning_rate' must be > 0, got {self.learning_rate}.")

    def stage_config(self, *, max_prompt_length: int, max_new_tokens: int, seed: int, eval_problems: int,
                     log_every: int, keep_checkpoints: int, **adapter: Any) -> "SFTStageConfig":
        """The warm-start stage's settings: this section's, plus the lengths, seed and logging the run's
        own config gives (and `adapter`: LoRA rank, alpha, targets and suppressed tokens, where set)."""
        return SFTStageConfig(steps=self.steps, batch_size=self.batch_size, learning_rate=self.learning_rate,
                              warmup_steps=self.warmup_steps, checkpoint_every=self.checkpoint_every,
                              max_prompt_length=max_prompt_length, max_new_tokens=max_new_tokens, seed=seed,
                              eval_problems=eval_problems, log_every=log_every, keep_checkpoints=keep_checkpoints,
                              **adapter)


@dataclass(frozen=True)
class ModelSection:
    """The `model:` section of an LLM run (GRPO, PGTS, the guided agent): a local Hugging Face
    directory (`path`; nothing is downloaded), or, without one, the shape of a tiny Qwen2-shaped
    decoder built from scratch for the task's character tokenizer; `dtype` either way."""

    path: str | None = None
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    dtype: Literal["float32", "bfloat16"] = "float32"

    def validate(self) -> None:
        for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 1:
                raise ConfigError(f"'{name}' must be an integer >= 1, got {value!r}.")
        if self.heads % self.kv_heads:
            raise ConfigError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}.")


#: the flat keys the nested `model:` section replaced
MODEL_MOVED_KEYS = {"model_path": "model.path", "model_hidden_size": "model.hidden_size",
                    "model_layers": "model.layers", "model_heads": "model.heads", "model_kv_heads": "model.kv_heads",
                    "model_intermediate_size": "model.intermediate_size", "dtype": "model.dtype"}


#: the flat keys the nested `sft:` section replaced, for the message an old config gets
SFT_MOVED_KEYS = {f"sft_{k}": f"sft.{k}" for k in ("steps", "batch_size", "learning_rate", "warmup_steps",
                                                   "checkpoint_every")}


@dataclass(frozen=True)
class GRPOSFTSection(SFTSection):
    """GRPO's `sft:` section: the warm-start before GRPO is off unless asked for (`steps: 0`), and
    `lora: true` trains the run's LoRA adapter alone (needs `lora_rank > 0`)."""

    steps: int = 0
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    lora: bool = False

    @classmethod
    def of(cls, section: SFTSection) -> "GRPOSFTSection":
        """A PGTS or guided `sft:` section as GRPO's (the adapter is not trained alone there)."""
        return cls(**dataclasses.asdict(section))


@dataclass(frozen=True)
class SFTStageConfig:
    """What the warm-start stage (`llm_rl.sft_stage.run_sft_stage`) reads, and nothing else. Every
    run's `sft:` section builds it (`SFTSection.stage_config`) with the lengths, seed and logging of
    its run: GRPO's in `GRPOConfig.sft_stage()` (PGTS through that), the guided agent's in `guided_cli`."""

    steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    max_prompt_length: int
    max_new_tokens: int
    seed: int
    eval_problems: int  # distinct held-out problems of the greedy check at the end
    log_every: int
    checkpoint_every: int
    keep_checkpoints: int
    lora_rank: int = 0  # > 0: train a LoRA adapter of this rank (merged at the end), else every weight
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ()
    suppress_tokens: tuple[int, ...] = ()  # token ids the greedy check never decodes


@dataclass(frozen=True)
class GRPOConfig:
    seed: int = 0

    # ---- task (jaxrl_hier.tasks)
    task: str = "arithmetic"
    task_operators: str = "+-"
    task_digits: int = 2
    task_steps: int = 1
    task_worked: bool = False
    task_path: str | None = None  # GSM8K-format JSONL (task: gsm8k)

    # ---- model: a local Hugging Face directory, or a tiny Qwen2-shaped model built from scratch
    model: ModelSection = field(default_factory=lambda: ModelSection(intermediate_size=352))
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    mesh_data: int = 1
    mesh_fsdp: int = -1
    mesh_tensor: int = 1

    # ---- supervised warm-start (`sft:`; 0 steps = none)
    sft: GRPOSFTSection = field(default_factory=GRPOSFTSection)

    # ---- GRPO
    total_steps: int = 50
    prompts_per_step: int = 16
    num_generations: int = 8
    max_prompt_length: int = 32
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    suppress_tokens: tuple[int, ...] = ()  # token ids never sampled (e.g. every special token: fixed-length completions)
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    num_iterations: int = 1
    micro_batch_size: int = 0  # 0: the whole batch in one pass
    # recompute each decoder layer in the update's backward pass instead of keeping its residuals:
    # about a fifth of the compiled update's temporary memory, and faster on CPU (benchmarks/llm_rl/grpo_update_profile.py)
    remat: bool = True
    # how the sampler's decode loop runs the layers (`ModelConfig.unroll_decode`): null = the model's own
    # setting (by default unrolled when the layer weights take at most 1 GiB), true = unrolled over
    # per-layer arrays (faster; one copy of the layer weights while generating), false = the layer scan
    unroll_decode: bool | None = None
    # the update runs each prompt through the model once for its num_generations completions and shares its
    # keys and values with them (the same numbers; micro-batches must then hold whole groups)
    shared_prefix: bool = True
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"
    eps_low: float = 0.2
    eps_high: float | None = None
    beta: float | None = None
    kl_estimator: Literal["k1", "k3"] = "k3"
    scale_rewards: Literal["group", "batch", "none"] | None = None
    dynamic_sampling: bool | None = None
    max_sampling_rounds: int = 4
    overlong_filter: bool | None = None
    overlong_buffer: int | None = None
    overlong_penalty: float = 1.0
    reward_correct: float = 1.0
    reward_format: float = 0.1
    jax_rewards: bool = True  # rewards from token ids on the device; false: the tasks' Python rewards
    fused_step: bool = False  # sampling, rewards and update as one compiled program (no per-stage times)
    # colocated: sampler and trainer share the arrays on every device; split: the server-style layout
    # (generation on the first half of the devices, training on the second, weights copied every step)
    placement: Literal["colocated", "split"] = "colocated"

    # ---- evaluation, logging, checkpoints
    eval_every: int = 10
    eval_problems: int = 200  # distinct test problems (all of the split when it holds fewer)
    log_every: int = 1
    sample_log_count: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 2

    #: the flat keys the nested `sft:` section replaced (an old config gets a message naming the new key)
    MOVED_KEYS: ClassVar[dict[str, str]] = {**SFT_MOVED_KEYS, **MODEL_MOVED_KEYS, "sft_lora": "sft.lora"}

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.num_generations

    def sft_stage(self) -> SFTStageConfig:
        """The warm-start's settings (with `sft.lora` the stage trains the run's LoRA adapter)."""
        return self.sft.stage_config(max_prompt_length=self.max_prompt_length, max_new_tokens=self.max_new_tokens,
                                     seed=self.seed, eval_problems=self.eval_problems, log_every=self.log_every,
                                     keep_checkpoints=self.keep_checkpoints,
                                     lora_rank=self.lora_rank if self.sft.lora else 0, lora_alpha=self.lora_alpha,
                                     lora_targets=tuple(self.lora_targets), suppress_tokens=tuple(self.suppress_tokens))

    def resolved(self) -> "GRPOConfig":
        """The config with every variant-implied None filled in (see VARIANT_DEFAULTS)."""
        d = VARIANT_DEFAULTS[self.loss_type]
        fill = {k: d[k] for k in d if getattr(self, k) is None}
        if fill.get("eps_high", 0) is None:
            fill["eps_high"] = self.eps_low
        out = dataclasses.replace(self, **fill)
        if out.overlong_buffer == -1:
            out = dataclasses.replace(out, overlong_buffer=max(1, self.max_new_tokens // 4))
        return out

    def validate(self) -> None:
        def positive(*names: str) -> None:
            for n in names:
                if getattr(self, n) < 1:
                    raise ConfigError(f"'{n}' must be >= 1, got {getattr(self, n)}.")

        positive("total_steps", "prompts_per_step", "max_prompt_length", "max_new_tokens", "num_iterations",
                 "eval_problems", "log_every", "max_sampling_rounds", "keep_checkpoints")
        if self.num_generations < 2:
            raise ConfigError(f"num_generations must be >= 2 (a group needs two completions to compare), "
                              f"got {self.num_generations}.")
        if self.micro_batch_size < 0 or (self.micro_batch_size and self.batch_size % self.micro_batch_size):
            raise ConfigError(f"micro_batch_size={self.micro_batch_size} must divide prompts_per_step x "
                              f"num_generations = {self.batch_size} (or be 0 for the whole batch).")
        if self.shared_prefix and self.micro_batch_size and self.micro_batch_size % self.num_generations:
            raise ConfigError(f"micro_batch_size={self.micro_batch_size} splits a prompt's group of "
                              f"num_generations={self.num_generations} completions, which shared_prefix: true runs "
                              "together; use a multiple of num_generations, or shared_prefix: false.")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 for GRPO sampling, got {self.temperature}.")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {self.top_k}.")
        for n in ("warmup_steps", "eval_every", "checkpoint_every", "sample_log_count", "lora_rank"):
            if getattr(self, n) < 0:
                raise ConfigError(f"'{n}' must be >= 0, got {getattr(self, n)}.")
        for n in ("learning_rate", "eps_low"):
            if getattr(self, n) <= 0:
                raise ConfigError(f"'{n}' must be > 0, got {getattr(self, n)}.")
        if self.beta is not None and self.beta < 0:
            raise ConfigError(f"beta must be >= 0, got {self.beta}.")
        # a negative eps_high puts 1 + eps_high below 1 - eps_low: the clip pins every ratio to 1 + eps_high
        if self.eps_high is not None and self.eps_high < 0:
            raise ConfigError(f"eps_high must be >= 0 (null: the variant's value, else eps_low), got {self.eps_high}.")
        # above max_new_tokens the ramp starts below length 0 and penalises every completion; below -1
        # the buffer is non-zero yet penalises nothing
        if self.overlong_buffer is not None and not -1 <= self.overlong_buffer <= self.max_new_tokens:
            raise ConfigError(f"overlong_buffer must be in [-1, max_new_tokens={self.max_new_tokens}] (-1: a quarter "
                              f"of max_new_tokens, 0: no overlong penalty), got {self.overlong_buffer}.")
        if self.max_sampling_rounds >= ROUND_STRIDE:
            raise ConfigError(f"max_sampling_rounds must be in [1, {ROUND_STRIDE - 1}]: the problems of round r of "
                              f"step s are seeded by s x {ROUND_STRIDE} + r, so {ROUND_STRIDE} or more rounds would "
                              f"draw the next step's problems; got {self.max_sampling_rounds}.")
        if self.placement == "split" and self.fused_step:
            raise ConfigError("fused_step: true runs on one set of devices; it cannot be combined with placement: split.")
        if self.sft.lora and self.lora_rank == 0:
            raise ConfigError("sft.lora: true needs lora_rank > 0.")
        if self.task == "gsm8k" and not self.task_path:
            raise ConfigError("task: gsm8k needs task_path: a local GSM8K-format JSONL file.")
        if self.checkpoint_every and self.checkpoint_every % self.log_every:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be a multiple of log_every={self.log_every}.")
        if self.reward_correct < 0 or self.reward_format < 0 or self.overlong_penalty < 0:
            raise ConfigError("reward_correct, reward_format and overlong_penalty must be >= 0.")


__all__ = ["ModelSection", "MODEL_MOVED_KEYS", "SFTSection", "GRPOSFTSection", "SFT_MOVED_KEYS", "GRPOConfig", "ROUND_STRIDE", "VARIANT_DEFAULTS"]
