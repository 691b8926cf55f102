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

`--run` instead RUNS our layout (table (b)) on the default device with random weights
(`memory_case.measured_layout_peak`): the Llama-3.2-3B-shaped bfloat16 backbone, the actor's and the
guidance's LoRA adapters with their AdamW states, the float32 RoBERTa-base critic, its AdamW state
and target copy, and the KV cache are allocated and held; the actor step, the reference log-probs,
the guidance step, the critic step, the target's values and the Polyak update run one after the
other at the plan's micro-batches, and the allocator's bytes_in_use / peak_bytes_in_use after each
stand beside the plan's held bytes and peak. Writes <out>/llm_memory_run.json and prints plan vs
measured; the compile-only cases are left out unless `--compile-cases` is given. On a GPU, run it
with XLA_PYTHON_CLIENT_PREALLOCATE=false so the allocator's figures are the arrays' and the steps':

    JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/llm/llm_memory_plan.py --run --out DIR

`--tiny` runs the same with tiny models (a CPU check of the script; XLA:CPU has no allocator
statistics, so only the plan and the compiled programs' figures are filled in).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from jaxrl_hier.bench import device_info
from jaxrl_hier.io import atomic_write_json
from jaxrl_hier.llm import memory, memory_case
from jaxrl_hier.llm.model_config import ModelConfig
from jaxrl_hier.logging.plots import save_figure

ALL7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def small(hidden: int = 64, inter: int = 128, layers: int = 2, heads: int = 4, kv: int = 2, vocab: int = 512,
          model_type: str = "llama") -> ModelConfig:
    """A tiny Llama-family decoder (qwen3 adds q/k norms)."""
    return ModelConfig(model_type=model_type, family="llama", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=inter, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                       head_dim=hidden // heads, max_position_embeddings=4096, tie_word_embeddings=True,
                       qk_norm=model_type == "qwen3")


def tiny_roberta() -> ModelConfig:
    """A tiny RoBERTa encoder (130 positions: sequences up to 128 tokens)."""
    return ModelConfig(model_type="roberta", family="roberta", vocab_size=512, hidden_size=64, intermediate_size=256,
                       num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16, max_position_embeddings=130,
                       norm="layer", activation="gelu", gated_mlp=False, rope=False, qkv_bias=True, o_bias=True,
                       mlp_bias=True, tie_word_embeddings=True, pad_token_id=1, type_vocab_size=1)


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
    ("roberta tiny (full)", tiny_roberta(), 4, 64, "float32", 0, QKVO),
]


def big_cases() -> list[tuple]:
    llm = memory_case.llama_3_2_3b()
    return ([(f"llama-3.2-3b B={b} {dt}", llm, b, 512, dt, 16, ALL7) for b in (4, 8) for dt in ("float32", "bfloat16")]
            + [("roberta-base B=8 float32 (full)", memory_case.roberta_base(), 8, 512, "float32", 0, QKVO)])


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
    from jaxrl_hier.logging.plots import pyplot

    plt = pyplot()

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
    save_figure(fig, path, dpi=100)


def _size(n: int | None, unit: int) -> str:
    return "n/a" if n is None else f"{n / unit:,.3f}"


