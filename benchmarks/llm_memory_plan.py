"""The memory planner's activation estimate against XLA's own figure for the real training step.

For each shape, the step is `jax.value_and_grad` of a token-level loss over
`jaxrl_hier.llm.token_logprobs` (LoRA adapters trained on a frozen backbone, or all weights), as
`jaxrl_hier.llm.memory.compiled_step_memory` builds it. It is lowered and compiled with
ShapeDtypeStruct arguments (nothing runs, nothing is allocated), and XLA's
`compiled.memory_analysis().temp_size_in_bytes` (the step's scratch beyond arguments and outputs:
the activations kept for the backward pass) stands beside `memory.activation_bytes` for the same
ModelSpec. Small shapes vary one size at a time; the Llama-3.2-3B-shaped step of the guidance-agent
case is compiled too (micro-batches 4 and 8, float32 and bfloat16), and RoBERTa critic steps (all
weights trained, a value head at the first token).

XLA:CPU computes bfloat16 arithmetic in float32 and keeps float32 copies, so its bfloat16 figures
overstate what a GPU keeps; the float32 rows are the like-for-like comparison.

Writes <out>/llm_memory_plan.json (the records and the two tables of `python -m
jaxrl_hier.llm.memory`) and <out>/llm_memory_plan.png (estimate against XLA).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import time
from pathlib import Path
from typing import Any

from jaxrl_hier.bench import device_info
from jaxrl_hier.io import atomic_write_bytes, atomic_write_json
from jaxrl_hier.llm import memory
from jaxrl_hier.llm.model_config import ModelConfig

ALL7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def small(hidden: int = 64, inter: int = 128, layers: int = 2, heads: int = 4, kv: int = 2, vocab: int = 512,
          model_type: str = "llama") -> ModelConfig:
    """A tiny Llama-family decoder (qwen3 adds q/k norms)."""
    return ModelConfig(model_type=model_type, family="llama", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=inter, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                       head_dim=hidden // heads, max_position_embeddings=4096, tie_word_embeddings=True,
                       qk_norm=model_type == "qwen3")


# (name, config, batch, seq, dtype, lora rank (0 = full training), targets)
SMALL_CASES = [
    ("base", small(), 4, 64, "float32", 8, QKVO),
    ("layers x2", small(layers=4), 4, 64, "float32", 8, QKVO),
    ("batch x2", small(), 8, 64, "float32", 8, QKVO),
    ("seq x2", small(), 4, 128, "float32", 8, QKVO),
    ("hidden x2", small(hidden=128, inter=256), 4, 64, "float32", 8, QKVO),
    ("heads x2", small(heads=8), 4, 64, "float32", 8, QKVO),
    ("vocab x8", small(vocab=4096), 4, 64, "float32", 8, QKVO),
    ("qwen3 q/k norm", small(model_type="qwen3"), 4, 64, "float32", 8, QKVO),
    ("lora all 7", small(), 4, 64, "float32", 8, ALL7),
    ("full training", small(), 4, 64, "float32", 0, QKVO),
    ("base bfloat16", small(), 4, 64, "bfloat16", 8, QKVO),
    ("roberta tiny (full)", ModelConfig(model_type="roberta", family="roberta", vocab_size=512, hidden_size=64,
                                        intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
                                        max_position_embeddings=130, norm="layer", activation="gelu",
                                        gated_mlp=False, rope=False, qkv_bias=True, o_bias=True, mlp_bias=True,
                                        tie_word_embeddings=True, pad_token_id=1, type_vocab_size=1),
     4, 64, "float32", 0, QKVO),
]


def big_cases() -> list[tuple]:
    llm = memory.llama_3_2_3b()
    return ([(f"llama-3.2-3b B={b} {dt}", llm, b, 512, dt, 16, ALL7) for b in (4, 8) for dt in ("float32", "bfloat16")]
            + [("roberta-base B=8 float32 (full)", memory.roberta_base(), 8, 512, "float32", 0, QKVO)])


def measure(name: str, config: ModelConfig, batch: int, seq: int, dtype: str, rank: int,
            targets: tuple[str, ...]) -> dict[str, Any]:
    spec = memory.ModelSpec(name, config, dtype=dtype, train="lora" if rank else "full", lora_rank=rank,
                            lora_targets=targets, batch=batch, seq_len=seq,
                            head=None if config.is_decoder else "value")
    estimate = memory.plan([spec]).models[0].activations
    t0 = time.perf_counter()
    xla = memory.compiled_step_memory(config, batch, seq, dtype, lora_rank=rank, lora_targets=targets)
    rec = dict(name=name, layers=config.num_layers, hidden=config.hidden_size, intermediate=config.intermediate_size,
               heads=config.num_heads, kv_heads=config.num_kv_heads, vocab=config.vocab_size, batch=batch, seq=seq,
               dtype=dtype, lora_rank=rank, lora_targets=list(targets), estimate_bytes=estimate, **xla,
               ratio_estimate_over_xla=estimate / xla["temp_bytes"], compile_s=time.perf_counter() - t0)
    print(f"{name:<28} estimate {estimate / 2**20:11,.1f} MiB   XLA temp {xla['temp_bytes'] / 2**20:11,.1f} MiB   "
          f"ratio {rec['ratio_estimate_over_xla']:.2f}", flush=True)
    return rec


def plan_rows(p: memory.MemoryPlan) -> dict[str, Any]:
    return {"title": p.title, "capacity_bytes": p.capacity_bytes, "peak_bytes": p.peak, "sum_bytes": p.total,
            "peak_phase": p.peak_phase, "fits": p.fits,
            "rows": [dataclasses.asdict(m) | {"total": m.total} for m in p.models]}


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for dtype, marker in (("float32", "o"), ("bfloat16", "s")):
        rs = [r for r in records if r["dtype"] == dtype]
        ax.scatter([r["temp_bytes"] / 2**20 for r in rs], [r["estimate_bytes"] / 2**20 for r in rs], marker=marker,
                   label=f"{dtype} (XLA:CPU)")
    lo = min(min(r["temp_bytes"], r["estimate_bytes"]) for r in records) / 2**20 / 1.5
    hi = max(max(r["temp_bytes"], r["estimate_bytes"]) for r in records) / 2**20 * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="estimate = XLA")
    ax.set(xscale="log", yscale="log", xlabel="XLA temp bytes of the compiled step (MiB)",
           ylabel="planner activation estimate (MiB)", title="activation estimate vs compiled step")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-big", action="store_true", help="leave out the Llama-3.2-3B-shaped compiles")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    args = ap.parse_args()
    cases = SMALL_CASES + ([] if args.skip_big else big_cases())
    records = [measure(*case) for case in cases]
    naive, ours = memory.original_plans()
    print(naive.table(), "\n")
    print(ours.table())
    f32 = [r["ratio_estimate_over_xla"] for r in records if r["dtype"] == "float32"]
    result = {"benchmark": "llm_memory_plan", **device_info(), "records": records,
              "float32_ratio_min": min(f32), "float32_ratio_max": max(f32),
              "tables": {"naive": plan_rows(naive), "ours": plan_rows(ours)}}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "llm_memory_plan.json", result)
    plot(records, args.out / "llm_memory_plan.png")
    print(f"float32 estimate / XLA: {min(f32):.2f} .. {max(f32):.2f}; wrote {args.out / 'llm_memory_plan.json'}")


if __name__ == "__main__":
    main()
