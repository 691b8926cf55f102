"""Batched LLM sampling with a static-shape KV cache, and its training-side twin `token_logprobs`.

`generate` left-pads the prompts to a length bucket (so a training loop sees a handful of shapes
and compiles a handful of programs), runs the whole prompt through the model in one forward that
fills the KV cache, then decodes `max_new_tokens` tokens with `lax.scan`, one cache slot per step.
Each row stops at its own EOS: afterwards it emits `pad_token_id` with mask 0.

Log-probs: `GenerateOutput.logprobs` are those of the sampled tokens under the distribution that was
actually sampled (logits / temperature, then top-k, then top-p, renormalised). With greedy decoding
(temperature 0) that distribution is a point mass, so the model's own log-prob (temperature 1, no
filtering) is reported instead. `token_logprobs` computes the same numbers teacher-forced.

The model is any object with `.config` and `.forward(params, input_ids, attention_mask, *,
positions, cache, cache_index, lora)` and `.init_cache(batch, max_len)` (jaxrl_hier.llm's
`LanguageModel`): with a cache, `attention_mask` is [B, max_len] over cache slots.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.config import ConfigError

DEFAULT_MIN_BUCKET = 16


class GenerateOutput(NamedTuple):
    """tokens, logprobs and mask are [B, max_new_tokens]; mask is 1 up to and including EOS."""

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array


# ----------------------------------------------------------------------------- bucketing


def bucket_length(length: int, buckets: Sequence[int] | None = None, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
    """The padded prompt length: the smallest bucket >= length (powers of two by default)."""
    if buckets:
        fits = [b for b in sorted(buckets) if b >= length]
        if not fits:
            raise ConfigError(f"prompt length {length} exceeds the largest bucket {max(buckets)}; "
                              "add a larger bucket or truncate the prompts.")
        return int(fits[0])
    bucket = min_bucket
    while bucket < length:
        bucket *= 2
    return bucket


def left_pad(input_ids: Any, attention_mask: Any, length: int, pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad [B, T] ids and mask to [B, length] (padding has mask 0 and `pad_token_id`)."""
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    extra = length - ids.shape[1]
    if extra < 0:
        raise ConfigError(f"cannot pad prompts of length {ids.shape[1]} down to {length}.")
    ids = np.pad(ids, ((0, 0), (extra, 0)), constant_values=pad_token_id)
    mask = np.pad(mask, ((0, 0), (extra, 0)), constant_values=0)
    return ids.astype(np.int32), mask.astype(np.int32)


# ----------------------------------------------------------------------------- filtering


def filter_logits(logits: jax.Array, temperature: jax.Array | float, top_k: int | None,
                  top_p: jax.Array | float | None) -> jax.Array:
    """Log-probs of the sampling distribution: temperature, then top-k, then nucleus top-p.

    Removed tokens get -inf; the result is renormalised (a log_softmax).
    """
    scaled = logits.astype(jnp.float32) / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if top_p is not None:
        order = jnp.argsort(-scaled, axis=-1)
        sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # keep a token when the mass strictly before it is < top_p: the top token is always kept
        before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = before < top_p
        keep = jnp.zeros_like(keep_sorted).at[
            jnp.arange(scaled.shape[0])[:, None], order].set(keep_sorted)
        scaled = jnp.where(keep, scaled, -jnp.inf)
    return jax.nn.log_softmax(scaled, axis=-1)


def _positions(mask: jax.Array) -> jax.Array:
    """Position ids of left-padded rows: 0 at the first real token (padding clipped to 0)."""
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0).astype(jnp.int32)


def _call(lm: Any, params: Any, ids: jax.Array, mask: jax.Array, lora: Any, **kw: Any) -> tuple[jax.Array, Any]:
    if lora is not None:
        kw["lora"] = lora
    return lm.forward(params, ids, mask, **kw)


# ----------------------------------------------------------------------------- generate


