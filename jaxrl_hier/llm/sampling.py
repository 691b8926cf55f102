"""Batched LLM sampling with a static-shape KV cache, and its training-side twin `token_logprobs`.

`generate` left-pads the prompts to a length bucket (so a training loop sees a handful of shapes
and compiles a handful of programs), runs the whole prompt through the model in one forward that
fills the KV cache, then decodes `max_new_tokens` tokens with `lax.scan`, one cache slot per step.
Each row stops at its own EOS: afterwards it emits `pad_token_id` with mask 0.

Log-probs: `GenerateOutput.logprobs` are those of the sampled tokens under the distribution that was
actually sampled (logits / temperature, then top-k, then top-p, renormalised). With greedy decoding
(temperature 0) that distribution is a point mass, so the model's own log-prob (temperature 1, no
filtering) is reported instead. `token_logprobs` computes the same numbers teacher-forced, under the
same temperature / top-k / top-p (so a co-located RL step starts with importance ratios of 1),
projecting to the vocabulary a chunk of positions at a time.

`sample_tokens` is the pure sampling program under `generate` (no host work): call it inside your
own jit / vmap / scan.

The model is any object with `.config` and `.forward(params, input_ids, attention_mask, *,
positions, cache, cache_index, lora)` and `.init_cache(batch, max_len)` (jaxrl_hier.llm's
`LanguageModel`): with a cache, `attention_mask` is [B, max_len] over cache slots. A model may
also have `.decode_layout(params, lora, cache)`, which gives the arrays the decode loop runs on
(LanguageModel: per-layer weights and caches for small models, `decoder.unrolls_decode`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.decoder import KVCache, default_positions
from jaxrl_hier.llm.jit_cache import JitCache

DEFAULT_MIN_BUCKET = 16


class GenerateOutput(NamedTuple):
    """tokens, logprobs and mask are [B, max_new_tokens]; mask is 1 up to and including EOS.

    hidden is [B, max_new_tokens, H] from `sample_tokens(..., return_hidden=True)`, else None.
    runner_up and margin [B, max_new_tokens] from `sample_tokens(..., return_runner_up=True)`, else
    None: at each position the token the model's own distribution ranks second, and the log-prob gap
    between its first and second choice (small = the model nearly chose otherwise)."""

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    hidden: jax.Array | None = None
    runner_up: jax.Array | None = None
    margin: jax.Array | None = None


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
    """Log-probs [..., V] of the sampling distribution: temperature, then top-k, then nucleus top-p.

    Removed tokens get -inf; the result is renormalised (a log_softmax). Any leading dims.
    """
    scaled = logits.astype(jnp.float32) / temperature
    ranked = None  # the candidates in descending order, when top-k already sorted them
    if top_k is not None and top_k < scaled.shape[-1]:
        ranked = jax.lax.top_k(scaled, top_k)[0]
        scaled = jnp.where(scaled < ranked[..., -1:], -jnp.inf, scaled)
    if top_p is not None:
        if ranked is None:
            ranked = -jnp.sort(-scaled, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        # keep a token when the mass strictly before it is < top_p: the top token is always kept;
        # the kept tokens are a prefix of the ranking, so the smallest kept logit is the cut
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        cut = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
        scaled = jnp.where(scaled >= cut, scaled, -jnp.inf)
    return jax.nn.log_softmax(scaled, axis=-1)


def _entropy(logp: jax.Array) -> jax.Array:
    """Entropy of log-probs over the last axis (filtered-out tokens, at -inf, add nothing)."""
    return -jnp.sum(jnp.where(jnp.isfinite(logp), jnp.exp(logp) * logp, 0.0), axis=-1)


def _is_zero(x: Any) -> bool:
    return isinstance(x, (int, float, np.number)) and float(x) == 0.0


def _settings(temperature: Any, top_k: int | None, top_p: Any) -> tuple[bool, Any, int | None, Any]:
    """(plain, temperature, top_k, top_p): a concrete temperature 0 (greedy) means the model's own
    distribution; a concrete top_p of 1 or more filters nothing. Traced values pass through."""
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ConfigError(f"top_k must be a Python int >= 1 or None, got {top_k!r}.")
    if isinstance(temperature, (int, float, np.number)) and temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    if isinstance(top_p, (int, float, np.number)):
        if not 0 < top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] or None, got {top_p}.")
        top_p = None if top_p >= 1 else top_p
    plain = _is_zero(temperature) or (isinstance(temperature, (int, float, np.number)) and temperature == 1
                                       and top_k is None and top_p is None)
    return plain, temperature, top_k, top_p


def _suppress(logits: jax.Array, suppress: tuple[int, ...]) -> jax.Array:
    """Float32 logits with the `suppress` token ids at -inf (never sampled, as transformers'
    suppress_tokens); the distribution renormalises over the rest."""
    logits = logits.astype(jnp.float32)
    if not suppress:
        return logits
    return logits.at[..., jnp.asarray(suppress, jnp.int32)].set(-jnp.inf)


def _suppress_tuple(suppress_tokens: Any) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(t) for t in (suppress_tokens or ())}))
    except (TypeError, ValueError):
        raise ConfigError(f"suppress_tokens must be a sequence of token ids, got {suppress_tokens!r}.") from None


def _log_dist(logits: jax.Array, plain: bool, temperature: Any, top_k: int | None, top_p: Any,
              suppress: tuple[int, ...] = ()) -> jax.Array:
    logits = _suppress(logits, suppress)
    if plain:
        return jax.nn.log_softmax(logits, axis=-1)
    return filter_logits(logits, temperature, top_k, top_p)


def _call(lm: Any, params: Any, ids: jax.Array, mask: jax.Array, lora: Any, **kw: Any) -> tuple[jax.Array, Any]:
    if lora is not None:
        kw["lora"] = lora
    return lm.forward(params, ids, mask, **kw)


def _split(lm: Any) -> bool:
    """Whether the model exposes its trunk and head apart (`hidden_and_cache`, `head`), as
    LanguageModel does; otherwise only `forward`'s full logits are used."""
    return hasattr(lm, "hidden_and_cache") and hasattr(lm, "head")