def run_table(result: dict[str, Any]) -> str:
    """Plan vs measured: held bytes, the largest transient, the peak, then one row per phase."""
    p = result["plan"]
    unit, name = (2**30, "GiB") if p["peak_bytes"] >= 2**30 // 10 else (2**20, "MiB")
    ratio = lambda r: "n/a" if r is None else f"{r:.3f}"  # noqa: E731
    held = result["held"]
    lines = [f"{'':<34}{'plan ' + name:>14}{'measured ' + name:>16}{'measured/plan':>15}",
             f"{'held (weights, optimiser, KV cache)':<34}{_size(p['held_bytes'], unit):>14}"
             f"{_size(held['measured_bytes'], unit):>16}{ratio(result['ratio_held_measured_over_plan']):>15}",
             f"{'  the arrays themselves':<34}{'':>14}{_size(held['array_bytes'], unit):>16}"
             f"{ratio(held['array_bytes'] / p['held_bytes']):>15}",
             f"{'largest phase (plan: ' + p['peak_phase'] + ')':<34}{_size(p['largest_phase_bytes'], unit):>14}"
             f"{_size(result['largest_transient_bytes'], unit):>16}"
             f"{ratio(result['ratio_transient_measured_over_plan']):>15}",
             f"{'peak':<34}{_size(p['peak_bytes'], unit):>14}{_size(result['peak_bytes'], unit):>16}"
             f"{ratio(result['ratio_peak_measured_over_plan']):>15}",
             "",
             f"{'phase':<15}{'plan phase':<12}{'plan ' + name:>10}{'XLA temp':>10}{'in use':>10}{'peak':>10}"
             f"{'loss':>10}{'compile s':>11}{'run s':>8}"]
    for r in result["phases"]:
        plan_phase = p["phases"].get(r["plan_phase"]) if r["plan_phase"] else None
        loss = r.get("loss")
        lines.append(f"{r['name']:<15}{r['plan_phase'] or '-':<12}{_size(plan_phase, unit):>10}"
                     f"{_size(r['compiled']['temp_bytes'], unit):>10}{_size(r['bytes_in_use'], unit):>10}"
                     f"{_size(r['peak_bytes_in_use'], unit):>10}{'-' if loss is None else f'{loss:.4f}':>10}"
                     f"{r['compile_s']:>11.1f}{r['run_s']:>8.2f}")
    lines.append(f"(in use / peak: the allocator after each phase, in {name}; the peak is cumulative. Plan phases "
                 "add the reference to the actor and the target critic to the critic; the run does them one "
                 "after the other.)")
    fits = result["fits_original_capacity"]
    if fits is not None:
        lines.append(f"measured peak {result['peak_bytes'] / 2**30:.3f} GiB against the original device's "
                     f"{memory_case.ORIGINAL_CAPACITY_GIB} GiB: {'fits' if fits else 'DOES NOT FIT'}")
    return "\n".join(lines)


def run_layout(out: Path, tiny: bool) -> dict[str, Any]:
    """`memory_case.measured_layout_peak` with the original set-up (or tiny models), written to
    <out>/llm_memory_run.json and printed beside the plan."""
    kw: dict[str, Any] = {}
    if tiny:
        kw = dict(llm=small(), critic=tiny_roberta(), batch=4, seq_len=64, critic_batch=8, micro_batch=2, lora_rank=4)
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith("XLA_PYTHON_CLIENT_") or k in ("JAX_PLATFORMS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES")}
    print(f"running our layout ({'tiny models' if tiny else 'original set-up'}); env {env}", flush=True)
    result = memory_case.measured_layout_peak(log=lambda msg: print(msg, flush=True), **kw)
    record = {"benchmark": "llm_memory_run", **device_info(), "env": env, "tiny": tiny, **result}
    print(result["plan"]["table"], "\n")
    print(run_table(result))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "llm_memory_run.json", record)
    print(f"wrote {out / 'llm_memory_run.json'}")
    return record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-big", action="store_true", help="leave out the Llama-3.2-3B-shaped compiles")
    ap.add_argument("--run", action="store_true",
                    help="run our layout on the default device and measure its memory (llm_memory_run.json)")
    ap.add_argument("--tiny", action="store_true", help="with --run: tiny models instead of the original set-up")
    ap.add_argument("--compile-cases", action="store_true",
                    help="with --run: also compile the estimate-vs-XLA cases (llm_memory_plan.json)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    args = ap.parse_args(argv)
    if args.tiny and not args.run:
        ap.error("--tiny goes with --run.")
    if args.run:
        run_layout(args.out, args.tiny)
        if not args.compile_cases:
            return
    cases = SMALL_CASES + ([] if args.skip_big else big_cases())
    records = [measure(*case) for case in cases]
    naive, ours = memory_case.original_plans()
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