def _generate_impl(lm: Any, params: Any, input_ids: jax.Array, attention_mask: jax.Array, key: jax.Array,
                   temperature: jax.Array, top_p: jax.Array | None, lora: Any, *, max_new_tokens: int,
                   greedy: bool, top_k: int | None, eos: tuple[int, ...], pad_token_id: int) -> GenerateOutput:
    batch, prompt_len = input_ids.shape
    max_len = prompt_len + max_new_tokens
    cache = lm.init_cache(batch, max_len)
    cache_mask = jnp.zeros((batch, max_len), jnp.int32).at[:, :prompt_len].set(attention_mask)
    logits, cache = _call(lm, params, input_ids, cache_mask, lora, positions=_positions(attention_mask),
                          cache=cache, cache_index=0)
    last = logits[:, -1]
    next_pos = jnp.sum(attention_mask, axis=-1).astype(jnp.int32)
    eos_arr = jnp.asarray(eos if eos else (-1,), jnp.int32)

    def pick(last, done, sub):
        """Sample (or argmax) one token per row from the last logits; finished rows emit padding."""
        if greedy:
            token = jnp.argmax(last, axis=-1).astype(jnp.int32)
            logp_dist = jax.nn.log_softmax(last.astype(jnp.float32), axis=-1)
        else:
            logp_dist = filter_logits(last, temperature, top_k, top_p)
            token = jax.random.categorical(sub, logp_dist, axis=-1).astype(jnp.int32)
        logp = jnp.take_along_axis(logp_dist, token[:, None], axis=-1)[:, 0]
        live = ~done
        token = jnp.where(live, token, pad_token_id)
        done = done | (live & jnp.isin(token, eos_arr))
        return (token, jnp.where(live, logp, 0.0), live.astype(jnp.int32)), done

    keys = jax.random.split(key, max_new_tokens)

    def step(carry, i):
        # sample token i, then run it through the model to get the logits for token i + 1
        cache, cache_mask, last, done, pos = carry
        out, done = pick(last, done, keys[i])
        slot = prompt_len + i
        cache_mask = cache_mask.at[:, slot].set(1)
        logits, cache = _call(lm, params, out[0][:, None], cache_mask, lora, positions=pos[:, None],
                              cache=cache, cache_index=slot)
        return (cache, cache_mask, logits[:, -1], done, pos + 1), out

    done0 = jnp.zeros((batch,), bool)
    # the last token needs no forward pass: scan max_new_tokens - 1 steps, then sample once more
    carry, outs = jax.lax.scan(step, (cache, cache_mask, last, done0, next_pos), jnp.arange(max_new_tokens - 1))
    final, _ = pick(carry[2], carry[3], keys[-1])
    tokens, logps, masks = (jnp.concatenate([o, f[None]], axis=0) for o, f in zip(outs, final))
    return GenerateOutput(tokens.T, logps.T, masks.T)


_COMPILED: dict[tuple, tuple[Any, Any]] = {}


def _compiled(lm: Any, statics: tuple) -> Any:
    """One jitted generate per (model object, static settings); jit's own cache handles shapes."""
    key = (id(lm), statics)
    if key not in _COMPILED:
        max_new_tokens, greedy, top_k, eos, pad = statics

        def fn(params, ids, mask, rng, temperature, top_p, lora):
            return _generate_impl(lm, params, ids, mask, rng, temperature, top_p, lora,
                                  max_new_tokens=max_new_tokens, greedy=greedy, top_k=top_k, eos=eos,
                                  pad_token_id=pad)

        _COMPILED[key] = (lm, jax.jit(fn))  # holding lm keeps id(lm) from being reused
    return _COMPILED[key][1]


def compiled_programs() -> int:
    """How many generate programs XLA has compiled in this process (for recompilation checks)."""
    return int(sum(f._cache_size() for _, f in _COMPILED.values()))


def clear_compiled() -> None:
    """Drop the compiled generate programs (and the model objects they keep alive)."""
    _COMPILED.clear()


def _eos_tuple(eos_token_id: int | Sequence[int] | None) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, (int, np.integer)):
        return (int(eos_token_id),)
    return tuple(int(e) for e in eos_token_id)


