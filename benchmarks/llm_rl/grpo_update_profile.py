"""Where the GRPO update's time goes on the benchmark's shapes: forward vs backward of the policy.

    python benchmarks/llm_rl/grpo_update_profile.py --out benchmarks/results/cpu

The model is the shape of `benchmarks/llm_rl/grpo.py`'s checkpoint (Qwen2-shaped, hidden 256, 4 layers,
4 heads / 2 KV heads, intermediate 704, tied embeddings, 57-token vocabulary, float32, random
weights); the batch is its step's: 32 sequences of 12 prompt + 32 completion tokens, 8 prompts x 4.
Every program is compiled first (compile time and XLA's temporary memory recorded apart), then all
are called in turn `--repeats` times (median and min): a shared VM's CPU speed drifts within a minute
(hypervisor steal, `benchmarks/llm_rl/cpu_steal.py`), so only programs timed side by side compare.

- `forward`: the completion log-probs (`llm_rl.rollout.completion_logprobs`);
- `hidden_forward` / `hidden_grad`: the decoder's hidden states alone, and the gradient of a sum
  over them (no vocabulary projection, no loss);
- `update`: the GRPO loss's gradient and one AdamW step with every layer's residuals kept (`remat: false`);
- `update_remat`: the same with the layers recomputed in the backward pass from their inputs alone
  (`remat: true`, `ModelConfig.remat_save_dots: false`);
- `update_remat_shared_inputs_only`: and each prompt run once for its 4 completions (`shared_prefix: true`);
- `update_remat_shared`: the same keeping the projections' outputs too, so the backward pass
  recomputes no matmul (`remat_save_dots` by size, which keeps them on these shapes): what GRPO
  runs by default;
- `update_unrolled`: `update` with every `lax.scan` unrolled (the layer loop included);
- `update_3d_dense`: `update` with the dense layers as [B, T, H] @ [H, O] products, as before they
  were reshaped to one 2-D matmul (`llm.layers.dense`).

Matmul FLOPs of one forward pass (2 x tokens x weights of the layers' dense maps) give the achieved
GFLOP/s of the forward and of the backward (counted as twice the forward's work). Writes
OUT/grpo_update_profile.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def compile_row(fn, *args) -> dict:
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return {"compiled": compiled, "args": args, "compile_s": time.perf_counter() - t0,
            "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20}


def time_rows(rows: dict, repeats: int) -> dict:
    """Median and min seconds of each compiled row, the rows called in turn `repeats` times: this
    CPU's speed drifts by a third within a minute, so rows timed one after another are not comparable."""
    import jax

    for row in rows.values():
        jax.block_until_ready(row["compiled"](*row["args"]))
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(repeats):
        for name, row in rows.items():
            t = time.perf_counter()
            jax.block_until_ready(row["compiled"](*row["args"]))
            times[name].append(time.perf_counter() - t)
    return {name: {"median_s": statistics.median(times[name]), "min_s": min(times[name]),
                   "compile_s": row["compile_s"], "temp_mib": row["temp_mib"]} for name, row in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import jaxrl_hier  # noqa: F401  (XLA CPU flags)
    from jaxrl_hier.io import atomic_write_json
    from jaxrl_hier.llm import LanguageModel, decoder, layers
    from jaxrl_hier.llm_rl import losses
    from jaxrl_hier.llm_rl.model_setup import tiny_qwen2_config
    from jaxrl_hier.llm_rl.rollout import completion_logprobs

    hf = tiny_qwen2_config(57, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=704,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hf.tie_word_embeddings = True
    lm = LanguageModel.random(hf, jax.random.key(0))
    cfg, params = lm.config, lm.params
    B, P, N = 32, 12, 32
    rng = np.random.default_rng(0)
    G = 4  # completions per prompt, as the benchmark's step: 8 prompts x 4
    prompt = jnp.repeat(jnp.asarray(rng.integers(4, 57, (B // G, P)), jnp.int32), G, axis=0)
    tokens = jnp.asarray(rng.integers(4, 57, (B, N)), jnp.int32)
    ones_p, ones_n = jnp.ones((B, P), jnp.int32), jnp.ones((B, N), jnp.int32)
    ids, mask = jnp.concatenate([prompt, tokens], 1), jnp.concatenate([ones_p, ones_n], 1)
    advantages = jnp.asarray(rng.normal(size=B), jnp.float32)
    weights = losses.token_weights(ones_n.astype(jnp.float32), "grpo", N)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.0))
    opt_state = optimizer.init(params)
    suppress = (0, 1, 2, 3)

    def logprobs(p, model=lm, group=1):
        return completion_logprobs(model, p, None, prompt, ones_p, tokens, ones_n > 0, suppress_tokens=suppress,
                                   group=group)

    def make_update(model, group=1):
        def loss(p):
            return losses.policy_loss(logprobs(p, model, group), jnp.zeros((B, N)), advantages, weights).loss

        def update(p, s):
            grads = jax.grad(loss)(p)
            updates, s = optimizer.update(grads, s, p)
            return optax.apply_updates(p, updates), s
        return update

    update = make_update(lm)

    def hidden(p):
        return decoder.hidden_states(cfg, p, ids, mask)[0]

    rows = {"forward": compile_row(logprobs, params),
            "hidden_forward": compile_row(hidden, params),
            "hidden_grad": compile_row(jax.grad(lambda p: jnp.sum(hidden(p) ** 2)), params),
            "update": compile_row(update, params, opt_state),
            "update_remat": compile_row(make_update(lm.with_remat(True, save_dots=False)), params, opt_state),
            "update_remat_shared_inputs_only": compile_row(make_update(lm.with_remat(True, save_dots=False), G),
                                                           params, opt_state),
            "update_remat_shared": compile_row(make_update(lm.with_remat(True), G), params, opt_state)}
    # the same update traced with a patched library: every lax.scan unrolled (the layer loop
    # included), and the dense layers as [B, T, H] @ [H, O] products (before they were reshaped to 2-D)
    scan, dense = jax.lax.scan, layers.dense

    def dense_3d(x, p, lora=None, scale=1.0):
        y = x @ p["kernel"] + p.get("bias", 0.0)
        return y if lora is None else y + (scale * ((x @ lora["a"]) @ lora["b"])).astype(y.dtype)

    try:
        jax.lax.scan = functools.partial(scan, unroll=True)
        rows["update_unrolled"] = compile_row(make_update(lm), params, opt_state)  # a new function: traced again
        jax.lax.scan, layers.dense = scan, dense_3d
        rows["update_3d_dense"] = compile_row(make_update(lm), params, opt_state)
    finally:
        jax.lax.scan, layers.dense = scan, dense
    rows = time_rows(rows, args.repeats)

    H, I, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_kv_heads * cfg.head_dim
    layer_weights = H * H * 2 + H * kv * 2 + H * I * 3  # q, o; k, v; gate, up, down
    fwd_flops = 2 * B * (P + N) * layer_weights * cfg.num_layers
    f, g = rows["hidden_forward"]["median_s"], rows["hidden_grad"]["median_s"]
    summary = {"matmul_gflop_forward": fwd_flops / 1e9,
               "forward_gflop_per_s": fwd_flops / f / 1e9,
               "backward_gflop_per_s": 2 * fwd_flops / max(g - f, 1e-9) / 1e9,
               "backward_over_forward_time": (g - f) / f}
    record = {"command": " ".join(sys.argv), "device": str(jax.devices()[0]), "cpu_count": os.cpu_count(),
              "versions": {"jax": jax.__version__, "python": platform.python_version()},
              "load_average": os.getloadavg(), "batch": {"sequences": B, "prompt": P, "completion": N},
              "params": sum(x.size for x in jax.tree.leaves(params)), "rows": rows, "summary": summary}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "grpo_update_profile.json", record)
    for name, row in rows.items():
        print(f"{name:16s} median {row['median_s'] * 1000:7.1f} ms, min {row['min_s'] * 1000:7.1f} ms, "
              f"temp {row['temp_mib']:6.1f} MiB (compile {row['compile_s']:.1f} s)")
    print({k: round(v, 2) for k, v in summary.items()})


if __name__ == "__main__":
    main()