def _last_logits(lm: Any, params: Any, ids: jax.Array, mask: jax.Array, lora: Any, **kw: Any
                 ) -> tuple[jax.Array, Any, jax.Array | None]:
    """Logits [B, V] of the last position only, the new cache, and that position's hidden [B, H]."""
    if _split(lm):
        if lora is not None:
            kw["lora"] = lora
        hidden, cache = lm.hidden_and_cache(params, ids, mask, **kw)
        return lm.head(params, hidden[:, -1]), cache, hidden[:, -1]
    logits, cache = _call(lm, params, ids, mask, lora, **kw)
    return logits[:, -1], cache, None


# ----------------------------------------------------------------------------- sampling core


def sample_tokens(lm: Any, params: Any, input_ids: jax.Array, attention_mask: jax.Array, key: jax.Array, *,
                  max_new_tokens: int, temperature: jax.Array | float = 1.0, top_k: int | None = None,
                  top_p: jax.Array | float | None = None, eos_ids: int | Sequence[int] = (), pad_token_id: int = 0,
                  lora: Any = None, greedy: bool | jax.Array = False, return_hidden: bool = False,
                  suppress_tokens: Sequence[int] = (), group: int = 1, first_tokens: jax.Array | None = None,
                  return_runner_up: bool = False) -> GenerateOutput:
    """The pure sampling program that `generate` wraps: traceable inside jit, vmap and scan.

    input_ids / attention_mask [B, T] are left-padded (no bucketing or host checks here; use
    `generate` for that). `temperature` and `top_p` may be traced arrays (top_p None = no nucleus);
    `max_new_tokens`, `top_k`, `eos_ids`, `pad_token_id`, `greedy` and `return_hidden` are static.
    `greedy=True` (or a concrete temperature 0) takes the argmax and reports the model's own
    log-probs. `greedy` may instead be a traced bool, scalar or [B]: the rows where it is true are
    greedy and the others sampled, in one pass of the model (a search that grows greedy and sampled
    steps side by side under vmap runs the model once, not once per kind).
    `suppress_tokens` are never sampled (their logits are -inf before everything else;
    token_logprobs takes the same argument). With `return_hidden=True`, `hidden` [B, N, H] is the
    final-norm hidden state at each generated token's position (the token fed through the model;
    one more forward than without; needs a model with `hidden_and_cache`/`head`, as LanguageModel).
    `group` (static) > 1 draws that many samples of each prompt row: the output has rows
    P x group, a prompt's samples adjacent, as from the prompts repeated `group` times; with a
    decoder's `KVCache` each prompt runs through the model once and its cache is shared (GRPO's
    groups), other models get the prompts repeated.
    `first_tokens` (traced int [B], optional): where >= 0, the first new token is that token instead of
    the sampled one, scored by the same distribution (its log-prob is what sampling it would have
    had); the rest follow as usual. `return_runner_up=True` (static) also returns, per position, the
    model's own second choice and its first-minus-second log-prob margin (`GenerateOutput`); with
    `first_tokens` a search builds a sibling of a step that differs where the model was least sure.
    """
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a Python int >= 1, got {max_new_tokens!r}.")
    if not isinstance(group, (int, np.integer)) or group < 1:
        raise ConfigError(f"group must be a Python int >= 1, got {group!r}.")
    if return_hidden and not _split(lm):
        raise ConfigError("return_hidden=True needs a model with hidden_and_cache() and head() "
                          "(jaxrl_hier.llm.LanguageModel).")
    input_ids = jnp.asarray(input_ids, jnp.int32)
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    group = int(group)
    prompts, prompt_len = input_ids.shape
    batch = prompts * group
    row_greedy = None  # [B] bool: per-row greedy, traced
    if isinstance(greedy, (bool, np.bool_)):
        greedy = bool(greedy) or _is_zero(temperature)
    else:
        row_greedy = jnp.broadcast_to(jnp.asarray(greedy, bool), (batch,))
        greedy = _is_zero(temperature)
    plain, temperature, top_k, top_p = _settings(1.0 if greedy else temperature, top_k, top_p)
    eos = _eos_tuple(eos_ids)
    suppress = _suppress_tuple(suppress_tokens)
    n = int(max_new_tokens)
    cache = lm.init_cache(prompts, prompt_len + n)
    if group > 1 and not isinstance(cache, KVCache):  # no known batch axis to share a prompt's cache along
        input_ids, attention_mask = (jnp.repeat(a, group, axis=0) for a in (input_ids, attention_mask))
        prompts, group = batch, 1
        cache = lm.init_cache(prompts, prompt_len + n)
    cache_mask = jnp.concatenate([attention_mask, jnp.zeros((prompts, n), jnp.int32)], axis=1)
    last, cache, _ = _last_logits(lm, params, input_ids, cache_mask, lora, positions=default_positions(attention_mask),
                                  cache=cache, cache_index=0)
    if group > 1:  # each prompt's logits, cache and mask for each of its samples
        last, cache_mask, attention_mask = (jnp.repeat(a, group, axis=0) for a in (last, cache_mask, attention_mask))
        cache = KVCache(*(jnp.repeat(a, group, axis=1) for a in cache))  # [L, B, kv_heads, S, D]
    eos_arr = jnp.asarray(eos if eos else (-1,), jnp.int32)
    if hasattr(lm, "decode_layout"):  # the prompt ran through the layer scan; the decode loop may run unrolled
        params, lora, cache = lm.decode_layout(params, lora, cache)

    def pick(last, done, sub, force=None):
        """Sample (or argmax) one token per row from the last logits (or take `force` where >= 0);
        finished rows emit padding."""
        # the model's own distribution: greedy rows pick and score by it, and it ranks the runner-up
        own = None
        if greedy or row_greedy is not None or return_runner_up:
            own = _log_dist(last, True, 1.0, None, None, suppress)
        if greedy:
            logp_dist = own
            token = jnp.argmax(own, axis=-1).astype(jnp.int32)
        else:
            logp_dist = _log_dist(last, plain, temperature, top_k, top_p, suppress)
            token = jax.random.categorical(sub, logp_dist, axis=-1).astype(jnp.int32)
            if row_greedy is not None:  # those rows: the argmax, scored by the model's own distribution
                token = jnp.where(row_greedy, jnp.argmax(own, axis=-1).astype(jnp.int32), token)
                logp_dist = jnp.where(row_greedy[:, None], own, logp_dist)
        if force is not None:
            token = jnp.where(force >= 0, force, token)
        logp = jnp.take_along_axis(logp_dist, token[:, None], axis=-1)[:, 0]
        live = ~done
        token = jnp.where(live, token, pad_token_id)
        done = done | (live & jnp.isin(token, eos_arr))
        out = (token, jnp.where(live, logp, 0.0), live.astype(jnp.int32))
        if return_runner_up:
            top, top_ids = jax.lax.top_k(own, 2)
            out = (*out, top_ids[:, 1].astype(jnp.int32), top[:, 0] - top[:, 1])
        return out, done

    def step(carry, xs):
        # sample token i, then run it through the model to get the logits for token i + 1
        sub, force = xs
        cache, cache_mask, last, done, pos, slot = carry
        out, done = pick(last, done, sub, force)
        cache_mask = jax.lax.dynamic_update_slice_in_dim(cache_mask, jnp.ones((batch, 1), jnp.int32), slot, axis=1)
        logits, cache, hidden = _last_logits(lm, params, out[0][:, None], cache_mask, lora, positions=pos[:, None],
                                             cache=cache, cache_index=slot)
        return (cache, cache_mask, logits, done, pos + 1, slot + 1), (*out, hidden) if return_hidden else out

    keys = jax.random.split(key, n)
    forced = None  # [n, B]: the forced token at each step (only the first may be >= 0)
    if first_tokens is not None:
        first = jnp.broadcast_to(jnp.asarray(first_tokens, jnp.int32), (batch,))
        forced = jnp.concatenate([first[None], jnp.full((n - 1, batch), -1, jnp.int32)])
    init = (cache, cache_mask, last, jnp.zeros((batch,), bool), jnp.sum(attention_mask, axis=-1).astype(jnp.int32),
            jnp.int32(prompt_len))
    if return_hidden:  # every token goes through the model, so each has its hidden state
        _, outs = jax.lax.scan(step, init, (keys, forced))
        outs = (*outs[:-1], jnp.swapaxes(outs[-1], 0, 1))
    else:  # the last token needs no forward pass: scan n - 1 steps, then sample once more
        carry, outs = jax.lax.scan(step, init, (keys[:-1], None if forced is None else forced[:-1]))
        final, _ = pick(carry[2], carry[3], keys[-1], None if forced is None else forced[-1])
        outs = [jnp.concatenate([o, f[None]], axis=0) for o, f in zip(outs, final)]
    tokens, logps, masks = (o.T for o in outs[:3])
    hidden = outs[-1] if return_hidden else None
    runner_up, margin = (o.T for o in outs[3:5]) if return_runner_up else (None, None)
    return GenerateOutput(tokens, logps, masks, hidden, runner_up, margin)


