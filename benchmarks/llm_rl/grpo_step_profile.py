"""Where our GRPO step's time goes on the CPU, and what fraction of the CPU's peak FLOP/s it reaches.

    python benchmarks/llm_rl/grpo_step_profile.py --out benchmarks/results/cpu

The step is `benchmarks/llm_rl/grpo.py`'s (`bench_ours`: the same checkpoint, 8 prompts x 4 completions of
exactly 32 tokens, float32, the shared Python reward, one update) at each `--betas`. Per step, from
the trainer's own clocks: sampling (`time/generation`), rewards and advantages (`time/scoring`),
the update (`time/update`: at beta > 0 it holds the reference model's log-probs); the reference's
log-probs are also timed alone (the same `_ref_logprobs` compiled by itself, called after each step),
so update = reference + the policy's forward, backward and AdamW. The old log-probs come from the
sampler (one update per step), so no separate policy forward runs.

FLOPs are the matmuls' (`matmul_gflop`, from the checkpoint's shape: 2 x tokens x the layers' dense
weights, the attention products and the tied head; XLA's `cost_analysis` counts a loop's body once, so
the decode loop and the layer scan would be undercounted): sampling runs 8 x 12 prompt tokens once each
and 32 x 32 decode positions, the reference forward 8 x 12 + 32 x 32 tokens (each prompt once for its
4 completions), the update that forward and a backward of twice its work (the projections' outputs
are kept, so no matmul is recomputed). Peak: the nominal float32 peak (cores x clock x 64 FLOP per cycle: two
AVX-512 FMA units, assumed from the `avx512f` flag) and a measured one, a 1024^3 float32 matmul timed
in turn with the steps (the practical peak under whatever else the CPU runs). Compile time is
recorded apart (the first step). Writes OUT/grpo_step_profile.json and OUT/grpo_step_profile.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def nominal_peak_gflops(cores: int) -> dict:
    """cores x clock x FLOP/cycle from /proc/cpuinfo (the clock in the model name, else "cpu MHz")."""
    import re

    from jaxrl_hier.bench import cpu_model, cpu_vector_flags

    model, mhz, flags = cpu_model(), None, cpu_vector_flags().split()
    with open("/proc/cpuinfo") as f:
        mhz = next((float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")), None)
    m = re.search(r"@\s*([\d.]+)\s*GHz", model)
    ghz = float(m.group(1)) if m else (mhz or 0) / 1000
    per_cycle = 64 if "avx512f" in flags else 32 if "avx2" in flags else 8  # FP32 FMA lanes x 2 units x 2
    return dict(cores=cores, ghz=ghz, flop_per_cycle_per_core=per_cycle, gflop_per_s=cores * ghz * per_cycle)


def matmul_gflop(cfg, prompts: int, group: int, prompt_len: int, new_tokens: int) -> dict:
    """Matmul GFLOP of sampling, the reference's forward and the update (its forward included) for
    `prompts` x `group` completions of `new_tokens` after `prompt_len`-token prompts, each prompt's
    tokens run once for its group (as the sampler's prefill and `shared_prefix`)."""
    h, q = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    dense = cfg.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size)
    rows = prompts * group

    def attention(tokens: int, context: float) -> float:  # q.k and p.v, every layer
        return 2 * 2 * tokens * context * q * cfg.num_layers

    prompt_tok = prompts * prompt_len
    new_tok = rows * new_tokens
    ctx_prompt, ctx_new = (prompt_len + 1) / 2, prompt_len + (new_tokens + 1) / 2
    head = 2 * h * cfg.vocab_size
    forward = (2 * dense * (prompt_tok + new_tok) + attention(prompt_tok, ctx_prompt) + attention(new_tok, ctx_new)
               + head * new_tok)
    return {"generation": forward / 1e9, "reference": forward / 1e9, "update": 4 * forward / 1e9}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    p.add_argument("--betas", type=float, nargs="+", default=[0.04, 0.0])
    p.add_argument("--steps", type=int, default=15, help="timed steps per beta (after 2 untimed)")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp

    import jaxrl_hier  # noqa: F401  (XLA CPU flags)
    from benchmarks.llm_rl import grpo as bench
    from jaxrl_hier.bench import cpu_busy_fraction, cpu_count, device_info
    from jaxrl_hier.io import atomic_write_json
    from jaxrl_hier.llm import load_pretrained
    from jaxrl_hier.llm_rl.config import GRPOConfig
    from jaxrl_hier.llm_rl.grpo import make_train
    from jaxrl_hier.llm_rl.model_setup import build_lora
    from jaxrl_hier.logging.plots import pyplot, save_figure
    from jaxrl_hier.tasks import Problem

    busy = cpu_busy_fraction(1.0)
    s = bench.Settings(threads=cpu_count())
    n = 1024
    a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    jax.block_until_ready(matmul(a))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = bench.make_checkpoint(Path(tmp))
        problems = [Problem(prompt=q, answer="0", target="") for q in s.prompts]
        reward = bench.RewardLog()
        for beta in args.betas:
            lm = load_pretrained(Path(tmp), dtype="float32")  # afresh: full fine-tuning's update donates the weights
            tok = lm.tokenizer
            prompt_len = 1 + max(len(tok(q, add_special_tokens=False)["input_ids"]) for q in s.prompts)
            config = GRPOConfig(prompts_per_step=len(s.prompts), num_generations=s.num_generations,
                                max_prompt_length=prompt_len, max_new_tokens=s.new_tokens, temperature=s.temperature,
                                learning_rate=s.learning_rate, max_grad_norm=s.max_grad_norm, beta=beta,
                                loss_type="grpo", scale_rewards="group", num_iterations=1, jax_rewards=False,
                                suppress_tokens=tuple(bench.special_ids(tok, lm.config.vocab_size)), seed=s.seed,
                                eval_every=0, dtype="float32")
            trainer = make_train(config, lm, tok, None, lora=build_lora(config, lm),
                                 reward_fn=lambda probs, texts: reward([q.prompt for q in probs], texts))
            state = trainer.init(jax.random.key(s.seed))
            t = time.perf_counter()
            state, _, _ = trainer.step(state, problems)
            first_step_s = time.perf_counter() - t
            state, _, _ = trainer.step(state, problems)
            _, rollout, total, _, _, _ = trainer._sample_and_score(state, 0, 0, jax.random.key(0), problems)
            batch = trainer._make_batch(rollout, total, None)
            flops = matmul_gflop(lm.config, len(s.prompts), s.num_generations, prompt_len, s.new_tokens)
            ref = None
            if beta > 0:
                ref = jax.jit(trainer._ref_logprobs).lower(trainer._base_arg, trainer.ref_params, batch).compile()
                jax.block_until_ready(ref(trainer._base_arg, trainer.ref_params, batch))
            times: dict[str, list[float]] = {"generation": [], "scoring": [], "update": [], "step": [],
                                             "reference": [], "matmul_1024": []}
            for _ in range(args.steps):
                t = time.perf_counter()
                state, metrics, _ = trainer.step(state, problems)
                times["step"].append(time.perf_counter() - t)
                for k in ("generation", "scoring", "update"):
                    times[k].append(metrics[f"time/{k}"])
                if ref is not None:
                    t = time.perf_counter()
                    jax.block_until_ready(ref(trainer._base_arg, trainer.ref_params, batch))
                    times["reference"].append(time.perf_counter() - t)
                t = time.perf_counter()
                jax.block_until_ready(matmul(a))
                times["matmul_1024"].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items() if v}
            med["policy_update"] = med["update"] - med.get("reference", 0.0)
            gflops = {k: v for k, v in flops.items() if beta > 0 or k != "reference"}
            if beta == 0:
                gflops["update"] -= flops["reference"]
            rate = {k: gflops[k] / med[k] for k in gflops}
            rate["policy_update"] = (gflops["update"] - gflops.get("reference", 0.0)) / med["policy_update"]
            rate["step"] = (gflops["generation"] + gflops["update"]) / med["step"]
            matmul_rate = 2 * n**3 / 1e9 / med["matmul_1024"]
            results.append(dict(beta=beta, first_step_s=first_step_s, median_s=med, gflop=gflops,
                                gflop_per_s=rate, matmul_1024_gflop_per_s=matmul_rate, samples=times))
            print(f"beta {beta:g}: step {med['step']:.3f}s = generation {med['generation']:.3f} + scoring "
                  f"{med['scoring']:.3f} + update {med['update']:.3f} (reference alone "
                  f"{med.get('reference', 0):.3f}); {rate['step']:.0f} GFLOP/s over the step, a 1024^3 matmul "
                  f"{matmul_rate:.0f} GFLOP/s", flush=True)
    peak = nominal_peak_gflops(cpu_count())
    result = dict(device=device_info(), settings=dict(prompts=len(s.prompts), generations=s.num_generations,
                                                      new_tokens=s.new_tokens, dtype="float32"),
                  model=model, peak=peak, cpu_busy_before=busy, load_average_end=os.getloadavg()[0],
                  steps=args.steps, results=results,
                  notes="Stages from the trainer's clocks; reference timed alone after each step; gflop: matmul FLOPs "
                        "from the model's shape (matmul_gflop); fractions of peak in fraction_of_peak.")
    for r in results:
        r["fraction_of_peak"] = {"nominal": r["gflop_per_s"]["step"] / peak["gflop_per_s"],
                                 "measured_matmul": r["gflop_per_s"]["step"] / r["matmul_1024_gflop_per_s"]}
        print(f"beta {r['beta']:g}: {r['fraction_of_peak']['nominal']:.0%} of the nominal peak "
              f"({peak['gflop_per_s']:.0f} GFLOP/s), {r['fraction_of_peak']['measured_matmul']:.0%} of the matmul's")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "grpo_step_profile.json", result)

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.5))
    parts = (("generation", "tab:blue"), ("scoring", "tab:gray"), ("reference", "tab:orange"),
             ("policy_update", "tab:green"))
    for i, r in enumerate(results):
        left = 0.0
        for name, color in parts:
            v = r["median_s"].get(name, 0.0)
            ax.barh(i, v, left=left, color=color, label=name if i == 0 else None)
            left += v
    ax.set_yticks(range(len(results)), [f"beta {r['beta']:g}" for r in results])
    ax.set(xlabel="seconds (median)", title=f"our GRPO step, {result['device']['cpu_model']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, args.out / "grpo_step_profile.png")
    print(f"wrote {args.out / 'grpo_step_profile.json'}, grpo_step_profile.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
