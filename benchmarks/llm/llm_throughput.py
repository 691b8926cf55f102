"""LLM sampling throughput: prefill and decode tokens/s against batch size, with memory figures.

Random-weight decoder models (no download): `--preset small` (CPU-sized), `qwen2.5-0.5b` and
`qwen2.5-1.5b` (shaped like the Qwen2.5 checkpoints, bfloat16, for a GPU run).

Method, per batch size B (prompt length P, N new tokens, `jaxrl_hier.llm.generate`):
* t1 = steady time of generate(max_new_tokens=1) (the prefill forward and one sample), tN = with N
  tokens (N - 1 more decode forwards); prefill tokens/s = B * P / t1, decode = B * (N - 1) / (tN - t1).
* compile time = first call minus the steady time, reported apart. Every timing blocks on the result.
* decode at batch 1 as a fraction of the memory-bandwidth limit: every decode step reads all weights
  once, so the limit is bandwidth / param_bytes steps/s; fraction = param_bytes * tokens/s / bandwidth.
  `--bandwidth-gbs` (default 4800, an H200); on CPU, unless given, it is measured with a large copy.

`--unroll-decode on|off` forces how the decode loop runs the layers (`ModelConfig.unroll_decode`;
`auto`, the default, unrolls them when the layer weights take at most 1 GiB).

Writes <out>/llm_throughput.json (device, versions, compile_s, records) and llm_throughput.png.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.bench import UNROLL_DECODE
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.llm import decoder, memory, sampling

PRESETS: dict[str, dict[str, Any]] = {
    "small": dict(model_type="qwen2", vocab_size=4096, hidden_size=256, intermediate_size=768,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                  max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-6,
                  rope_theta=10000.0, hidden_act="silu", dtype="float32"),
    # from the published config.json of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, hidden_act="silu", dtype="bfloat16"),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, hidden_act="silu", dtype="bfloat16"),
}


class RandomLM(NamedTuple):
    """The generate contract over the module-level decoder functions."""

    config: Any
    dtype: Any

    def forward(self, params, input_ids, attention_mask, **kw):
        return decoder.forward(self.config, params, input_ids, attention_mask, **kw)

    def init_cache(self, batch: int, max_len: int, dtype: Any = None):
        return decoder.init_cache(self.config, batch, max_len, dtype or self.dtype)

    def decode_layout(self, params, lora, cache):
        """As LanguageModel's: per-layer arrays for the decode loop when `decoder.unrolls_decode`."""
        return decoder.decode_layout(self.config, params, lora, cache)


def build(preset: str, seed: int, unroll_decode: str = "auto") -> tuple[RandomLM, Any, dict[str, Any]]:
    """A random model shaped like `preset` (config from a hand-written dict, no download)."""
    import dataclasses

    import transformers

    fields = dict(PRESETS[preset])
    dtype = jnp.dtype(fields.pop("dtype"))
    hf = transformers.Qwen2Config(**{k: v for k, v in fields.items() if k != "model_type"})
    config = dataclasses.replace(decoder.ModelConfig.from_hf(hf), unroll_decode=UNROLL_DECODE[unroll_decode])
    params = decoder.init_params(config, jax.random.key(seed), dtype)
    return RandomLM(config, dtype), params, dict(PRESETS[preset])


