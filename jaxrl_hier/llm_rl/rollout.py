"""Sampling and teacher-forced scoring of prompt + completion batches on the same parameter arrays.

The policy is either full parameters (`lora=None`) or frozen base parameters plus a LoRA adapter;
`policy_parts` turns the trainable tree into the (params, lora) pair every model call takes, so the
sampler, the trainer and the reference (adapter off) all read the very same arrays.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_hier.llm.lora import Lora
from jaxrl_hier.llm.sampling import sample_tokens, shared_prefix_logprobs, token_logprobs


class Rollout(NamedTuple):
    """G completions per prompt, generations of a prompt adjacent: every array [B, N] (B = P x G)."""

    prompt_ids: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    logprobs: jax.Array  # under the sampling distribution: the old policy of the update
    mask: jax.Array      # 1 up to and including EOS


def policy_parts(trainable: Any, base: Any) -> tuple[Any, Lora | None]:
    """(params, lora) for a model call: a LoRA adapter rides on the frozen base, else trainable is the params."""
    if isinstance(trainable, Lora):
        return base, trainable
    return trainable, None


def sample_groups(lm: Any, params: Any, lora: Lora | None, prompt_ids: jax.Array, prompt_mask: jax.Array,
                  key: jax.Array, *, num_generations: int, max_new_tokens: int, temperature: float,
                  top_k: int | None, top_p: float | None, eos_id: int, pad_id: int,
                  suppress_tokens: tuple[int, ...] = ()) -> Rollout:
    """`num_generations` samples of every prompt (traceable: call it inside a jit); each prompt runs
    through the model once for its samples (`sample_tokens(group=)`)."""
    ids = jnp.repeat(prompt_ids, num_generations, axis=0)
    mask = jnp.repeat(prompt_mask, num_generations, axis=0)
    out = sample_tokens(lm, params, prompt_ids, prompt_mask, key, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=(eos_id,), pad_token_id=pad_id,
                        lora=lora, suppress_tokens=suppress_tokens, group=num_generations)
    return Rollout(ids, mask, out.tokens, out.logprobs, out.mask)


def completion_logprobs(lm: Any, params: Any, lora: Lora | None, prompt_ids: jax.Array, prompt_mask: jax.Array,
                        tokens: jax.Array, mask: jax.Array, *, temperature: float = 1.0, top_k: int | None = None,
                        top_p: float | None = None, suppress_tokens: tuple[int, ...] = (),
                        return_entropy: bool = False, group: int = 1) -> Any:
    """Teacher-forced log-probs [B, N] of the completion tokens (0 where mask is 0), and entropies.

    Scored under the same temperature / top-k / top-p / suppressed tokens as the sampler, so for the same params the
    ratio to the sampler's log-probs is 1. `group` > 1 says the rows come in groups of that many
    completions of one prompt (as `sample_groups` lays them out): each prompt then runs through the
    model once for its group (`sampling.shared_prefix_logprobs`; the same numbers).
    """
    if group > 1:
        return shared_prefix_logprobs(lm, params, prompt_ids[::group], prompt_mask[::group], tokens, mask, lora,
                                      group=group, temperature=temperature, top_k=top_k, top_p=top_p,
                                      suppress_tokens=suppress_tokens, return_entropy=return_entropy)
    ids = jnp.concatenate([prompt_ids, tokens], axis=1)
    full_mask = jnp.concatenate([prompt_mask, mask.astype(prompt_mask.dtype)], axis=1)
    start = prompt_ids.shape[1] - 1
    n = tokens.shape[1]
    out = token_logprobs(lm, params, ids, full_mask, lora, temperature=temperature, top_k=top_k, top_p=top_p,
                         suppress_tokens=suppress_tokens, return_entropy=return_entropy)
    if return_entropy:
        logp, ent = out
        return logp[:, start:start + n], ent[:, start:start + n]
    return out[:, start:start + n]


__all__ = ["Rollout", "policy_parts", "sample_groups", "completion_logprobs"]
