"""Decode speed of `jaxrl_hier.llm.generate` on the GRPO comparison shape (CPU-sized).

The model is the 2.97M-parameter Qwen2-shaped decoder of the GRPO comparison (hidden 256, 4 layers,
4 heads, 2 KV heads, intermediate 704, tied embeddings, vocab 56, float32, random weights, no
download). 32 rows (8 prompts x 4 generations) of 16-token prompts, 32 new tokens. Each setting is
timed as the best of `--repeats` steady calls (blocking on the result) after one compile call; the
compile time is reported apart. Besides wall time, the process CPU time of each call (all threads;
best of the repeats) is kept: on a shared machine it moves far less with other processes' load than
wall time does. Settings: plain sampling (temperature 1), nucleus (temperature 0.7, top_p 0.95) and
greedy. `PYTHONPATH=<an older checkout> python benchmarks/llm_decode_profile.py` measures another
version of the package with the same script (only `generate` is used).

Writes <out>/llm_decode_profile.json (<out>/llm_decode_profile_<label>.json with --label).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_hier.bench import device_info
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.llm import LanguageModel, sampling

SHAPE = dict(vocab_size=56, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
SETTINGS = {"temperature_1": dict(temperature=1.0), "t0.7_top_p0.95": dict(temperature=0.7, top_p=0.95),
            "greedy": dict(temperature=0.0)}


def build(seed: int = 0) -> LanguageModel:
    import transformers

    return LanguageModel.random(transformers.Qwen2Config(**SHAPE), jax.random.key(seed))


def time_generate(lm: LanguageModel, ids: np.ndarray, mask: np.ndarray, new_tokens: int, repeats: int,
                  **kw) -> tuple[float, float, float]:
    """(first call seconds, best steady wall seconds, best steady CPU seconds) of generate."""
    def call(seed):
        return jax.block_until_ready(sampling.generate(lm, lm.params, ids, mask, key=jax.random.key(seed),
                                                       max_new_tokens=new_tokens, **kw))
    t0 = time.perf_counter()
    call(0)
    first = time.perf_counter() - t0
    best = best_cpu = math.inf
    for r in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        call(r + 1)
        best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
    return first, best, best_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--label", default="", help="names the result file llm_decode_profile_<label>.json")
    ap.add_argument("--out", default="benchmarks/results/cpu")
    args = ap.parse_args()
    lm = build()
    rng = np.random.default_rng(0)
    ids = rng.integers(1, SHAPE["vocab_size"], (args.batch, args.prompt)).astype(np.int32)
    mask = np.ones_like(ids)
    records = {}
    for name, kw in SETTINGS.items():
        first, best, cpu = time_generate(lm, ids, mask, args.new_tokens, args.repeats, **kw)
        records[name] = {"steady_s": best, "steady_cpu_s": cpu, "compile_and_first_s": first,
                         "decode_tokens_per_s": args.batch * args.new_tokens / best}
        print(f"{name:>16}: {best * 1e3:7.1f} ms steady wall, {cpu * 1e3:7.1f} ms CPU ({first:.2f} s first call), "
              f"{records[name]['decode_tokens_per_s']:,.0f} tokens/s")
    import jaxrl_hier

    result = {"benchmark": "llm_decode_profile", "label": args.label, "package": jaxrl_hier.__file__,
              "load_average": list(os.getloadavg()), **device_info(),
              "shape": SHAPE, "num_params": lm.num_params(), "batch": args.batch, "prompt": args.prompt,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"llm_decode_profile_{args.label}.json" if args.label else "llm_decode_profile.json")
    atomic_write_json(path, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