def measure_bandwidth_gbs(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Host memory bandwidth from a large copy (read + write counted), best of `repeats`."""
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    best = min(_time(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * nbytes / best / 1e9


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _timed_generate(lm, params, ids, mask, new_tokens: int, repeats: int) -> tuple[float, float]:
    """(first-call seconds, best steady seconds) of generate, blocking on the tokens."""

    def call():
        out = sampling.generate(lm, params, ids, mask, key=jax.random.key(0), max_new_tokens=new_tokens,
                                temperature=1.0, top_k=50, min_bucket=ids.shape[1])
        jax.block_until_ready(out)

    first = _time(call)
    return first, min(_time(call) for _ in range(repeats))


def run(args: argparse.Namespace) -> dict[str, Any]:
    lm, params, hf_fields = build(args.preset, args.seed, args.unroll_decode)
    param_bytes = memory.tree_nbytes(params)
    unrolled = decoder.unrolls_decode(lm.config, params)
    print(f"decode loop: {'layers unrolled' if unrolled else 'layer scan'} (--unroll-decode {args.unroll_decode})")
    records = []
    for batch in args.batch_sizes:
        ids = np.random.default_rng(batch).integers(1, hf_fields["vocab_size"], (batch, args.prompt_len))
        mask = np.ones_like(ids)
        c1, t1 = _timed_generate(lm, params, ids, mask, 1, args.repeats)
        cn, tn = _timed_generate(lm, params, ids, mask, args.new_tokens, args.repeats)
        cache_bytes = memory.kv_cache_bytes(lm.config, batch, args.prompt_len + args.new_tokens, lm.dtype)
        records.append(dict(batch=batch, prefill_s=t1, generate_s=tn,
                            prefill_tokens_per_s=batch * args.prompt_len / t1,
                            decode_tokens_per_s=batch * (args.new_tokens - 1) / max(tn - t1, 1e-9),
                            compile_prefill_s=c1 - t1, compile_generate_s=cn - tn,
                            param_bytes=param_bytes, kv_cache_bytes=cache_bytes))
        print(f"batch {batch:4d}: prefill {records[-1]['prefill_tokens_per_s']:10.0f} tok/s, "
              f"decode {records[-1]['decode_tokens_per_s']:9.1f} tok/s, compile {cn - tn:.1f}s", flush=True)
    bw = args.bandwidth_gbs
    bw_source = "flag"
    if bw is None:
        bw, bw_source = (measure_bandwidth_gbs(), "measured host copy") if jax.default_backend() == "cpu" \
            else (4800.0, "default (H200)")
    b1 = next((r for r in records if r["batch"] == 1), None)
    frac = None if b1 is None else param_bytes * b1["decode_tokens_per_s"] / (bw * 1e9)
    import flax
    import transformers

    return dict(
        preset=args.preset, model=hf_fields, dtype=str(lm.dtype), prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, repeats=args.repeats, sampling="temperature 1.0, top_k 50",
        unroll_decode=args.unroll_decode, decode_layers_unrolled=unrolled,
        device=str(jax.devices()[0]), backend=jax.default_backend(), device_count=jax.device_count(),
        platform=platform.platform(), processor=platform.processor(),
        versions=dict(jax=jax.__version__, flax=flax.__version__, transformers=transformers.__version__,
                      numpy=np.__version__, python=platform.python_version()),
        param_bytes=param_bytes, bandwidth_gbs=bw, bandwidth_source=bw_source,
        decode_batch1_bandwidth_fraction=frac,
        compile_s={str(r["batch"]): r["compile_generate_s"] for r in records}, records=records)


def plot(result: dict[str, Any], path: Path) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    recs = result["records"]
    batches = [r["batch"] for r in recs]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(batches, [r["prefill_tokens_per_s"] for r in recs], "o-", label="prefill")
    ax[0].plot(batches, [r["decode_tokens_per_s"] for r in recs], "s-", label="decode")
    ax[0].set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens / s",
              title=f"{result['preset']} on {result['backend']}")
    ax[0].legend()
    ax[1].bar([str(b) for b in batches], [r["kv_cache_bytes"] / 2**20 for r in recs], label="KV cache")
    ax[1].axhline(result["param_bytes"] / 2**20, color="k", ls="--", label="parameters")
    ax[1].set(xlabel="batch size", ylabel="MiB", title="memory")
    ax[1].legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS), default="small")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="device memory bandwidth; default: 4800 (H200) on GPU, measured on CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unroll-decode", choices=list(UNROLL_DECODE), default="auto",
                        help="ModelConfig.unroll_decode: auto (by the layer weights' size), on or off")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    args = parser.parse_args()
    if args.new_tokens < 2 or args.prompt_len < 1 or min(args.batch_sizes) < 1:
        parser.error("need --new-tokens >= 2, --prompt-len >= 1 and positive batch sizes")
    result = run(args)
    atomic_write_json(args.out / "llm_throughput.json", result)
    plot(result, args.out / "llm_throughput.png")
    frac = result["decode_batch1_bandwidth_fraction"]
    if frac is not None:
        print(f"decode at batch 1: {100 * frac:.1f}% of the {result['bandwidth_gbs']:.0f} GB/s bandwidth limit "
              f"({result['bandwidth_source']})")
    print(f"wrote {args.out / 'llm_throughput.json'}")


if __name__ == "__main__":
    main()
