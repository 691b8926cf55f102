"""A peer's GRPO step in a minimal script of its own: the yardstick for `benchmarks/llm_rl/grpo.py --check-peers`.

    python benchmarks/llm_rl/grpo_minimal.py trl --ckpt DIR --beta 0.04 --steps 10 --warmup 2 --threads 2
    python benchmarks/llm_rl/grpo_minimal.py tunix --ckpt DIR --beta 0.04 --steps 10 --warmup 2 --threads 2

Each runs the peer the way a plain script of its own would: the peer's defaults everywhere except the
settings that change the work (8 prompts x 4 completions of exactly 32 tokens, BOS first in every
prompt, float32, beta, loss "grpo" = sequence mean of token means, k3 KL, one update per step, lr 1e-5,
gradient clip 1.0), plus TRL's documented way to skip gradient checkpointing (`gradient_checkpointing=False`,
which recomputes nothing: less work). It imports only the standard library, the peer and
`benchmarks/llm_rl/grpo_task.py` (stdlib only): no JAX beside torch, nothing of jaxrl_hier, no thread or XLA
setting of the benchmark's workers; the environment is whatever the caller runs it in. The checkpoint
directory is `benchmarks/llm_rl/grpo.py`'s (`make_checkpoint`).

A step's time is measured as in the benchmark's arms: the interval between the starts of consecutive
steps (TRL's `on_step_begin` callback; Tunix's `_run_global_step`), warmup + steps + 1 steps in one
training call. Prints one line `GRPO_MINIMAL_RESULT {json}` on stdout (step times, start-up, the
completion lengths the reward saw) and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_task beside this file, not the package
import grpo_task as task  # noqa: E402

MARKER = "GRPO_MINIMAL_RESULT "


def trl(ckpt: str, beta: float, steps: int, warmup: int, threads: int, reward: task.RewardLog) -> dict:
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    data = datasets.Dataset.from_dict({"prompt": [tok.bos_token + p for p in task.PROMPTS]})
    out = tempfile.TemporaryDirectory(prefix="trl-minimal-")
    args = GRPOConfig(
        output_dir=out.name, max_steps=warmup + steps + 1, use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=len(task.PROMPTS) * task.NUM_GENERATIONS, num_generations=task.NUM_GENERATIONS,
        max_completion_length=task.NEW_TOKENS, generation_kwargs={"suppress_tokens": task.special_ids(tok)},
        beta=beta, loss_type="grpo", learning_rate=task.LEARNING_RATE, max_grad_norm=task.MAX_GRAD_NORM)
    starts: list[tuple[float, float]] = []

    class StepClock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            starts.append(task.clock())

    trainer = GRPOTrainer(model=ckpt, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                          callbacks=[StepClock()])
    t = time.perf_counter()
    trainer.train()
    out.cleanup()
    return dict(train_s=time.perf_counter() - t, **task.step_intervals(starts, warmup, steps),
                optim=str(args.optim), threads=torch.get_num_threads())


def tunix(ckpt: str, beta: float, steps: int, warmup: int, threads: int, reward: task.RewardLog) -> dict:
    import jax
    import numpy as np
    import optax
    import transformers
    from tunix.models.qwen2 import model as qwen2_lib
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    from tunix.utils.mesh import create_mesh

    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    hf = transformers.AutoConfig.from_pretrained(ckpt)
    config = task.tunix_qwen2_config(qwen2_lib, hf)
    mesh = create_mesh((1, 1), ("fsdp", "tp"))
    actor = qwen2_params.create_model_from_safe_tensors(ckpt, config, mesh)
    reference = qwen2_params.create_model_from_safe_tensors(ckpt, config, mesh) if beta else None
    prompt_len = 1 + max(len(tok.encode(p)) for p in task.PROMPTS)  # the sampler adds BOS
    roles = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference, tokenizer=tok, cluster_config=rl_cluster_lib.ClusterConfig(
        role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
        rollout_engine=task.suppressing_rollout(task.special_ids(tok)),
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.chain(optax.clip_by_global_norm(task.MAX_GRAD_NORM), optax.adamw(task.LEARNING_RATE)),
            eval_every_n_steps=10**9, max_steps=warmup + steps + 1),  # no eval set: it never evaluates
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=task.NEW_TOKENS, temperature=task.TEMPERATURE, max_prompt_length=prompt_len,
            kv_cache_size=prompt_len + task.NEW_TOKENS, data_type=jax.numpy.float32)))
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, reward_fns=reward, algo_config=grpo_learner.GRPOConfig(
        num_generations=task.NUM_GENERATIONS, beta=beta, kl_loss_mode="low_var_kl",
        loss_agg_mode="sequence-mean-token-mean"))
    starts: list[tuple[float, float]] = []
    run_global_step = learner._run_global_step  # Tunix has no per-step callback

    def timed_global_step(*a, **kw):
        starts.append(task.clock())
        return run_global_step(*a, **kw)

    learner._run_global_step = timed_global_step

    def batches():
        while True:
            yield {"prompts": np.array(task.PROMPTS)}

    t = time.perf_counter()
    learner.train(batches())
    return dict(train_s=time.perf_counter() - t, **task.step_intervals(starts, warmup, steps))


PEERS = {"trl": trl, "tunix": tunix}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("peer", choices=tuple(PEERS))
    p.add_argument("--ckpt", required=True)
    p.add_argument("--beta", type=float, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if args.threads < len(cores):  # what `taskset` would do for a plain script
        os.sched_setaffinity(0, cores[:args.threads])
    t0 = time.perf_counter()
    reward = task.RewardLog()
    rec = PEERS[args.peer](args.ckpt, args.beta, args.steps, args.warmup, args.threads, reward)
    rec.update(wall_s=time.perf_counter() - t0, reward_calls=len(reward.calls),
               completion_lengths=sorted({n for c in reward.calls for n in c}),
               completions=sum(len(c) for c in reward.calls))
    print(MARKER + json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
