"""GRPO step time against TRL and Tunix: generation + rewards + one update, same checkpoint, same prompts.

The checkpoint is a tiny Qwen2-shaped model made here with transformers (hidden 256, 4 layers, 4 heads,
2 KV heads, intermediate 704, tied embeddings, the 57-token character vocabulary of
`jaxrl_hier.tasks.tokenizer`: 2.97M parameters, float32), saved with `save_pretrained` beside the tokenizer.
Every system reads that directory. One step: 8 prompts x 4 generations, exactly 32 new tokens each
(pad/bos/eos/unk suppressed while sampling, so no completion stops early), temperature 1.0 with no top-k or
top-p, the shared Python reward `digit_fraction` (fraction of digit characters in the completion), group
advantages, one AdamW update (lr 1e-5, no weight decay, gradient clip 1.0), loss "grpo" (sequence mean of
token means), KL to the reference by the k3 estimator when beta > 0 (no reference model at beta 0).

Systems (`--systems`): `trl` (TRL `GRPOTrainer`, PyTorch on the CPU), `tunix` (Tunix `GRPOLearner`,
JAX, actor/rollout/reference on one `tunix.utils.mesh.create_mesh` mesh, co-located: no weight copy),
`ours` and `split` (jaxrl_hier's GRPO; `bench_ours` / `bench_split`, filled by the lead).

Method: each (system, beta) runs in its own subprocess of this script (`--worker`), so that peak memory is
that system's alone and each framework keeps its own thread settings (torch: `set_num_threads(--threads)`;
the JAX systems: the same environment; the peers on XLA's default flags, ours on jaxrl_hier's). Workers
start from the environment this script was started in; OMP_WAIT_POLICY (torch's threads only) is
PASSIVE when other jobs kept the CPU busy in the second before the worker, else torch's default
(`--omp-wait-policy`, `omp_wait_policy`), and a TRL worker imports no JAX. Before each worker the harness waits
(up to `--cooldown-s`) until the hypervisor steals under 5% of the CPU in a 1-s probe, and records the
steal the worker met (`cpu_steal`): on this VM other tenants took up to 40% of the CPU for minutes
(`benchmarks/llm_rl/cpu_steal.py`). `--check-peers` runs each
peer's minimal script (`benchmarks/llm_rl/grpo_minimal.py`: the peer's own defaults, the same work) right
beside its arm in every round and exits 1 when an arm's median of paired round ratios is more than 10%
slower than its script's (`peer_check`). In a worker: start-up (imports, model load, trainer
construction) is timed apart; then warmup + steps + 1 steps run in one training call; a step's time is the
interval between the starts of consecutive steps (everything the framework does per step: sampling,
rewards, reference and policy log-probs, the update, its bookkeeping), the first `--warmup` intervals
(compilation included) are reported apart and the last step only closes the last interval. Peak memory is
the worker's RSS high-water mark (`resource.getrusage(RUSAGE_SELF).ru_maxrss`): framework, model, optimiser
and compiled programs together. Completion tokens/s = 8 * 4 * 32 / median step. Each worker checks that
every completion the reward saw had exactly 32 characters (one token each) and that each step scored 32.
`--rounds` (3) runs every (system, beta) worker that many times, one system after another in each round
and the order rotated between rounds, because a shared VM's CPU speed drifts by up to a third over
minutes (the 2-core Intel Xeon @ 2.80GHz of `benchmarks/results/cpu/grpo.json`; `benchmarks/llm_rl/cpu_steal.py`
measures the host's share): a record pools the step times of all its rounds, keeps each round's median, and `speedups` gives ours
against each peer as the ratio of pooled medians with the lowest and highest ratio of one round's.

`--preset qwen2.5-0.5b` (or qwen2.5-1.5b) with `--platform gpu --dtype bfloat16 [--lora-rank 16]` is the GPU
run: a random model of that shape (its 151,936-token vocabulary kept, every id the character tokenizer lacks
suppressed while sampling), ours and TRL on the GPU, and each worker's device memory high-water mark
(`peak_device_mib`) beside its RSS. Tunix is compared on the CPU preset only.

Writes OUT/grpo.json (device, versions, settings, notes, a record per system and beta), OUT/grpo.md (the
table) and OUT/grpo.png (median step time per system and beta, min-max as error bars). Peers need
`pip install -e ".[bench]"`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

# The environment this script was started in, before importing jaxrl_hier (whose import adds its XLA flag to
# os.environ): the peers' workers and their minimal scripts start from it.
USER_ENV = dict(os.environ)
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from benchmarks.llm_rl.grpo_task import (  # noqa: E402,F401  (re-exported: the task lives in grpo_task)
    LEARNING_RATE, MAX_GRAD_NORM, NEW_TOKENS, NUM_GENERATIONS, PROMPTS, SEED, TEMPERATURE, RewardLog, clock,
    digit_fraction, special_ids, step_intervals, suppressing_rollout, tunix_qwen2_config)
from jaxrl_hier.bench import UNROLL_DECODE  # noqa: E402  (jaxrl_hier.bench imports JAX only when called)
from jaxrl_hier.config import ConfigError  # noqa: E402
from jaxrl_hier.io import atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: E402

SYSTEMS = ("trl", "tunix", "ours", "split")
PEERS = ("trl", "tunix")  # the systems with a minimal script of their own (benchmarks/llm_rl/grpo_minimal.py)
PEER_TOLERANCE = 0.10  # --check-peers fails when an arm is more than this much slower than its minimal script
OMP_WAIT_POLICIES = ("auto", "passive", "default")
SHARED_CPU_BUSY = 0.10  # --omp-wait-policy auto: other jobs busier than this fraction of the CPUs = a shared CPU
MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=704)
# `--preset`: "tiny" is MODEL above (the CPU comparison); the others are random models shaped like the published
# checkpoints (benchmarks/llm/llm_throughput.py's PRESETS), for a GPU run. Their vocabulary keeps its full size (the
# logits and their softmax cost what they cost in the real model) while every id the character tokenizer does
# not have is suppressed, so completions are still exactly 32 characters.
PRESET_NAMES = ("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b")
PLATFORMS = {"cpu": "cpu", "gpu": "cuda"}  # --platform -> JAX_PLATFORMS of the workers


@dataclass(frozen=True)
class Settings:
    """What every system is asked to do; recorded in grpo.json."""

    prompts: tuple[str, ...] = PROMPTS
    num_generations: int = NUM_GENERATIONS
    new_tokens: int = NEW_TOKENS
    temperature: float = TEMPERATURE
    learning_rate: float = LEARNING_RATE
    max_grad_norm: float = MAX_GRAD_NORM
    seed: int = SEED
    threads: int = 2
    preset: str = "tiny"
    dtype: str = "float32"
    lora_rank: int = 0  # 0: full fine-tuning; else a LoRA adapter of this rank on q/k/v/o
    platform: str = "cpu"
    unroll_decode: str = "auto"  # ours: GRPOConfig.unroll_decode (auto = by the layer weights' size)

    @property
    def tokens_per_step(self) -> int:
        return len(self.prompts) * self.num_generations * self.new_tokens


# --- the checkpoint ---------------------------------------------------------------------------------


def preset_config(preset: str, tok: Any) -> Any:
    """The transformers Qwen2Config of `preset` for the character tokenizer `tok`."""
    import transformers

    from jaxrl_hier.llm_rl.model_setup import tiny_qwen2_config

    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if preset == "tiny":
        return tiny_qwen2_config(len(tok), hidden_size=MODEL["hidden_size"], num_layers=MODEL["num_layers"],
                                 num_heads=MODEL["num_heads"], num_kv_heads=MODEL["num_kv_heads"],
                                 intermediate_size=MODEL["intermediate_size"], max_positions=128, **ids)
    from benchmarks.llm.llm_throughput import PRESETS

    fields = {k: v for k, v in PRESETS[preset].items() if k not in ("model_type", "dtype")}
    return transformers.Qwen2Config(**fields, **ids)


def make_checkpoint(directory: Path, seed: int = SEED, preset: str = "tiny", dtype: str = "float32") -> dict:
    """Save the `preset` Qwen2 model (random weights from `torch.manual_seed(seed)`, stored in `dtype`) and the
    character tokenizer into `directory`; returns its shape and parameter count."""
    import torch
    import transformers

    from jaxrl_hier.tasks.tokenizer import build_char_tokenizer, save_tokenizer

    tok = build_char_tokenizer()
    config = preset_config(preset, tok)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    # save_pretrained writes in place: write into a temporary sibling, then move each file in atomically.
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for src in Path(tmp).iterdir():
            atomic_write_bytes(directory / src.name, src.read_bytes())
    save_tokenizer(tok, directory)
    return dict(preset=preset, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
                num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                intermediate_size=config.intermediate_size, vocab_size=config.vocab_size, tokenizer_size=len(tok),
                params=sum(p.numel() for p in model.parameters()), tied_embeddings=True, dtype=dtype)


def device_peak_mib(system: str) -> float | None:
    """The accelerator's allocated-bytes high-water mark in this worker (torch's for TRL, JAX's allocator's
    for the JAX systems); None on the CPU."""
    if system == "trl":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else None
    import jax

    from jaxrl_hier.llm.memory import device_memory_stats

    peak = device_memory_stats(jax.local_devices()[0])["peak_bytes_in_use"]
    return None if jax.default_backend() == "cpu" or peak is None else peak / 2**20


# --- TRL ------------------------------------------------------------------------------------------


def bench_trl(ckpt_dir: Path, prompts: tuple[str, ...], reward_fn: Callable, beta: float, steps: int,
              warmup: int, settings: Settings = Settings()) -> dict:
    """TRL GRPOTrainer (PyTorch on `settings.platform`), one optimiser step per generation batch; LoRA
    through peft when `settings.lora_rank` > 0."""
    t0 = time.perf_counter()
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(settings.threads)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt_dir)
    vocab = transformers.AutoConfig.from_pretrained(ckpt_dir).vocab_size
    dtype = getattr(torch, settings.dtype)
    peft_config = None
    if settings.lora_rank:
        import peft

        peft_config = peft.LoraConfig(r=settings.lora_rank, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    # The Tunix sampler puts BOS before every prompt; the same text here gives TRL the same token ids.
    data = datasets.Dataset.from_dict({"prompt": [tok.bos_token + p for p in prompts]})
    batch = len(prompts) * settings.num_generations
    out_dir = tempfile.TemporaryDirectory(prefix="trl-grpo-")  # TRL wants one; nothing is saved there
    args = GRPOConfig(
        output_dir=out_dir.name, max_steps=warmup + steps + 1, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=settings.num_generations, num_iterations=1,
        max_completion_length=settings.new_tokens, temperature=settings.temperature, top_p=1.0, top_k=0,
        generation_kwargs={"suppress_tokens": special_ids(tok, vocab)},  # eos suppressed: no min_new_tokens needed
        beta=beta, loss_type="grpo", scale_rewards="group", learning_rate=settings.learning_rate,
        weight_decay=0.0, max_grad_norm=settings.max_grad_norm, lr_scheduler_type="constant",
        warmup_steps=0, use_vllm=False, bf16=settings.dtype == "bfloat16", fp16=False,  # optim: TRL's default
        gradient_checkpointing=False,  # TRL's GRPOConfig turns it on by default: recompute costs time
        use_cpu=settings.platform == "cpu", report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True,
        shuffle_dataset=False, dataloader_num_workers=0, seed=settings.seed,
        model_init_kwargs={"dtype": dtype})

    starts: list[tuple[float, float]] = []

    class StepClock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            starts.append(clock())

    trainer = GRPOTrainer(model=str(ckpt_dir), reward_funcs=reward_fn, args=args, train_dataset=data,
                          processing_class=tok, callbacks=[StepClock()], peft_config=peft_config)
    startup = time.perf_counter() - t0
    trainer.train()
    out_dir.cleanup()
    return dict(startup_s=startup, **step_intervals(starts, warmup, steps),
                versions={k: metadata.version(k) for k in ("trl", "torch", "transformers", "accelerate")},
                threads=torch.get_num_threads(), ref_model=trainer.ref_model is not None, optim=str(args.optim),
                jax_imported="jax" in sys.modules)


# --- Tunix ----------------------------------------------------------------------------------------


def bench_tunix(ckpt_dir: Path, prompts: tuple[str, ...], reward_fn: Callable, beta: float, steps: int,
                warmup: int, settings: Settings = Settings()) -> dict:
    """Tunix GRPOLearner: actor, rollout and reference on one mesh (co-located, shared actor/rollout model)."""
    t0 = time.perf_counter()
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

    tok = transformers.AutoTokenizer.from_pretrained(ckpt_dir)
    hf = transformers.AutoConfig.from_pretrained(ckpt_dir)
    config = tunix_qwen2_config(qwen2_lib, hf)
    mesh = create_mesh((1, 1), ("fsdp", "tp"))
    actor = qwen2_params.create_model_from_safe_tensors(str(ckpt_dir), config, mesh)
    reference = qwen2_params.create_model_from_safe_tensors(str(ckpt_dir), config, mesh) if beta else None
    prompt_len = 1 + max(len(tok.encode(p)) for p in prompts)  # the sampler adds BOS
    optimizer = optax.chain(optax.clip_by_global_norm(settings.max_grad_norm),
                            optax.adamw(settings.learning_rate, weight_decay=0.0))
    roles = rl_cluster_lib.Role
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
        rollout_engine=suppressing_rollout(special_ids(tok)),
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optimizer, eval_every_n_steps=10**9, max_steps=warmup + steps + 1,
            pbar_description=None),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=settings.new_tokens, temperature=settings.temperature, top_p=1.0, top_k=None,
            max_prompt_length=prompt_len, kv_cache_size=prompt_len + settings.new_tokens,
            data_type=jax.numpy.float32))
    cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference, tokenizer=tok,
                                       cluster_config=cluster_config)
    algo = grpo_learner.GRPOConfig(num_generations=settings.num_generations, num_iterations=1, beta=beta,
                                   kl_loss_mode="low_var_kl",  # k3, as TRL (Tunix's default "kl" is logp - ref)
                                   epsilon=0.2, loss_agg_mode="sequence-mean-token-mean")
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward_fn)

    starts: list[tuple[float, float]] = []
    run_global_step = learner._run_global_step  # one GRPO step: Tunix has no per-step callback to hook

    def timed_global_step(*a, **kw):
        starts.append(clock())
        return run_global_step(*a, **kw)

    learner._run_global_step = timed_global_step

    def batches():
        while True:  # an array, not a list: Tunix repeats each leaf of the batch pytree G times
            yield {"prompts": np.array(prompts)}

    startup = time.perf_counter() - t0
    learner.train(batches())
    return dict(startup_s=startup, **step_intervals(starts, warmup, steps),
                versions={k: metadata.version(k) for k in ("google-tunix", "jax", "jaxlib", "flax", "optax",
                                                           "qwix", "transformers")},
                weight_sync=bool(learner.should_sync_weights), ref_model=reference is not None)


# --- ours -----------------------------------------------------------------------------------------


def bench_ours(ckpt_dir: Path, prompts: tuple[str, ...], reward_fn: Callable, beta: float, steps: int,
               warmup: int, settings: Settings = Settings(), placement: str = "colocated") -> dict:
    """jaxrl_hier's co-located GRPO (`jaxrl_hier.llm_rl.grpo`) on the same checkpoint and prompts.

    The sampler and the optimiser read the same parameter arrays; the step is generation (the
    traceable sampling core, special tokens suppressed so every completion has 32 tokens), the
    harness's Python reward on the decoded texts, group advantages, and one update (old log-probs
    from the sampler; the reference forward only when beta > 0). Prompts get BOS first, as the
    peers' (12 tokens, none padded)."""
    t0 = time.perf_counter()
    import jax

    import jaxrl_hier  # noqa: F401  (XLA CPU flags)
    from jaxrl_hier.llm import load_pretrained
    from jaxrl_hier.llm_rl.config import GRPOConfig
    from jaxrl_hier.llm_rl.grpo import make_train
    from jaxrl_hier.llm_rl.model_setup import build_lora
    from jaxrl_hier.tasks import Problem

    lm = load_pretrained(ckpt_dir, dtype=settings.dtype)
    tok = lm.tokenizer
    prompt_len = 1 + max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    config = GRPOConfig(prompts_per_step=len(prompts), num_generations=settings.num_generations,
                        max_prompt_length=prompt_len, max_new_tokens=settings.new_tokens,
                        temperature=settings.temperature, learning_rate=settings.learning_rate,
                        max_grad_norm=settings.max_grad_norm, beta=beta, loss_type="grpo", scale_rewards="group",
                        num_iterations=1, jax_rewards=False,
                        suppress_tokens=tuple(special_ids(tok, lm.config.vocab_size)), seed=settings.seed,
                        placement=placement, eval_every=0, dtype=settings.dtype, lora_rank=settings.lora_rank,
                        unroll_decode=UNROLL_DECODE[settings.unroll_decode])
    problems = [Problem(prompt=p, answer="0", target="") for p in prompts]
    trainer = make_train(config, lm, tok, None, lora=build_lora(config, lm),
                         reward_fn=lambda probs, texts: reward_fn([p.prompt for p in probs], texts))
    state = trainer.init(jax.random.key(settings.seed))
    startup = time.perf_counter() - t0
    starts: list[tuple[float, float]] = []
    split_s = {"time/generation": [], "time/scoring": [], "time/update": []}
    for _ in range(warmup + steps + 1):
        starts.append(clock())
        state, metrics, _ = trainer.step(state, problems)
        for k in split_s:
            split_s[k].append(metrics[k])
    jax.block_until_ready(state)
    timed = slice(warmup, warmup + steps)
    return dict(startup_s=startup, **step_intervals(starts, warmup, steps),
                versions={k: metadata.version(k) for k in ("jax", "jaxlib", "flax", "optax")},
                ref_model=trainer.ref_params is not None, placement=placement, devices=len(jax.devices()),
                median_stage_s={k.split("/")[1]: statistics.median(v[timed]) for k, v in split_s.items()})


