"""Peak memory of teacher-forced scoring with its gradient: full [B, T, V] logits vs chunked.

Both programs are `jax.value_and_grad` of the sum of the log-probs of a [B, T] batch under a
random tiny-width decoder with a large vocabulary (where the logits dominate memory):
* full: the old way, forward -> [B, T, V] float32 logits -> log_softmax -> gather;
* chunked: `jaxrl_hier.llm.token_logprobs` (the vocabulary projection, log_softmax and gather per
  `chunk_size` positions, rematerialised in the backward pass; a chunk whose [rows, positions, V]
  logits would pass `sampling.MAX_CHUNK_LOGITS` is split over rows too);
* chunked_all_rows: the same with that row split turned off (every chunk over the whole batch, as
  before it existed).
Nothing runs: each program is lowered and compiled, and XLA's `compiled.memory_analysis()` gives
the bytes (temp = XLA's scratch buffers, the peak working set beyond arguments and outputs).

Writes <out>/llm_memory_rl.json (and prints a table).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.bench import device_info
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.llm import LanguageModel, sampling
from jaxrl_hier.llm.sampling import token_logprobs

FIELDS = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "generated_code_size_in_bytes")


def full_logits_logprobs(lm: LanguageModel, params, ids, mask):
    """The pre-chunking scorer: all [B, T - 1, V] float32 log-probs at once."""
    logits, _ = lm.forward(params, ids, mask)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    return picked * (mask[:, :-1] * mask[:, 1:])


def analyse(fn, *args) -> dict:
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    stats = compiled.memory_analysis()
    out = {f: int(getattr(stats, f)) for f in FIELDS if hasattr(stats, f)}
    out["compile_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--chunk-size", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/results/cpu")
    ap.add_argument("--name", default="llm_memory_rl", help="the JSON's file name (without .json)")
    args = ap.parse_args()
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                   num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=args.seq, tie_word_embeddings=True)
    lm = LanguageModel.random(cfg, jax.random.key(0))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq)), jnp.int32)
    mask = jnp.ones_like(ids)

    def loss_full(params):
        return jnp.sum(full_logits_logprobs(lm, params, ids, mask))

    def loss_chunked(params):
        return jnp.sum(token_logprobs(lm, params, ids, mask, chunk_size=args.chunk_size))

    records = {"full": analyse(jax.value_and_grad(loss_full), lm.params),
               "chunked": analyse(jax.value_and_grad(loss_chunked), lm.params)}
    budget, sampling.MAX_CHUNK_LOGITS = sampling.MAX_CHUNK_LOGITS, 2**62  # the row split off, for comparison
    try:
        records["chunked_all_rows"] = analyse(jax.value_and_grad(loss_chunked), lm.params)
    finally:
        sampling.MAX_CHUNK_LOGITS = budget
    logits_bytes = args.batch * (args.seq - 1) * args.vocab * 4
    print(f"B={args.batch} T={args.seq} V={args.vocab} H={args.hidden} chunk={args.chunk_size}; "
          f"one [B, T-1, V] float32 array = {logits_bytes / 2**20:,.0f} MiB")
    for name, r in records.items():
        print(f"{name:>16}: temp {r['temp_size_in_bytes'] / 2**20:9,.1f} MiB   args "
              f"{r['argument_size_in_bytes'] / 2**20:7,.1f} MiB   out {r['output_size_in_bytes'] / 2**20:7,.1f} MiB")
    ratio = records["full"]["temp_size_in_bytes"] / max(records["chunked"]["temp_size_in_bytes"], 1)
    print(f"temp ratio full / chunked: {ratio:.1f}x")
    result = {"benchmark": "llm_memory_rl", **device_info(), "batch": args.batch, "seq": args.seq,
              "vocab": args.vocab, "hidden": args.hidden, "layers": args.layers, "chunk_size": args.chunk_size,
              "num_params": lm.num_params(), "logits_bytes": logits_bytes, "records": records,
              "max_chunk_logits": sampling.MAX_CHUNK_LOGITS, "temp_ratio_full_over_chunked": ratio}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"{args.name}.json", result)
    print(f"wrote {out / (args.name + '.json')}")


if __name__ == "__main__":
    main()
