"""Group advantages and the clipped policy-gradient loss of GRPO, DAPO and Dr.GRPO, as pure functions.

One loss serves every variant; they differ only in how token terms are weighted and in the
advantage's scaling (REFERENCE formulas, l_it = min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i)
- beta KL_it):

    grpo     -(1/G) sum_i (1/|o_i|) sum_t l_it           sequence mean of token means
    dapo     -(1/sum_i |o_i|) sum_i sum_t l_it           one token mean over the whole batch
    dr_grpo  -(1/(G L_max)) sum_i sum_t l_it             a constant normaliser, L_max = max completion length

so each is `-sum(w_it * l_it)` with a per-token weight `w` computed once for the whole batch by
`token_weights`. That is what makes gradient accumulation exact: a micro-batch's loss uses the
weights of the full batch, so the sum of the micro-batch gradients is the full batch's gradient.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

LossType = Literal["grpo", "dapo", "dr_grpo"]
ScaleRewards = Literal["group", "batch", "none"]
KLEstimator = Literal["k1", "k3"]

STD_EPS = 1e-4  # as TRL: keeps groups with a tiny spread from exploding


def group_advantages(rewards: jax.Array, num_generations: int, scale: ScaleRewards = "group",
                     valid: jax.Array | None = None) -> jax.Array:
    """A_i = R_i - mean of its group, divided by the group's (or the batch's) std unless scale='none'.

    rewards: [B] with B = prompts x num_generations, the generations of a prompt adjacent.
    The std is the unbiased one (ddof 1), as TRL's. `valid` [B] (1 = a real row) drops padding
    groups from the batch statistics; their advantages are 0.
    """
    r = rewards.reshape(-1, num_generations).astype(jnp.float32)
    mean = r.mean(axis=1, keepdims=True)
    centred = r - mean
    if scale == "group":
        std = jnp.sqrt(jnp.sum(centred**2, axis=1, keepdims=True) / max(num_generations - 1, 1))
        centred = centred / (std + STD_EPS)
    elif scale == "batch":
        v = jnp.ones_like(r) if valid is None else valid.reshape(r.shape).astype(jnp.float32)
        n = jnp.maximum(v.sum(), 2.0)
        bmean = jnp.sum(r * v) / n
        std = jnp.sqrt(jnp.sum(((r - bmean) ** 2) * v) / (n - 1))
        centred = centred / (std + STD_EPS)
    out = centred.reshape(-1)
    return out if valid is None else out * valid


def token_weights(mask: jax.Array, loss_type: LossType, max_completion_length: int,
                  row_valid: jax.Array | None = None) -> jax.Array:
    """w [B, L] such that the loss is -sum(w * l): see the module docstring.

    `mask` [B, L] is 1 on completion tokens that take part in the loss (after EOS, padding and
    filtered rows are 0); `row_valid` [B] marks real rows (padding groups from dynamic sampling
    are 0 and do not count in any normaliser).
    """
    mask = mask.astype(jnp.float32)
    rows = jnp.ones(mask.shape[0], jnp.float32) if row_valid is None else row_valid.astype(jnp.float32)
    mask = mask * rows[:, None]
    num_rows = jnp.maximum(rows.sum(), 1.0)
    if loss_type == "grpo":
        lengths = jnp.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        return mask / lengths / num_rows
    if loss_type == "dapo":
        return mask / jnp.maximum(mask.sum(), 1.0)
    if loss_type == "dr_grpo":
        return mask / (num_rows * max_completion_length)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: KLEstimator = "k3") -> jax.Array:
    """Per-token KL(pi || ref) estimate from samples of pi: k1 = log pi - log ref, k3 = e^(ref - pi) - (ref - pi) - 1."""
    if estimator == "k1":
        return logp - ref_logp
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


class LossParts(NamedTuple):
    loss: jax.Array
    pg_loss: jax.Array      # the clipped surrogate part (weighted like the loss)
    kl: jax.Array           # weighted mean KL estimate
    clip_frac: jax.Array    # share of weighted tokens whose ratio was clipped
    ratio_mean: jax.Array


def policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, weights: jax.Array, *,
                eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
                ref_logp: jax.Array | None = None, kl_estimator: KLEstimator = "k3") -> LossParts:
    """-sum(w * l) with l = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) - beta KL.

    logp, old_logp, ref_logp, weights: [B, L]; advantages: [B]. Tokens with weight 0 (padding,
    after EOS) contribute nothing, whatever their log-probs. The metrics use the same weights.
    """
    weights = jax.lax.stop_gradient(weights)
    # Positions outside the loss (padding, after EOS) may hold anything; keep their ratio at 1 so a
    # garbage log-prob there can never turn into inf * 0 = NaN.
    ratio = jnp.exp(jnp.where(weights > 0, logp - old_logp, 0.0))
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = jnp.minimum(unclipped, clipped)
    total_w = jnp.maximum(weights.sum(), 1e-12)
    pg = -jnp.sum(weights * surrogate)
    kl = (jnp.zeros_like(logp) if (ref_logp is None or beta == 0.0)
          else jnp.where(weights > 0, kl_penalty(logp, ref_logp, kl_estimator), 0.0))
    loss = pg + beta * jnp.sum(weights * kl)
    is_clipped = (clipped < unclipped).astype(jnp.float32)  # the min chose the clipped branch
    return LossParts(loss=loss, pg_loss=pg, kl=jnp.sum(weights * kl) / total_w,
                     clip_frac=jnp.sum(weights * is_clipped) / total_w,
                     ratio_mean=jnp.sum(weights * ratio) / total_w)


__all__ = ["LossParts", "LossType", "ScaleRewards", "KLEstimator", "group_advantages", "token_weights",
           "kl_penalty", "policy_loss"]