def bench_split(ckpt_dir: Path, prompts: tuple[str, ...], reward_fn: Callable, beta: float, steps: int,
                warmup: int, settings: Settings = Settings()) -> dict:
    """The server-style layout: generation on half of the devices, training on the other half, the
    weights copied to the generator every step (same contract as `bench_ours`)."""
    return bench_ours(ckpt_dir, prompts, reward_fn, beta, steps, warmup, settings, placement="split")


BENCHES: dict[str, Callable[..., dict]] = {"trl": bench_trl, "tunix": bench_tunix, "ours": bench_ours,
                                           "split": bench_split}


# --- worker and harness ---------------------------------------------------------------------------


def check_completions(log: RewardLog, settings: Settings, steps_run: int) -> None:
    """Every step scored 32 completions of exactly `new_tokens` characters."""
    per_call = [len(c) for c in log.calls]
    if sum(per_call) != steps_run * len(settings.prompts) * settings.num_generations:
        raise RuntimeError(f"expected {steps_run} steps of {len(settings.prompts) * settings.num_generations} "
                           f"completions, the reward saw {per_call}")
    lengths = {n for c in log.calls for n in c}
    if lengths != {settings.new_tokens}:
        raise RuntimeError(f"completion lengths {sorted(lengths)}, expected exactly {settings.new_tokens}")