# ----------------------------------------------------------------------------- generate


_GENERATE = JitCache()  # one jitted generate per (model object, static settings); jit caches shapes


def _compiled(lm: Any, statics: tuple) -> Any:
    max_new_tokens, greedy, top_k, eos, pad = statics

    def build():
        def fn(params, ids, mask, rng, temperature, top_p, lora):
            return sample_tokens(lm, params, ids, mask, rng, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_k=top_k, top_p=top_p, eos_ids=eos, pad_token_id=pad, lora=lora, greedy=greedy)

        return fn

    return _GENERATE.get(lm, statics, build)


def compiled_programs() -> int:
    """How many generate programs XLA has compiled in this process (for recompilation checks)."""
    return _GENERATE.compiled()


def clear_compiled() -> None:
    """Drop the compiled generate programs (and the model objects they keep alive)."""
    _GENERATE.clear()


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

DEFAULT_CHUNK_SIZE = 128
#: the most [rows, positions, vocab] logits one chunk may hold: 2**26 float32 values (256 MiB). A chunk of
#: `chunk_size` positions over the whole batch that would hold more is split over rows as well (at batch 64
#: and a 152k vocabulary one 128-position chunk is 1.2e9 values, 5 GB).
MAX_CHUNK_LOGITS = 2**26


