"""Where the GRPO update's time goes on the benchmark's shapes: forward vs backward of the policy.

    python benchmarks/grpo_update_profile.py --out benchmarks/results/cpu

The model is the shape of `benchmarks/grpo.py`'s checkpoint (Qwen2-shaped, hidden 256, 4 layers,
4 heads / 2 KV heads, intermediate 704, tied embeddings, 57-token vocabulary, float32, random
weights); the batch is its step's: 32 sequences of 12 prompt + 32 completion tokens. Each program is
compiled once, then timed `--repeats` times (median, compile time apart):

- `forward`: the completion log-probs (`llm_rl.rollout.completion_logprobs`);
- `hidden_forward` / `hidden_grad`: the decoder's hidden states alone, and the gradient of a sum
  over them (no vocabulary projection, no loss);
- `update`: the GRPO loss's gradient and one AdamW step, as `llm_rl.grpo` runs it;
- `update_unrolled`: the same with every `lax.scan` unrolled (the layer loop included).

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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, *args, repeats: int) -> dict:
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import jaxrl_hier  # noqa: F401  (XLA CPU flags)
    from jaxrl_hier.io import atomic_write_json
    from jaxrl_hier.llm import LanguageModel, decoder
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
    prompt = jnp.asarray(rng.integers(4, 57, (B, P)), jnp.int32)
    tokens = jnp.asarray(rng.integers(4, 57, (B, N)), jnp.int32)
    ones_p, ones_n = jnp.ones((B, P), jnp.int32), jnp.ones((B, N), jnp.int32)
    ids, mask = jnp.concatenate([prompt, tokens], 1), jnp.concatenate([ones_p, ones_n], 1)
    advantages = jnp.asarray(rng.normal(size=B), jnp.float32)
    weights = losses.token_weights(ones_n.astype(jnp.float32), "grpo", N)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.0))
    opt_state = optimizer.init(params)
    suppress = (0, 1, 2, 3)

    def logprobs(p):
        return completion_logprobs(lm, p, None, prompt, ones_p, tokens, ones_n > 0, suppress_tokens=suppress)

    def loss(p):
        return losses.policy_loss(logprobs(p), jnp.zeros((B, N)), advantages, weights).loss

    def update(p, s):
        grads = jax.grad(loss)(p)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    def hidden(p):
        return decoder.hidden_states(cfg, p, ids, mask)[0]

    rows = {"forward": timed(logprobs, params, repeats=args.repeats),
            "hidden_forward": timed(hidden, params, repeats=args.repeats),
            "hidden_grad": timed(jax.grad(lambda p: jnp.sum(hidden(p) ** 2)), params, repeats=args.repeats),
            "update": timed(update, params, opt_state, repeats=args.repeats)}
    scan = jax.lax.scan
    jax.lax.scan = functools.partial(scan, unroll=True)
    try:
        # a new function object, so that jit traces it again with the patched scan
        rows["update_unrolled"] = timed(lambda p, s: update(p, s), params, opt_state, repeats=args.repeats)
    finally:
        jax.lax.scan = scan

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
        print(f"{name:16s} median {row['median_s'] * 1000:7.1f} ms (compile {row['compile_s']:.1f} s)")
    print({k: round(v, 2) for k, v in summary.items()})


if __name__ == "__main__":
    main()