def run_worker(system: str, beta: float, ckpt_dir: Path, steps: int, warmup: int, settings: Settings,
               result_path: Path) -> int:
    # Fewer threads than cores: pin the process to that many cores, which bounds torch's and XLA's thread
    # pools alike (both size themselves from the schedulable CPUs).
    cores = sorted(os.sched_getaffinity(0))
    if settings.threads < len(cores):
        os.sched_setaffinity(0, cores[:settings.threads])
    log = RewardLog()
    load_start = os.getloadavg()[0]
    try:
        rec = BENCHES[system](ckpt_dir, settings.prompts, log, beta, steps, warmup, settings)
    except NotImplementedError as err:
        atomic_write_json(result_path, {"skipped": f"{system}: {err}"})
        return 0
    check_completions(log, settings, warmup + steps + 1)
    rec["peak_device_mib"] = device_peak_mib(system)
    rec["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rec["load_average_1min"] = [load_start, os.getloadavg()[0]]  # at the worker's start and end
    atomic_write_json(result_path, rec)
    return 0


def summarize(system: str, beta: float, rec: dict, settings: Settings) -> dict:
    times = rec["step_s"]
    median = statistics.median(times)
    return dict(system=system, beta=beta, median_step_s=median, min_step_s=min(times), max_step_s=max(times),
                median_step_cpu_s=statistics.median(rec["step_cpu_s"]),
                completion_tokens_per_s=settings.tokens_per_step / median, **rec)


def merge_rounds(system: str, beta: float, rounds: list[dict], settings: Settings) -> dict:
    """One record from a system's runs in every round: the step times of all rounds pooled (median, min,
    max), each round's own median beside them, start-up and first step of the first round, the largest
    peak memory."""
    pooled = {"step_s": [t for r in rounds for t in r["step_s"]],
              "step_cpu_s": [t for r in rounds for t in r["step_cpu_s"]]}
    derived = ("system", "beta", "median_step_s", "min_step_s", "max_step_s", "median_step_cpu_s",
               "completion_tokens_per_s")
    raw = {k: v for k, v in rounds[0].items() if k not in derived}
    rec = summarize(system, beta, {**raw, **pooled}, settings)
    rec.update(round_median_step_s=[r["median_step_s"] for r in rounds],
               startup_s=statistics.median(r["startup_s"] for r in rounds),
               peak_rss_mib=max(r["peak_rss_mib"] for r in rounds),
               peak_device_mib=max((r["peak_device_mib"] for r in rounds if r.get("peak_device_mib") is not None),
                                   default=None),
               load_average_1min=[r["load_average_1min"] for r in rounds],
               cpu_busy_before=[r.get("cpu_busy_before") for r in rounds],
               cpu_steal=[r.get("cpu_steal") for r in rounds],
               omp_wait_policy=[r.get("omp_wait_policy") for r in rounds])
    if "median_stage_s" in rounds[0]:
        rec["median_stage_s"] = {k: statistics.median(r["median_stage_s"][k] for r in rounds)
                                 for k in rounds[0]["median_stage_s"]}
    return rec


def speedups(records: list[dict], over: str = "ours") -> list[dict]:
    """How many times faster `over` is than each other system at each beta: the ratio of pooled medians,
    and the lowest and highest ratio of the rounds' medians (the rounds ran side by side)."""
    by = {(r["system"], r["beta"]): r for r in records}
    out = []
    for (system, beta), r in by.items():
        mine = by.get((over, beta))
        if system == over or mine is None:
            continue
        per_round = [a / b for a, b in zip(r["round_median_step_s"], mine["round_median_step_s"])]
        out.append(dict(system=system, beta=beta, speedup=r["median_step_s"] / mine["median_step_s"],
                        round_min=min(per_round), round_max=max(per_round)))
    return out


def versions() -> dict:
    out = {}
    for name in ("jax", "jaxlib", "flax", "optax", "transformers", "torch", "trl", "google-tunix", "qwix",
                 "accelerate", "tokenizers", "safetensors"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def omp_wait_policy(choice: str, cpu_busy: float | None, user_env: dict | None = None) -> str | None:
    """The OMP_WAIT_POLICY a worker runs with (None: unset, libgomp's default of spinning a while before
    sleeping). It matters to torch alone (the JAX systems run on XLA's own thread pools). One set by the
    user is kept. `auto`: PASSIVE when other jobs kept the CPUs busier than SHARED_CPU_BUSY just before the
    worker started (`cpu_busy`, None when unknown), else torch's default: with other jobs on the CPU,
    torch's spinning waits made a TRL step ~10x slower (1.2 s against 13.9 s here at a load average of 5.5
    on 2 cores); on an idle CPU, passive waits cost it every wake-up of its threads (the issue's TRL arm:
    0.72 s per step against 0.40-0.44 s for a plain script)."""
    user_env = USER_ENV if user_env is None else user_env
    if "OMP_WAIT_POLICY" in user_env:
        return user_env["OMP_WAIT_POLICY"]
    if choice == "passive" or (choice == "auto" and (cpu_busy is None or cpu_busy > SHARED_CPU_BUSY)):
        return "PASSIVE"
    return None


def worker_env(threads: int, system: str = "", platform: str = "cpu", wait_policy: str | None = None) -> dict:
    """A worker's environment: the one this script was started in (USER_ENV, without the XLA flag that
    importing jaxrl_hier adds) plus the same thread limits for torch (OpenMP, MKL) and the JAX systems, and
    `wait_policy` as OMP_WAIT_POLICY (see `omp_wait_policy`). The peers' workers keep XLA's own CPU
    flags (JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER=1: Tunix runs as in a plain script of its own); ours get
    jaxrl_hier's, which its import sets."""
    env = dict(USER_ENV)
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               JAX_PLATFORMS=PLATFORMS[platform], TF_CPP_MIN_LOG_LEVEL="2")
    if system in PEERS:
        env["JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER"] = "1"
    if platform == "gpu":  # allocate as needed, so that the allocator's peak is what the step used
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if system == "split":  # two CPU devices: one samples, one trains
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    return env


WORKER_ENV_KEYS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "JAX_PLATFORMS", "XLA_FLAGS",
                   "XLA_PYTHON_CLIENT_PREALLOCATE", "JAXRL_HIER_KEEP_XLA_CPU_SCHEDULER")