def chunk_rows(batch: int, positions: int, vocab_size: int) -> int:
    """Rows of a [rows, positions, vocab] logit chunk as `token_logprobs` scores them: the whole batch
    unless that would pass MAX_CHUNK_LOGITS values (the memory planner counts the same)."""
    return max(1, min(int(batch), MAX_CHUNK_LOGITS // (int(positions) * int(vocab_size))))


def _check_chunk_size(chunk_size: Any) -> None:
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a Python int >= 1, got {chunk_size!r}.")


def _chunked_scores(lm: Any, params: Any, hidden: jax.Array, targets: jax.Array, plain: bool, temperature: Any,
                    top_k: int | None, top_p: Any, suppress: tuple[int, ...], chunk_size: int, want_entropy: bool
                    ) -> tuple[jax.Array, jax.Array | None]:
    """Log-prob of each target and entropy per position from hidden [B, N, H], `chunk_size`
    positions at a time: only one chunk's [rows, chunk, V] float32 logits exist at once, and the
    backward pass recomputes them chunk by chunk (jax.checkpoint). A chunk covers every row unless
    that would exceed MAX_CHUNK_LOGITS values; then the rows are split into blocks too."""
    b, n, h = hidden.shape
    if n == 0:  # a one-token sequence has nothing to score
        empty = jnp.zeros((b, 0), jnp.float32)
        return empty, (empty if want_entropy else None)
    chunk = min(int(chunk_size), n)
    rows = chunk_rows(b, chunk, lm.config.vocab_size)
    if rows < b:
        return _row_blocks(lm, params, hidden, targets, plain, temperature, top_k, top_p, suppress, chunk, rows,
                           want_entropy)
    pad = -n % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    chunks = (n + pad) // chunk
    hs = hidden.reshape(b, chunks, chunk, h).swapaxes(0, 1)
    ts = targets.reshape(b, chunks, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def score(params, temperature, top_p, h_c, t_c):
        logp = _log_dist(lm.head(params, h_c), plain, temperature, top_k, top_p, suppress)
        picked = jnp.take_along_axis(logp, t_c[..., None], axis=-1)[..., 0]
        return picked, (_entropy(logp) if want_entropy else None)

    picked, entropy = jax.lax.map(lambda xs: score(params, temperature, top_p, *xs), (hs, ts))
    unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n + pad)[:, :n]  # noqa: E731
    return unchunk(picked), (unchunk(entropy) if want_entropy else None)


def _row_blocks(lm: Any, params: Any, hidden: jax.Array, targets: jax.Array, plain: bool, temperature: Any,
                top_k: int | None, top_p: Any, suppress: tuple[int, ...], chunk: int, rows: int, want_entropy: bool
                ) -> tuple[jax.Array, jax.Array | None]:
    """`_chunked_scores` over blocks of `rows` rows, one block after another (the batch padded to a
    multiple of `rows`): each block's chunks hold at most MAX_CHUNK_LOGITS logits."""
    b, n, h = hidden.shape
    pad = -b % rows
    hidden = jnp.pad(hidden, ((0, pad), (0, 0), (0, 0))).reshape(-1, rows, n, h)
    targets = jnp.pad(targets, ((0, pad), (0, 0))).reshape(-1, rows, n)

    def block(xs):
        return _chunked_scores(lm, params, xs[0], xs[1], plain, temperature, top_k, top_p, suppress, chunk,
                               want_entropy)

    picked, entropy = jax.lax.map(block, (hidden, targets))
    merge = lambda x: x.reshape(b + pad, n)[:b]  # noqa: E731
    return merge(picked), (merge(entropy) if want_entropy else None)


def _token_logprobs_impl(lm: Any, params: Any, input_ids: jax.Array, attention_mask: jax.Array, lora: Any,
                         plain: bool, temperature: Any, top_k: int | None, top_p: Any, suppress: tuple[int, ...],
                         chunk_size: int, want_entropy: bool) -> tuple[jax.Array, jax.Array | None]:
    positions = default_positions(attention_mask)
    if _split(lm):
        kw = {} if lora is None else {"lora": lora}
        hidden, _ = lm.hidden_and_cache(params, input_ids, attention_mask, positions=positions, **kw)
        picked, entropy = _chunked_scores(lm, params, hidden[:, :-1], input_ids[:, 1:], plain, temperature, top_k,
                                          top_p, suppress, chunk_size, want_entropy)
    else:  # a model with only `forward`: full logits
        logits, _ = _call(lm, params, input_ids, attention_mask, lora, positions=positions)
        logp = _log_dist(logits[:, :-1], plain, temperature, top_k, top_p, suppress)
        picked = jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]
        entropy = _entropy(logp) if want_entropy else None
    # Entry j is a real prediction only when both its context token j and its target j+1 are real
    # (the first real token of a left-padded row has no real context). `where`, not a product: a
    # target outside the top-k/top-p set scores -inf, and -inf * 0 is NaN.
    valid = (attention_mask[:, :-1] > 0) & (attention_mask[:, 1:] > 0)
    return jnp.where(valid, picked, 0.0), (None if entropy is None else jnp.where(valid, entropy, 0.0))


def token_logprobs(lm: Any, params: Any, input_ids: Any, attention_mask: Any, lora: Any = None, *,
                   temperature: jax.Array | float = 1.0, top_k: int | None = None,
                   top_p: jax.Array | float | None = None, suppress_tokens: Sequence[int] = (),
                   chunk_size: int = DEFAULT_CHUNK_SIZE, return_entropy: bool = False
                   ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Teacher-forced log p(x_t | x_<t) for t = 1..T-1: shape [B, T-1] (+ entropy [B, T-1]).

    Entry j scores token input_ids[:, j + 1]; it is 0 unless tokens j and j + 1 both have
    attention_mask 1 (so a left-padded row's first real token, which has no context, scores 0).
    Left-padded rows are fine (positions follow the mask).

    The distribution is the sampler's: logits / temperature, then top_k, then top_p, renormalised
    (the defaults, temperature 1 and no filtering, are the model's own; a concrete temperature 0
    means greedy, whose sampler log-probs are also the model's own). So for the params that
    sampled, these equal `GenerateOutput.logprobs` at the completion positions: the importance
    ratio starts at exactly 1 (pass the sampler's `suppress_tokens` too). A target outside the
    top-k/top-p set, or suppressed, scores -inf. `temperature` and
    `top_p` may be traced. `return_entropy=True` adds the entropy of that distribution per position
    (0 where the entry is 0).

    The vocabulary projection runs over `chunk_size` positions at a time (rematerialised in the
    backward pass), so [B, T, V] float32 logits never exist at once; where one chunk over the whole
    batch would pass MAX_CHUNK_LOGITS values, over blocks of rows as well. Differentiable in params and
    lora; call it inside your own jit (it is traced, not jitted here).
    """
    _check_chunk_size(chunk_size)
    plain, temperature, top_k, top_p = _settings(temperature, top_k, top_p)
    ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.asarray(attention_mask, jnp.int32)
    logp, entropy = _token_logprobs_impl(lm, params, ids, mask, lora, plain, temperature, top_k, top_p,
                                         _suppress_tuple(suppress_tokens), int(chunk_size), bool(return_entropy))
    return (logp, entropy) if return_entropy else logp


def shared_prefix_logprobs(lm: Any, params: Any, prefix_ids: Any, prefix_mask: Any, tokens: Any, mask: Any,
                           lora: Any = None, *, group: int, temperature: jax.Array | float = 1.0,
                           top_k: int | None = None, top_p: jax.Array | float | None = None,
                           suppress_tokens: Sequence[int] = (), chunk_size: int = DEFAULT_CHUNK_SIZE,
                           return_entropy: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Log-probs [P * group, N] of `group` continuations `tokens` of each prefix, each prefix run once.

    The same numbers as `token_logprobs` on concat(repeat(prefix, group), tokens) restricted to the
    continuation (entry j scores tokens[:, j]; 0 unless tokens j - 1 and j, or the prefix's last token
    for j = 0, have mask 1), with the model's `shared_prefix_hidden` (a LanguageModel) computing each
    prefix once and sharing its keys and values with its group: for GRPO's G completions of a prompt
    the prompt's share of the forward and backward passes shrinks G-fold."""
    _check_chunk_size(chunk_size)
    if not hasattr(lm, "shared_prefix_hidden"):
        raise ConfigError("shared_prefix_logprobs needs a model with shared_prefix_hidden() (jaxrl_hier.llm.LanguageModel).")
    plain, temperature, top_k, top_p = _settings(temperature, top_k, top_p)
    prefix_mask, mask = jnp.asarray(prefix_mask, jnp.int32), jnp.asarray(mask, jnp.int32)
    tokens = jnp.asarray(tokens, jnp.int32)
    kw = {} if lora is None else {"lora": lora}
    hp, hc = lm.shared_prefix_hidden(params, jnp.asarray(prefix_ids, jnp.int32), prefix_mask, tokens, mask,
                                     group=group, **kw)
    # token j is predicted from the position before it: the prefix's last one for j = 0
    context = jnp.concatenate([jnp.repeat(hp[:, -1:], group, axis=0), hc[:, :-1]], axis=1)
    picked, entropy = _chunked_scores(lm, params, context, tokens, plain, temperature, top_k, top_p,
                                      _suppress_tuple(suppress_tokens), int(chunk_size), bool(return_entropy))
    context_mask = jnp.concatenate([jnp.repeat(prefix_mask[:, -1:], group, axis=0), mask[:, :-1]], axis=1)
    valid = (context_mask > 0) & (mask > 0)
    logp = jnp.where(valid, picked, 0.0)
    return (logp, jnp.where(valid, entropy, 0.0)) if return_entropy else logp


__all__ = ["GenerateOutput", "generate", "sample_tokens", "token_logprobs", "shared_prefix_logprobs",
           "bucket_length", "left_pad", "filter_logits", "compiled_programs", "clear_compiled",
           "chunk_rows", "MAX_CHUNK_LOGITS"]