def _check(input_ids: Any, attention_mask: Any, max_new_tokens: int, temperature: float,
           top_k: int | None, top_p: float | None) -> None:
    ids, mask = np.shape(input_ids), np.shape(attention_mask)
    if len(ids) != 2 or ids != mask:
        raise ConfigError(f"input_ids {ids} and attention_mask {mask} must both be [batch, length].")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be >= 1 or None, got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1] or None, got {top_p}.")
    if np.any(np.asarray(attention_mask).sum(-1) == 0):
        raise ConfigError("every prompt needs at least one token with attention_mask 1.")


def _check_positions(lm: Any, attention_mask: Any, max_new_tokens: int) -> None:
    """Learned position tables (GPT-2) have no row past max_position_embeddings: a gather there
    would silently clamp and give wrong logits, so refuse before compiling. RoPE models go on."""
    c = getattr(lm, "config", None)
    if c is None or getattr(c, "rope", True):
        return
    longest = int(np.asarray(attention_mask).sum(-1).max()) + int(max_new_tokens)
    if longest > c.max_position_embeddings:
        raise ConfigError(f"a prompt of {longest - max_new_tokens} tokens plus max_new_tokens={max_new_tokens} needs "
                          f"{longest} positions, but this model has max_position_embeddings="
                          f"{c.max_position_embeddings}; shorten the prompt or max_new_tokens.")


def generate(lm: Any, params: Any, input_ids: Any, attention_mask: Any, *, key: jax.Array, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_token_id: int | Sequence[int] | None = None, lora: Any = None, pad_token_id: int = 0,
             buckets: Sequence[int] | None = None, min_bucket: int = DEFAULT_MIN_BUCKET) -> GenerateOutput:
    """Sample `max_new_tokens` tokens for each left-padded prompt; see the module docstring.

    Prompts are left-padded to `bucket_length(T, buckets, min_bucket)`, so batches whose lengths
    fall in one bucket reuse one compiled program. Greedy when temperature == 0.
    """
    _check(input_ids, attention_mask, max_new_tokens, temperature, top_k, top_p)
    _check_positions(lm, attention_mask, max_new_tokens)
    length = bucket_length(np.shape(input_ids)[1], buckets, min_bucket)
    ids, mask = left_pad(input_ids, attention_mask, length, pad_token_id)
    greedy = temperature == 0
    statics = (int(max_new_tokens), greedy, None if greedy else top_k, _eos_tuple(eos_token_id), int(pad_token_id))
    fn = _compiled(lm, statics)
    top_p_arg = None if (greedy or top_p is None or top_p >= 1) else jnp.float32(top_p)
    return fn(params, jnp.asarray(ids), jnp.asarray(mask), key, jnp.float32(1.0 if greedy else temperature),
              top_p_arg, lora)


# ----------------------------------------------------------------------------- scoring


def _token_logprobs_impl(lm: Any, params: Any, input_ids: jax.Array, attention_mask: jax.Array,
                         lora: Any) -> jax.Array:
    logits, _ = _call(lm, params, input_ids, attention_mask, lora, positions=_positions(attention_mask))
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]
    # Entry j is a real prediction only when both its context token j and its target j+1 are real
    # (the first real token of a left-padded row has no real context).
    return picked * (attention_mask[:, :-1] * attention_mask[:, 1:])


def token_logprobs(lm: Any, params: Any, input_ids: Any, attention_mask: Any, lora: Any = None) -> jax.Array:
    """Teacher-forced log p(x_t | x_<t) for t = 1..T-1: shape [B, T-1].

    Entry j scores token input_ids[:, j + 1]; it is 0 unless tokens j and j + 1 both have
    attention_mask 1 (so a left-padded row's first real token, which has no context, scores 0). Left-padded rows are fine (positions follow the mask).
    Differentiable in params and lora; call it inside your own jit (it is traced, not jitted here).
    """
    ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.asarray(attention_mask, jnp.int32)
    return _token_logprobs_impl(lm, params, ids, mask, lora)


__all__ = ["GenerateOutput", "generate", "token_logprobs", "bucket_length", "left_pad", "filter_logits",
           "compiled_programs", "clear_compiled"]