def run_timed_worker(cmd: list[str], env: dict, cooldown_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    """Run one worker after waiting (up to `cooldown_s`) for the hypervisor to stop stealing this VM's
    CPUs, and measure the steal it met while it ran (`jaxrl_hier.bench.steal_fraction`: on this VM
    other tenants took up to 40% of the CPU time, `benchmarks/llm_rl/cpu_steal.py`)."""
    from jaxrl_hier.bench import cpu_ticks, steal_fraction, wait_until_unthrottled

    waited, before_share = wait_until_unthrottled(cooldown_s) if cooldown_s > 0 else (0.0, None)
    before = cpu_ticks()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    return proc, {"cooldown_s": waited, "steal_before": before_share, "cpu_steal": steal_fraction(before, cpu_ticks())}


def run_system(system: str, beta: float, ckpt_dir: Path, args: argparse.Namespace, workdir: Path,
               round_: int = 0) -> dict | None:
    result_path = workdir / f"{system}-{beta}-{round_}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--beta", str(beta),
           "--ckpt", str(ckpt_dir), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--result", str(result_path), "--preset", args.preset,
           "--dtype", args.dtype, "--lora-rank", str(args.lora_rank), "--platform", args.platform,
           "--unroll-decode", args.unroll_decode]
    from jaxrl_hier.bench import cpu_busy_fraction

    busy = cpu_busy_fraction(1.0)  # the other jobs' load, nothing of this benchmark running
    policy = omp_wait_policy(args.omp_wait_policy, busy)
    print(f"[round {round_ + 1}/{args.rounds}: {system} beta={beta}] running (CPU busy {busy:.0%} before; "
          f"OMP_WAIT_POLICY {policy or 'unset'}) ...", flush=True)
    env = worker_env(args.threads, system, args.platform, policy)
    proc, steal = run_timed_worker(cmd, env, args.cooldown_s)
    if proc.returncode != 0 or not result_path.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"{system} beta={beta} failed (exit {proc.returncode}):\n{tail}")
    rec = json.loads(result_path.read_text())
    if "skipped" in rec:
        print(f"[{system} beta={beta}] skipped: {rec['skipped']}", flush=True)
        return None
    rec = summarize(system, beta, dict(rec, cpu_busy_before=busy, omp_wait_policy=policy, **steal,
                                       worker_env={k: env.get(k) for k in WORKER_ENV_KEYS}), args.settings)
    device_peak = f", device peak {rec['peak_device_mib']:.0f} MiB" if rec.get("peak_device_mib") else ""
    print(f"[round {round_ + 1}: {system} beta={beta}] median {rec['median_step_s']:.3f}s (min {rec['min_step_s']:.3f}, max "
          f"{rec['max_step_s']:.3f}; CPU {rec['median_step_cpu_s']:.3f}s; steal {fraction(rec['cpu_steal'])}), "
          f"{rec['completion_tokens_per_s']:.0f} tok/s, peak RSS "
          f"{rec['peak_rss_mib']:.0f} MiB{device_peak}, start-up {rec['startup_s']:.1f}s, first step "
          f"{rec['warmup_step_s'][0] if rec['warmup_step_s'] else float('nan'):.1f}s", flush=True)
    return rec


