"""Decode speed of `jaxrl_hier.llm.generate` on the GRPO comparison shape (CPU-sized).

The model is the 2.97M-parameter Qwen2-shaped decoder of the GRPO comparison (hidden 256, 4 layers,
4 heads, 2 KV heads, intermediate 704, tied embeddings, vocab 56, float32, random weights, no
download). 32 rows (8 prompts x 4 generations) of 16-token prompts, 32 new tokens. Each setting is
timed as the best of `--repeats` steady calls (blocking on the result) after one compile call; the
compile time is reported apart. Besides wall time, the process CPU time of each call (all threads;
best of the repeats) is kept: on a shared machine it moves far less with other processes' load than
wall time does. Settings: plain sampling (temperature 1), nucleus (temperature 0.7, top_p 0.95) and
greedy. `PYTHONPATH=<an older checkout> python benchmarks/llm/llm_decode_profile.py` measures another
version of the package with the same script (only `generate` is used).

Writes <out>/llm_decode_profile.json (<out>/llm_decode_profile_<label>.json with --label).

`--layouts` instead compares, side by side in one process (each call of each variant in turn,
`--repeats` rounds; median and min), how the decode loop runs on the GRPO step's shape (`--batch`
rows = `--batch / --group` prompts x `--group` samples, temperature 1): the layer scan over the
stacked weights and cache (`ModelConfig.unroll_decode: false`), the layers unrolled over per-layer
arrays (`true`, the default for this size), and unrolled with each prompt run once for its samples
(`sample_tokens(group=)`, as GRPO's `sample_groups` calls it), the last with the per-layer q|k|v and
gate|up kernels fused (the default, `decoder.fuse_projections`) and without. It checks that all give
the same tokens and writes <out>/llm_decode_layouts.json and .png.
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


class UnfusedLM(LanguageModel):
    """The unrolled decode layout with q, k, v, gate and up as separate kernels (`decode_layout(fuse=False)`)."""

    def decode_layout(self, params, lora, cache):
        from jaxrl_hier.llm import decoder

        return decoder.decode_layout(self.config, params, lora, cache, fuse=False)


def time_layouts(lm: LanguageModel, batch: int, group: int, prompt: int, new_tokens: int, repeats: int) -> dict:
    """Median / min wall seconds of the decode-loop layouts, called in turn (see the module doc)."""
    import dataclasses

    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, SHAPE["vocab_size"], (batch // group, prompt)), jnp.int32)
    mask = jnp.ones_like(ids)
    rep = lambda a: jnp.repeat(a, group, axis=0)  # noqa: E731
    scan_lm = LanguageModel(dataclasses.replace(lm.config, unroll_decode=False), lm.params)
    unrolled_lm = LanguageModel(dataclasses.replace(lm.config, unroll_decode=True), lm.params)
    unfused_lm = UnfusedLM(unrolled_lm.config, lm.params)
    variants = {"layer_scan": (scan_lm, rep(ids), rep(mask), 1), "unrolled": (unrolled_lm, rep(ids), rep(mask), 1),
                f"unrolled_group{group}_unfused": (unfused_lm, ids, mask, group),
                f"unrolled_group{group}": (unrolled_lm, ids, mask, group)}
    fns, first, tokens = {}, {}, {}
    for name, (model, i, m, g) in variants.items():
        fns[name] = jax.jit(lambda p, k, model=model, i=i, m=m, g=g: sampling.sample_tokens(
            model, p, i, m, k, max_new_tokens=new_tokens, temperature=1.0, group=g))
        t0 = time.perf_counter()
        tokens[name] = np.asarray(jax.block_until_ready(fns[name](lm.params, jax.random.key(0))).tokens)
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in fns}
    for r in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(lm.params, jax.random.key(r + 1)))
            times[name].append(time.perf_counter() - t0)
    ref = tokens["layer_scan"]
    return {name: {"median_s": float(np.median(t)), "min_s": float(min(t)), "compile_and_first_s": first[name],
                   "same_tokens_as_layer_scan": bool((tokens[name] == ref).all())} for name, t in times.items()}


def plot_layouts(records: dict, path: Path, title: str) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    names = list(records)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(names, [records[n]["median_s"] * 1e3 for n in names], color="tab:blue", label="median")
    ax.scatter(names, [records[n]["min_s"] * 1e3 for n in names], color="black", zorder=3, label="min")
    ax.set_ylabel("generate, ms")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--label", default="", help="names the result file llm_decode_profile_<label>.json")
    ap.add_argument("--out", default="benchmarks/results/cpu")
    ap.add_argument("--layouts", action="store_true", help="compare the decode loop's layouts (module doc)")
    ap.add_argument("--group", type=int, default=4, help="--layouts: samples per prompt")
    args = ap.parse_args()
    lm = build()
    if args.layouts:
        import jaxrl_hier

        if args.batch % args.group:
            raise SystemExit(f"--batch {args.batch} must be a multiple of --group {args.group}.")
        records = time_layouts(lm, args.batch, args.group, args.prompt, args.new_tokens, args.repeats)
        for name, r in records.items():
            print(f"{name:>16}: median {r['median_s'] * 1e3:6.1f} ms, min {r['min_s'] * 1e3:6.1f} ms "
                  f"(first call {r['compile_and_first_s']:.2f} s), same tokens: {r['same_tokens_as_layer_scan']}")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "llm_decode_layouts.json", {
            "benchmark": "llm_decode_layouts", "package": jaxrl_hier.__file__, "load_average": list(os.getloadavg()),
            **device_info(), "shape": SHAPE, "num_params": lm.num_params(), "batch": args.batch,
            "group": args.group, "prompt": args.prompt, "new_tokens": args.new_tokens, "repeats": args.repeats,
            "records": records})
        plot_layouts(records, out / "llm_decode_layouts.png",
                     f"{args.batch} rows x {args.new_tokens} new tokens, {args.prompt}-token prompts")
        print(f"wrote {out / 'llm_decode_layouts.json'}, .png")
        return
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
