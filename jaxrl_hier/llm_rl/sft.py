"""Supervised fine-tuning on prompt/completion pairs, the loss on completion tokens only.

The warm-start stage of every LLM-RL run here: a tiny model trained from scratch on a task's
worked solutions until it solves some problems, so that RL has a signal to sharpen. Full
fine-tuning or a LoRA adapter (the same `policy_parts` convention as GRPO), any mesh the model was
placed on. Sequences use the static layout of `llm_rl.data` (prompt left-padded, completion + EOS
right-padded), and the loss is the token mean of -log p over the completion tokens of the batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_hier.llm.lora import Lora
from jaxrl_hier.llm_rl.data import encode_completions, encode_prompts
from jaxrl_hier.llm_rl.model_setup import commit_to_mesh, jit_keeping_layout
from jaxrl_hier.llm_rl.rollout import completion_logprobs, policy_parts


class SFTState(struct.PyTreeNode):
    trainable: Any
    opt_state: Any
    step: jax.Array


class SFTBatch(NamedTuple):
    prompt_ids: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    mask: jax.Array


def sft_loss(lm: Any, trainable: Any, base: Any, batch: SFTBatch) -> tuple[jax.Array, jax.Array]:
    """Mean negative log-likelihood of the completion tokens (EOS included) and the token accuracy proxy."""
    params, lora = policy_parts(trainable, base)
    logp = completion_logprobs(lm, params, lora, batch.prompt_ids, batch.prompt_mask, batch.tokens, batch.mask)
    m = batch.mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    return -jnp.sum(logp * m) / n, jnp.sum(jnp.exp(logp) * m) / n


class SFT:
    """`init(key)`, `batch(step)`, `step(state, batch)`; compiled once for the static batch shape."""

    def __init__(self, lm: Any, tokenizer: Any, task: Any, *, steps: int, batch_size: int, learning_rate: float,
                 warmup_steps: int, max_prompt_length: int, max_new_tokens: int, seed: int = 0,
                 base_params: Any = None, lora: Lora | None = None, max_grad_norm: float = 1.0) -> None:
        self.lm, self.tokenizer, self.task = lm, tokenizer, task
        self.steps, self.batch_size, self.seed = steps, batch_size, seed
        self.max_prompt_length, self.max_new_tokens = max_prompt_length, max_new_tokens
        self.base_params = lm.params if base_params is None else base_params
        self.lora = lora
        schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(1, min(warmup_steps, steps - 1)),
                                                      max(steps, 2), end_value=learning_rate * 0.1)
        self.optimizer = optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(schedule, weight_decay=0.01))
        self._step = None  # compiled on the first step, for the state's layout (see `step`)

    def init(self) -> SFTState:
        trainable = self.lora if self.lora is not None else self.base_params
        state = SFTState(trainable, self.optimizer.init(trainable), jnp.zeros((), jnp.int32))
        return commit_to_mesh(state, getattr(self.lm, "mesh", None))

    def batch(self, step: int) -> tuple[SFTBatch, int]:
        """The step's examples (seeded by step, so a resumed run sees the same data); and how many were truncated."""
        problems = self.task.problems("train", self.batch_size, (self.seed * 7_919 + step * 31 + 17) % (2**31))
        return self.encode(problems)

    def encode(self, problems: Sequence[Any]) -> tuple[SFTBatch, int]:
        p = encode_prompts(self.tokenizer, [x.prompt for x in problems], self.max_prompt_length)
        ids, mask, truncated = encode_completions(self.tokenizer, [x.target for x in problems], self.max_new_tokens)
        return SFTBatch(*(jnp.asarray(x) for x in (p.ids, p.mask, ids, mask))), truncated

    def _step_impl(self, state: SFTState, base: Any, batch: SFTBatch) -> tuple[SFTState, dict]:
        (loss, tok_p), grads = jax.value_and_grad(lambda t: sft_loss(self.lm, t, base, batch), has_aux=True)(state.trainable)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.trainable)
        trainable = optax.apply_updates(state.trainable, updates)
        return SFTState(trainable, opt_state, state.step + 1), {"loss": loss, "token_prob": tok_p,
                                                                 "grad_norm": optax.global_norm(grads)}

    def step(self, state: SFTState, batch: SFTBatch) -> tuple[SFTState, dict]:
        if self._step is None:
            self._step = jit_keeping_layout(self._step_impl, state, 1)
        return self._step(state, self.base_params, batch)

    def train_step(self, state: SFTState, step: int) -> tuple[SFTState, dict]:
        """The update on step `step`'s batch. Its metrics add `truncated_targets`: how many of the batch's
        targets (with EOS) were longer than max_new_tokens and lost their end (answer line, EOS)."""
        batch, truncated = self.batch(step)
        state, metrics = self.step(state, batch)
        return state, {**metrics, "truncated_targets": truncated}

    def params_and_lora(self, state: SFTState) -> tuple[Any, Lora | None]:
        return policy_parts(state.trainable, self.base_params)


def train_sft(sft: SFT, state: SFTState, until: int, on_step: Any = None) -> SFTState:
    """Run steps state.step .. until-1; `on_step(state, metrics)` after each (logging, checkpoints)."""
    for step in range(int(state.step), until):
        state, metrics = sft.train_step(state, step)
        if on_step is not None:
            on_step(state, {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()})
    return state


__all__ = ["SFT", "SFTBatch", "SFTState", "sft_loss", "train_sft"]