def run_minimal(peer: str, beta: float, ckpt_dir: Path, args: argparse.Namespace, round_: int = 0) -> dict:
    """`peer`'s minimal script (benchmarks/llm_rl/grpo_minimal.py) on the same checkpoint, steps and threads, in the
    environment this script was started in (USER_ENV): the peer as a plain script of its own runs."""
    from jaxrl_hier.bench import cpu_busy_fraction

    cmd = [sys.executable, str(REPO / "benchmarks" / "llm_rl" / "grpo_minimal.py"), peer, "--ckpt", str(ckpt_dir), "--beta",
           str(beta), "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    busy = cpu_busy_fraction(1.0)
    print(f"[round {round_ + 1}/{args.rounds}: {peer} minimal script beta={beta}] running (CPU busy {busy:.0%} "
          f"before; OMP_WAIT_POLICY {USER_ENV.get('OMP_WAIT_POLICY', 'unset')}) ...", flush=True)
    proc, steal = run_timed_worker(cmd, dict(USER_ENV), args.cooldown_s)
    from benchmarks.llm_rl.grpo_minimal import MARKER

    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"{peer} minimal script beta={beta} failed (exit {proc.returncode}):\n{tail}")
    rec = json.loads(lines[-1][len(MARKER):])
    expected = (args.warmup + args.steps + 1) * len(PROMPTS) * NUM_GENERATIONS
    if rec["completion_lengths"] != [args.settings.new_tokens] or rec["completions"] != expected:
        raise RuntimeError(f"{peer} minimal script: {rec['completions']} completions of lengths "
                           f"{rec['completion_lengths']}, expected {expected} of {args.settings.new_tokens}")
    rec.update(median_step_s=statistics.median(rec["step_s"]), cpu_busy_before=busy,
               omp_wait_policy=USER_ENV.get("OMP_WAIT_POLICY"), **steal)
    print(f"[round {round_ + 1}: {peer} minimal script beta={beta}] median {rec['median_step_s']:.3f}s", flush=True)
    return rec


def peer_check(arm_round_s: list[float], minimal_round_s: list[float], tolerance: float = PEER_TOLERANCE) -> dict:
    """Is a peer's arm at most `tolerance` slower than its minimal script? The rounds' medians come in
    pairs (arm and minimal script ran back to back in each round); the verdict is on the median of the
    pairs' ratios (arm / minimal), which the CPU's drift between rounds moves less than a ratio of pooled
    times would."""
    if not arm_round_s or len(arm_round_s) != len(minimal_round_s):
        raise ValueError(f"need one minimal-script median per arm round, got {len(arm_round_s)} and "
                         f"{len(minimal_round_s)}")
    ratios = [a / m for a, m in zip(arm_round_s, minimal_round_s)]
    ratio = statistics.median(ratios)
    return dict(arm_round_median_step_s=list(arm_round_s), minimal_round_median_step_s=list(minimal_round_s),
                round_ratios=ratios, ratio=ratio, tolerance=tolerance, ok=ratio <= 1.0 + tolerance)


def fraction(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def steal_cell(shares: list | None) -> str:
    """The hypervisor's steal while each round's worker ran, as percentages ("-" for older results)."""
    return ", ".join(f"{100 * x:.0f}" if x is not None else "n/a" for x in shares) if shares else "-"


def markdown(result: dict) -> str:
    s = result["settings"]
    gpu = any(r.get("peak_device_mib") is not None for r in result["records"])
    lines = ["| system | beta | median step s | min s | max s | CPU s per step | completion tokens/s | peak RSS MiB | "
             + ("peak device MiB | " if gpu else "") + "start-up s | first step s | steal % (rounds) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if gpu else "") + "---:|---:|---:|"]
    for r in result["records"]:
        first = f"{r['warmup_step_s'][0]:.1f}" if r["warmup_step_s"] else ""
        peak = r.get("peak_device_mib")
        device = (f"{peak:.0f} | " if peak is not None else "- | ") if gpu else ""
        lines.append(f"| {r['system']} | {r['beta']:g} | {r['median_step_s']:.3f} | {r['min_step_s']:.3f} | "
                     f"{r['max_step_s']:.3f} | {r['median_step_cpu_s']:.3f} | {r['completion_tokens_per_s']:.0f} | {r['peak_rss_mib']:.0f} | "
                     f"{device}{r['startup_s']:.1f} | {first} | {steal_cell(r.get('cpu_steal'))} |")
    if result.get("speedups"):
        lines += ["", "| ours vs | beta | times faster (pooled medians) | lowest round | highest round |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {x['system']} | {x['beta']:g} | {x['speedup']:.2f} | {x['round_min']:.2f} | {x['round_max']:.2f} |"
                  for x in result["speedups"]]
    if result.get("peer_check"):
        lines += ["", "| peer | beta | arm median s (rounds) | minimal script median s (rounds) | arm / minimal "
                  "(median of rounds) | rounds | within 10% |", "|---|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {c['system']} | {c['beta']:g} | {statistics.median(c['arm_round_median_step_s']):.3f} | "
                  f"{statistics.median(c['minimal_round_median_step_s']):.3f} | {c['ratio']:.3f} | "
                  f"{min(c['round_ratios']):.2f}-{max(c['round_ratios']):.2f} | {'yes' if c['ok'] else '**no**'} |"
                  for c in result["peer_check"]]
    d = result["device"]
    lines += ["", f"{len(s['prompts'])} prompts x {s['num_generations']} generations x {s['new_tokens']} tokens per "
              f"step, {result['model'].get('preset', 'tiny')} model, {s.get('dtype', 'float32')}, "
              f"{'LoRA rank ' + str(s['lora_rank']) if s.get('lora_rank') else 'full fine-tuning'}, "
              f"{'' if s.get('unroll_decode', 'auto') == 'auto' else 'our decode loop unroll ' + s['unroll_decode'] + ', '}"
              f"{result.get('rounds', 1)} rounds x {result['steps']} timed steps after "
              f"{result['warmup']} warm-up per system (the systems run in turn each round); {d['device']} "
              f"({d.get('cpu_model', 'CPU model not recorded')}), "
              f"{d['cpu_count']} CPU cores, {s['threads']} threads per system. {result['notes']}"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    from jaxrl_hier.logging.plots import pyplot, save_figure

    plt = pyplot()

    recs = result["records"]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['system']}\nbeta {r['beta']:g}" for r in recs]
    med = [r["median_step_s"] for r in recs]
    err = [[m - r["min_step_s"] for m, r in zip(med, recs)], [r["max_step_s"] - m for m, r in zip(med, recs)]]
    colors = [{"trl": "tab:red", "tunix": "tab:green", "ours": "tab:blue", "split": "tab:purple"}[r["system"]]
              for r in recs]
    x = list(range(len(recs)))
    ax.bar([i - 0.2 for i in x], med, 0.4, yerr=err, capsize=4, color=colors, label="wall (median, min-max)")
    ax.bar([i + 0.2 for i in x], [r["median_step_cpu_s"] for r in recs], 0.4, color=colors, alpha=0.45,
           hatch="//", label="CPU time of the process (median)")
    ax.set_xticks(x, labels)
    ax.legend(fontsize=8)
    ax.set(ylabel="seconds per GRPO step",
           title=f"GRPO step, {result['settings']['new_tokens']} tokens x 32 completions\n"
                 f"{result['device'].get('cpu_model', result['device']['device'])}", )
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    p.add_argument("--systems", nargs="+", default=["trl", "tunix", "ours"], metavar="SYSTEM",
                   help=f"any of {', '.join(SYSTEMS)}")
    p.add_argument("--steps", type=int, default=10, help="timed steps per system and beta")
    p.add_argument("--warmup", type=int, default=2, help="steps run before timing (compilation included)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of every system, side by side in turn (step times pooled over the rounds)")
    p.add_argument("--betas", type=float, nargs="+", default=[0.04, 0.0])
    p.add_argument("--threads", type=int, default=None, help="CPU threads per system (default: all cores)")
    p.add_argument("--quick", action="store_true", help="3 timed steps after 1 warm-up (a smoke run)")
    p.add_argument("--ckpt", type=Path, default=None,
                   help="where to write the checkpoint (default: a temporary directory)")
    p.add_argument("--notes", default="", help="appended to the notes recorded in grpo.json")
    p.add_argument("--preset", choices=PRESET_NAMES, default="tiny",
                   help="the model: tiny (2.97M, the CPU comparison) or a random model shaped like a Qwen2.5 checkpoint")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning; else LoRA of this rank on q/k/v/o")
    p.add_argument("--platform", choices=tuple(PLATFORMS), default="cpu", help="where the workers run")
    p.add_argument("--unroll-decode", choices=list(UNROLL_DECODE), default="auto",
                   help="ours: how the decode loop runs the layers (GRPOConfig.unroll_decode; auto = by size)")
    p.add_argument("--check-peers", action="store_true",
                   help="also run each peer's minimal script (benchmarks/llm_rl/grpo_minimal.py) beside its arm in every "
                        f"round; exit 1 when an arm is more than {PEER_TOLERANCE:.0%} slower than its script")
    p.add_argument("--omp-wait-policy", choices=OMP_WAIT_POLICIES, default="auto",
                   help="OMP_WAIT_POLICY of the workers (torch's threads): auto = PASSIVE when other jobs keep "
                        "the CPU busy, else torch's default; an OMP_WAIT_POLICY in the environment wins")
    p.add_argument("--cooldown-s", type=float, default=60.0,
                   help="before each worker, wait up to this long for the hypervisor to stop stealing CPU time "
                        "(under 5%% in a 1-s probe); each worker's steal is recorded either way (0: no wait)")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.rounds = 3, 1, 1
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system(s) {unknown}: --systems takes any of {', '.join(SYSTEMS)}.")
    if len(set(args.systems)) != len(args.systems):
        raise ConfigError(f"--systems names a system twice ({args.systems}); list each once.")
    if args.steps < 1 or args.warmup < 1:
        raise ConfigError(f"--steps ({args.steps}) and --warmup ({args.warmup}) must be at least 1: the first "
                          "step compiles and is never timed.")
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {args.rounds}.")
    if args.cooldown_s < 0:
        raise ConfigError(f"--cooldown-s must be >= 0 (0: no wait), got {args.cooldown_s}.")
    if any(b < 0 for b in args.betas) or len(set(args.betas)) != len(args.betas):
        raise ConfigError(f"--betas must be distinct and non-negative, got {args.betas}.")
    if args.check_peers and not set(args.systems) & set(PEERS):
        raise ConfigError(f"--check-peers needs a peer in --systems ({', '.join(PEERS)}).")
    missing = [s for s, module in (("trl", "trl"), ("tunix", "tunix")) if s in args.systems and
               importlib.util.find_spec(module) is None]
    if missing and not args.worker:
        raise ConfigError(f"{' and '.join(missing)} not installed: pip install -e '.[bench]' && "
                          "pip install --no-deps google-tunix==0.1.7 (or leave them out of --systems).")
    from jaxrl_hier.bench import cpu_count

    args.threads = args.threads or cpu_count()
    if args.threads < 1:
        raise ConfigError(f"--threads must be positive, got {args.threads}.")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; give a directory.")
    if args.ckpt is not None and args.ckpt.exists() and not args.ckpt.is_dir():
        raise ConfigError(f"--ckpt {args.ckpt} is a file; give a directory (the checkpoint is written there).")
    if args.lora_rank < 0:
        raise ConfigError(f"--lora-rank must be 0 (full fine-tuning) or positive, got {args.lora_rank}.")
    if not args.worker and "tunix" in args.systems and (args.dtype != "float32" or args.lora_rank or args.platform != "cpu"):
        raise ConfigError("the tunix worker runs float32 full fine-tuning on the CPU only; leave tunix out of "
                          "--systems for --dtype bfloat16, --lora-rank or --platform gpu.")
    args.settings = Settings(threads=args.threads, preset=args.preset, dtype=args.dtype, lora_rank=args.lora_rank,
                             platform=args.platform, unroll_decode=args.unroll_decode)
    return args


def run(args: argparse.Namespace) -> dict:
    from jaxrl_hier.bench import device_info

    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        workdir = Path(tmp)
        ckpt = args.ckpt or workdir / "ckpt"
        ckpt.mkdir(parents=True, exist_ok=True)
        model = make_checkpoint(ckpt, preset=args.preset, dtype=args.dtype)  # deterministic: same seed, same weights
        # Every round runs each (system, beta) once, the systems in an order rotated by one each round:
        # a shared VM's CPU speed drifts over minutes, and a system always run last would pay for it alone.
        runs: dict[tuple[str, float], list[dict]] = {}
        minimal: dict[tuple[str, float], list[dict]] = {}
        for round_ in range(args.rounds):
            order = args.systems[round_ % len(args.systems):] + args.systems[:round_ % len(args.systems)]
            for system in order:
                for beta in args.betas:
                    # --check-peers: the peer's minimal script right beside its arm, first every other round
                    minimal_first = args.check_peers and system in PEERS and round_ % 2 == 1
                    if minimal_first:
                        minimal.setdefault((system, beta), []).append(run_minimal(system, beta, ckpt, args, round_))
                    rec = run_system(system, beta, ckpt, args, workdir, round_)
                    if rec is not None:
                        runs.setdefault((system, beta), []).append(rec)
                    if args.check_peers and system in PEERS and not minimal_first:
                        minimal.setdefault((system, beta), []).append(run_minimal(system, beta, ckpt, args, round_))
        records = [merge_rounds(system, beta, runs[system, beta], args.settings)
                   for system in args.systems for beta in args.betas if (system, beta) in runs]
    checks = [dict(system=system, beta=beta, minimal_runs=minimal[system, beta],
                   **peer_check([r["median_step_s"] for r in runs[system, beta]],
                                [m["median_step_s"] for m in minimal[system, beta]]))
              for (system, beta) in minimal if (system, beta) in runs]
    # Whether other jobs shared the CPU: the 1-minute load average when the run started and ended.
    busy = [b for r in runs.values() for x in r for b in [x["cpu_busy_before"]] if b is not None]
    shared = bool(busy) and max(busy) > SHARED_CPU_BUSY
    notes = (f"Load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; other jobs kept the "
             f"CPU {min(busy, default=0):.0%}-{max(busy, default=0):.0%} busy in the second before each worker "
             f"({'a shared CPU' if shared else 'an idle CPU'}); on a loaded CPU absolute times are noisy, compare "
             "systems within one run. " + args.notes).strip()
    env = worker_env(args.threads, platform=args.platform,
                     wait_policy=omp_wait_policy(args.omp_wait_policy, 1.0 if shared else 0.0))
    return dict(device=device_info(), versions=versions(), model=model, settings=asdict(args.settings),
                worker_env={k: env.get(k) for k in WORKER_ENV_KEYS},
                steps=args.steps, warmup=args.warmup, rounds=args.rounds, betas=args.betas, systems=args.systems,
                speedups=speedups(records), cpu_shared=shared, omp_wait_policy_choice=args.omp_wait_policy,
                peer_check=checks,
                peak_memory="worker RSS high-water mark (getrusage ru_maxrss): framework, model, optimiser, "
                            "compiled programs; on a GPU also peak_device_mib: the allocator's high-water mark of "
                            "allocated bytes (JAX memory_stats peak_bytes_in_use; torch.cuda.max_memory_allocated)", notes=notes, records=records)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.worker:
        return run_worker(args.worker, args.beta, args.ckpt, args.steps, args.warmup, args.settings, args.result)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "grpo.json", result)
    atomic_write_text(args.out / "grpo.md", markdown(result))
    if result["records"]:
        plot(result, args.out / "grpo.png")
    print(f"wrote {args.out / 'grpo.json'}, grpo.md" + (", grpo.png" if result["records"] else ""))
    slow = [c for c in result["peer_check"] if not c["ok"]]
    for c in result["peer_check"]:
        print(f"peer check {c['system']} beta={c['beta']:g}: arm / minimal script {c['ratio']:.3f} (rounds "
              f"{min(c['round_ratios']):.2f}-{max(c['round_ratios']):.2f}): {'ok' if c['ok'] else 'SLOWER'}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
