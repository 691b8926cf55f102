"""The guidance-agent case study of the memory planner (`jaxrl_hier.llm.memory`, docs/llm_memory.md):
a PyTorch hierarchical guidance system ran out of memory on a 44.53 GiB device; here are its models
(a Llama-3.2-3B-shaped backbone, a RoBERTa-base critic with ArCHer's heads) with the original's
sizes, planned two ways (`original_plans`: full copies, or one backbone with LoRA roles), and our
layout run for real (`measured_layout_peak`, `benchmarks/llm/llm_memory_plan.py --run`).

    python -m jaxrl_hier.llm.memory_case [--micro-batch N] [--lora-rank R]   # the two tables
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.memory import (device_memory_stats, dtype_of, GIB, make_optimizer, MemoryPlan, model_config_of,
                                    ModelSpec, param_shapes, plan, training_step, tree_nbytes, _step_functions)
from jaxrl_hier.llm.model_config import ModelConfig


def _layout_specs(llm: Any = None, critic: Any = None, *, batch: int = 16, seq_len: int = 512,
                  critic_batch: int = 64, micro_batch: int = 4, lora_rank: int = 16) -> list[ModelSpec]:
    """`original_setup`'s "ours" specs with other models or sizes (the defaults give them unchanged):
    LLM rows `batch` x `seq_len` in micro-batches of `micro_batch` (the actor's KV cache `seq_len`
    slots), critic `critic_batch` sequences in micro-batches of 2 * `micro_batch`, ArCHer's heads
    sized for the critic's hidden width."""
    import dataclasses

    if min(batch, seq_len, critic_batch, micro_batch, lora_rank) < 1:
        raise ConfigError("batch, seq_len, critic_batch, micro_batch and lora_rank must be >= 1.")
    micro = min(int(micro_batch), int(batch))
    out = []
    for spec in original_setup(micro_batch, lora_rank)[1]:
        if model_config_of(spec.config).is_decoder:
            kw: dict[str, Any] = dict(config=model_config_of(llm if llm is not None else spec.config),
                                      batch=int(batch), seq_len=int(seq_len), micro_batch=micro)
            if spec.kv_cache_len:
                kw["kv_cache_len"] = int(seq_len)
        else:
            enc = model_config_of(critic if critic is not None else spec.config)
            kw = dict(config=enc, batch=int(critic_batch), seq_len=int(seq_len),
                      micro_batch=min(2 * micro, int(critic_batch)), head_params=archer_head_params(enc.hidden_size))
        out.append(dataclasses.replace(spec, **kw))
    return out


def _analysis(compiled: Any) -> dict[str, int | None]:
    """XLA's memory_analysis() of a compiled program (None where the backend gives none)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        stats = None
    names = {"temp_bytes": "temp_size_in_bytes", "argument_bytes": "argument_size_in_bytes",
             "output_bytes": "output_size_in_bytes", "alias_bytes": "alias_size_in_bytes"}
    return {k: (None if stats is None or getattr(stats, a, None) is None else int(getattr(stats, a)))
            for k, a in names.items()}


def measured_layout_peak(llm: Any = None, critic: Any = None, *, batch: int = 16, seq_len: int = 512,
                         critic_batch: int = 64, micro_batch: int = 4, lora_rank: int = 16, tau: float = 0.1,
                         seed: int = 0, log: Any = None) -> dict[str, Any]:
    """RUN our layout of `original_setup` (table (b)) on the default device and measure its memory.

    The defaults are the original set-up: the Llama-3.2-3B-shaped bfloat16 backbone (`llama_3_2_3b`),
    batch 16 x 512 tokens, micro-batch 4, LoRA rank 16 on all seven projections, the float32
    RoBERTa-base critic (`roberta_base`); `llm`, `critic` (ModelConfigs) and the sizes replace them
    (tests run tiny ones). Random arrays are made with the project's own init functions and held for
    the whole run, as the plan holds them: the backbone (`decoder.init_params`), the actor's and the
    guidance's adapters (`init_lora`) each with `make_optimizer()`'s state, the critic (encoder
    weights, a value head, and a float32 vector standing in for the rest of ArCHer's head
    parameters, so that the critic holds the plan's `head_params`), its AdamW state and its target
    copy, and the actor's KV cache (`decoder.init_cache`, batch x seq_len slots). So the arrays' bytes
    equal the plan's held bytes exactly.

    Phases, each a jitted program compiled first (before anything is allocated, from the arrays'
    shapes), then run once in this order and blocked on: "actor" (`training_step` on one micro-batch
    of micro_batch x seq_len tokens + the optimiser update of the actor's adapters, old adapters and
    state donated), "reference" (token log-probs with the adapters off, no gradient), "guidance" (as
    the actor, its own adapters), "critic" (the encoder's `training_step` on 2 * micro_batch
    sequences + the update of all its weights), "target critic" (the target's values on the same
    sequences, no gradient), "polyak" (`optax.incremental_update` of the target, step `tau`).

    After each, `jax.devices()[0].memory_stats()`'s bytes_in_use and peak_bytes_in_use (the peak is
    cumulative since the process started; both None on a backend without allocator statistics such
    as XLA:CPU). Returns a dict: the set-up, the held bytes (of the arrays, and measured), each
    phase's loss, update norm, compile and run seconds, `compiled.memory_analysis()` figures and
    memory after it, the overall measured peak, the plan's figures for the same specs (`plan`) and
    the ratios measured / plan. `log(str)`, if given, reports progress.
    """
    import time

    import jax
    import jax.numpy as jnp
    import optax

    from jaxrl_hier.llm import decoder, encoder
    from jaxrl_hier.llm.heads import value_head_init
    from jaxrl_hier.llm.lora import LoraConfig, init_lora

    say = log or (lambda msg: None)
    specs = _layout_specs(llm, critic, batch=batch, seq_len=seq_len, critic_batch=critic_batch,
                          micro_batch=micro_batch, lora_rank=lora_rank)
    the_plan = plan(specs, capacity_gib=ORIGINAL_CAPACITY_GIB,
                    title="(b) ours: one frozen backbone, LoRA actor and guidance, reference = adapters off")
    roles = {s.role: s for s in specs}
    actor, guidance, crit = roles["actor+backbone"], roles["guidance"], roles["critic"]
    lm_cfg, enc_cfg = model_config_of(actor.config), model_config_of(crit.config)
    if seq_len + enc_cfg.pad_token_id + 1 > enc_cfg.max_position_embeddings:
        raise ConfigError(f"seq_len {seq_len} does not fit the critic's {enc_cfg.max_position_embeddings} positions.")
    lm_micro, enc_micro = actor.micro_batch or actor.batch, crit.micro_batch or crit.batch
    rest_heads = max(crit.head_params - (enc_cfg.hidden_size + 1), 0)
    device = jax.devices()[0]
    opt = make_optimizer()

    def lora_config(spec: ModelSpec) -> Any:
        return LoraConfig(rank=spec.lora_rank, target_modules=tuple(spec.lora_targets),
                          dtype=str(dtype_of(spec.lora_dtype)))

    def allocate(key: Any) -> dict[str, Any]:
        ks = jax.random.split(key, 8)
        actor_lora = init_lora(lm_cfg, lora_config(actor), ks[1])
        guidance_lora = init_lora(lm_cfg, lora_config(guidance), ks[2])
        critic_params = dict(encoder.init_params(enc_cfg, ks[3], dtype_of(crit.dtype), pooler=crit.pooler))
        critic_params["value_head"] = value_head_init(ks[4], enc_cfg.hidden_size)
        critic_params["archer_heads"] = 0.02 * jax.random.normal(ks[5], (rest_heads,), jnp.float32)
        return {
            "backbone": decoder.init_params(lm_cfg, ks[0], dtype_of(actor.dtype)),
            "actor": actor_lora, "actor_opt": opt.init(actor_lora),
            "guidance": guidance_lora, "guidance_opt": opt.init(guidance_lora),
            "critic": critic_params, "critic_opt": opt.init(critic_params),
            "target_critic": jax.tree_util.tree_map(jnp.copy, critic_params),
            "kv_cache": decoder.init_cache(lm_cfg, actor.batch, actor.kv_cache_len, dtype_of(actor.dtype)),
        }

    def inputs(key: Any) -> dict[str, Any]:
        k1, k2 = jax.random.split(key)
        return {"lm_ids": jax.random.randint(k1, (lm_micro, seq_len), 0, lm_cfg.vocab_size, jnp.int32),
                "lm_mask": jnp.ones((lm_micro, seq_len), jnp.int32),
                "enc_ids": jax.random.randint(k2, (enc_micro, seq_len), 0, enc_cfg.vocab_size, jnp.int32),
                "enc_mask": jnp.ones((enc_micro, seq_len), jnp.int32)}

    # the programs: the training steps are `training_step`'s, the forwards its score functions
    def adapter_step(spec: ModelSpec) -> Any:
        step, (shapes, *_) = training_step(lm_cfg, lm_micro, seq_len, spec.dtype, lora_rank=spec.lora_rank,
                                           lora_targets=spec.lora_targets, logits_chunk=spec.logits_chunk)

        def run(params: Any, lora: Any, opt_state: Any, ids: Any, mask: Any) -> Any:
            loss, grads = step(params, lora, ids, mask)
            updates, opt_state = opt.update(grads, opt_state, lora)
            return loss, optax.tree.norm(updates), optax.apply_updates(lora, updates), opt_state

        return jax.jit(run, donate_argnums=(1, 2))

    critic_loss_step, _ = training_step(enc_cfg, enc_micro, seq_len, crit.dtype, logits_chunk=crit.logits_chunk)

    def critic_run(params: Any, opt_state: Any, ids: Any, mask: Any) -> Any:
        loss, grads = critic_loss_step(params, None, ids, mask)
        updates, opt_state = opt.update(grads, opt_state, params)
        return loss, optax.tree.norm(updates), optax.apply_updates(params, updates), opt_state

    lm_score, _ = _step_functions(lm_cfg, param_shapes(lm_cfg, actor.dtype, "lm"), actor.logits_chunk)
    enc_score, _ = _step_functions(enc_cfg, None)
    key = jax.random.key(seed)
    k_state, k_inputs = jax.random.split(key)
    s, x = jax.eval_shape(allocate, k_state), jax.eval_shape(inputs, k_inputs)
    actor_prog = adapter_step(actor)
    same = all(getattr(actor, f) == getattr(guidance, f) for f in ("lora_rank", "lora_targets", "lora_dtype",
                                                                   "logits_chunk", "dtype"))
    programs = [  # (name, plan phase, jitted, argument shapes)
        ("actor", actor.phase, actor_prog, (s["backbone"], s["actor"], s["actor_opt"], x["lm_ids"], x["lm_mask"])),
        ("reference", roles["reference"].phase, jax.jit(lambda p, ids, m: lm_score(p, None, ids, m)),
         (s["backbone"], x["lm_ids"], x["lm_mask"])),
        ("guidance", guidance.phase, actor_prog if same else adapter_step(guidance),
         (s["backbone"], s["guidance"], s["guidance_opt"], x["lm_ids"], x["lm_mask"])),
        ("critic", crit.phase, jax.jit(critic_run, donate_argnums=(0, 1)),
         (s["critic"], s["critic_opt"], x["enc_ids"], x["enc_mask"])),
        ("target critic", roles["target critic"].phase, jax.jit(lambda p, ids, m: enc_score(p, None, ids, m)),
         (s["target_critic"], x["enc_ids"], x["enc_mask"])),
        ("polyak", None, jax.jit(lambda new, old: optax.incremental_update(new, old, tau), donate_argnums=(1,)),
         (s["critic"], s["target_critic"])),
    ]
    baseline = device_memory_stats(device)
    compiled: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}
    for name, phase, fn, shapes in programs:
        t0 = time.perf_counter()
        compiled[name] = fn.lower(*shapes).compile()
        records[name] = {"name": name, "plan_phase": phase, "compile_s": time.perf_counter() - t0,
                         "compiled": _analysis(compiled[name])}
        say(f"compiled {name} in {records[name]['compile_s']:.1f} s")
    after_compile = device_memory_stats(device)

    t0 = time.perf_counter()
    state = jax.block_until_ready(allocate(k_state))
    data = jax.block_until_ready(inputs(k_inputs))
    alloc_s = time.perf_counter() - t0
    after_alloc = device_memory_stats(device)
    arrays = {name: tree_nbytes(tree) for name, tree in state.items()}
    say(f"allocated {sum(arrays.values()) / GIB:.3f} GiB of arrays in {alloc_s:.1f} s "
        f"(bytes_in_use {after_alloc['bytes_in_use']})")

    def run(name: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled[name](*args))
        rec = records[name]
        rec["run_s"] = time.perf_counter() - t0
        rec.update(device_memory_stats(device))
        say(f"ran {name} in {rec['run_s']:.2f} s: bytes_in_use {rec['bytes_in_use']}, "
            f"peak_bytes_in_use {rec['peak_bytes_in_use']}")
        return out

    def adapter_phase(name: str) -> None:
        loss, norm, state[name], state[f"{name}_opt"] = run(name, state["backbone"], state[name], state[f"{name}_opt"],
                                                            data["lm_ids"], data["lm_mask"])
        records[name].update(loss=float(loss), update_norm=float(norm))

    adapter_phase("actor")
    ref = run("reference", state["backbone"], data["lm_ids"], data["lm_mask"])
    records["reference"].update(loss=-float(jnp.mean(ref)))
    del ref
    adapter_phase("guidance")
    loss, norm, state["critic"], state["critic_opt"] = run("critic", state["critic"], state["critic_opt"],
                                                           data["enc_ids"], data["enc_mask"])
    records["critic"].update(loss=float(loss), update_norm=float(norm))
    values = run("target critic", state["target_critic"], data["enc_ids"], data["enc_mask"])
    records["target critic"].update(loss=float(jnp.mean(values ** 2)))
    del values
    before = np.asarray(state["target_critic"]["value_head"]["kernel"])  # a host copy: the old target is donated
    state["target_critic"] = run("polyak", state["critic"], state["target_critic"])
    change = np.abs(np.asarray(state["target_critic"]["value_head"]["kernel"]) - before)
    records["polyak"].update(target_change=float(change.max()))

    phases = [records[name] for name, *_ in programs]
    peaks = [r["peak_bytes_in_use"] for r in phases if r["peak_bytes_in_use"] is not None]
    peak = max(peaks) if peaks else None
    held_measured = (None if after_alloc["bytes_in_use"] is None
                     else after_alloc["bytes_in_use"] - (baseline["bytes_in_use"] or 0))
    plan_held, plan_phases = the_plan.column("held"), the_plan.phases()
    transient = None if peak is None or after_alloc["bytes_in_use"] is None else peak - after_alloc["bytes_in_use"]
    ratio = lambda a, b: None if a is None or not b else a / b  # noqa: E731
    return {
        "setup": {"llm": lm_cfg.model_type, "llm_layers": lm_cfg.num_layers, "llm_hidden": lm_cfg.hidden_size,
                  "llm_vocab": lm_cfg.vocab_size, "llm_dtype": actor.dtype, "critic": enc_cfg.model_type,
                  "critic_layers": enc_cfg.num_layers, "critic_hidden": enc_cfg.hidden_size,
                  "critic_dtype": crit.dtype, "batch": actor.batch, "seq_len": seq_len, "micro_batch": lm_micro,
                  "critic_batch": crit.batch, "critic_micro_batch": enc_micro, "lora_rank": actor.lora_rank,
                  "lora_targets": list(actor.lora_targets), "kv_cache_len": actor.kv_cache_len,
                  "critic_head_params": crit.head_params, "tau": tau, "seed": seed},
        "device": f"{device.platform}:{device.device_kind}",
        "memory_stats_available": baseline["peak_bytes_in_use"] is not None,
        "baseline": baseline, "after_compile": after_compile,
        "held": {"arrays": arrays, "array_bytes": sum(arrays.values()), "measured_bytes": held_measured,
                 **after_alloc, "alloc_s": alloc_s, "plan_bytes": plan_held},
        "phases": phases,
        "peak_bytes": peak,
        "largest_transient_bytes": transient,
        "fits_original_capacity": None if peak is None else peak <= int(ORIGINAL_CAPACITY_GIB * GIB),
        "plan": {"peak_bytes": the_plan.peak, "held_bytes": plan_held, "phases": plan_phases,
                 "peak_phase": the_plan.peak_phase, "largest_phase_bytes": the_plan.peak - plan_held,
                 "sum_bytes": the_plan.total, "capacity_bytes": the_plan.capacity_bytes, "fits": the_plan.fits,
                 "rows": [{"role": m.role, "phase": m.phase, "held": m.held, "transient": m.transient}
                          for m in the_plan.models],
                 "table": the_plan.table()},
        "ratio_peak_measured_over_plan": ratio(peak, the_plan.peak),
        "ratio_held_measured_over_plan": ratio(held_measured, plan_held),
        "ratio_transient_measured_over_plan": ratio(transient, the_plan.peak - plan_held),
    }


# ----------------------------------------------------------------------------- the case that ran out

#: the device the PyTorch guidance system ran out of memory on (PyTorch reports 44.53 GiB for it)
ORIGINAL_CAPACITY_GIB = 44.53


def llama_3_2_3b() -> ModelConfig:
    """Llama-3.2-3B's architecture, written from its published config.json (no download)."""
    return ModelConfig(
        model_type="llama", family="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192,
        num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128, max_position_embeddings=131072, norm="rms",
        norm_eps=1e-5, activation="silu", gated_mlp=True, rope=True, rope_theta=500000.0, rope_type="llama3",
        rope_factor=32.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_positions=8192,
        tie_word_embeddings=True)


def roberta_base() -> ModelConfig:
    """roberta-base's architecture, written from its published config.json (no download)."""
    return ModelConfig(
        model_type="roberta", family="roberta", vocab_size=50265, hidden_size=768, intermediate_size=3072,
        num_layers=12, num_heads=12, num_kv_heads=12, head_dim=64, max_position_embeddings=514, norm="layer",
        norm_eps=1e-5, activation="gelu", gated_mlp=False, rope=False, qkv_bias=True, o_bias=True, mlp_bias=True,
        tie_word_embeddings=True, pad_token_id=1, type_vocab_size=1)


def archer_head_params(hidden: int) -> int:
    """ArCHer's four critic MLPs on the encoder's features: Q1, Q2 on [obs; action] (2H -> H -> H -> 1),
    V1, V2 on the observation (H -> H -> H -> 1), with biases."""
    q = 2 * hidden * hidden + hidden + hidden * hidden + hidden + hidden + 1
    v = hidden * hidden + hidden + hidden * hidden + hidden + hidden + 1
    return 2 * q + 2 * v


def original_setup(micro_batch: int = 4, lora_rank: int = 16) -> tuple[list[ModelSpec], list[ModelSpec]]:
    """(naive, ours): the guidance agent's models with the original's sizes (docs/llm_memory.md).

    Sizes of the original: base (LLM) batch 16, critic batch 32 transitions (observation and action
    encoded separately: 64 sequences), sequence length 512. Gradients are accumulated over
    micro-batches of `micro_batch` rows (transitions for the critic): the original used 8; the
    default 4 fits even by XLA's float32 figure for our actor step (docs/llm_memory.md).

    Naive, the PyTorch layout: three full bfloat16 copies of the LLM (actor and guidance fully
    trained with AdamW, moments in bfloat16 as torch keeps them for bfloat16 weights; a frozen
    reference), a float32 RoBERTa-base critic (with pooler) with ArCHer's heads, its target copy and
    a separate RoBERTa-base value function; transformers' fused (SDPA) attention, full [B, T, V] logits.

    Ours: one frozen bfloat16 backbone, actor and guidance as LoRA adapters (rank `lora_rank` on all
    seven projections), the reference = adapters off, the same critic with V1/V2 among its heads (no
    separate value function; masked-mean features, no pooler) and its target copy; scoring through
    `token_logprobs` (128-position logit chunks) and the attention `jaxrl_hier.llm` computes (T x T
    probabilities kept).
    """
    llm, enc = llama_3_2_3b(), roberta_base()
    heads = archer_head_params(enc.hidden_size)
    base, seq, critic_seqs = 16, 512, 64
    micro = min(micro_batch, base)
    lm_kw = dict(dtype="bfloat16", batch=base, seq_len=seq, micro_batch=micro)
    critic_kw = dict(dtype="float32", batch=critic_seqs, seq_len=seq, micro_batch=2 * micro, head="none",
                     head_params=heads, phase="critic")
    all7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    naive = [
        ModelSpec("actor (base)", llm, train="full", kv_cache_len=seq, flash_attention=True, logits_chunk=0,
                  phase="actor", **lm_kw),
        ModelSpec("reference", llm, train="frozen", flash_attention=True, logits_chunk=0, phase="actor", **lm_kw),
        ModelSpec("guidance", llm, train="full", flash_attention=True, logits_chunk=0, phase="guidance", **lm_kw),
        ModelSpec("critic", enc, train="full", flash_attention=True, pooler=True, **critic_kw),
        ModelSpec("target critic", enc, train="frozen", flash_attention=True, pooler=True, **critic_kw),
        ModelSpec("value function", enc, dtype="float32", train="full", batch=32, seq_len=seq, micro_batch=micro,
                  head="value", pooler=True, flash_attention=True, phase="value"),
    ]
    lora_kw = dict(lora_rank=lora_rank, lora_targets=all7)
    ours = [
        ModelSpec("actor+backbone", llm, train="lora", kv_cache_len=seq, phase="actor", **lora_kw, **lm_kw),
        ModelSpec("reference", llm, train="frozen", shares_base_with="actor+backbone", phase="actor", **lm_kw),
        ModelSpec("guidance", llm, train="lora", shares_base_with="actor+backbone", phase="guidance", **lora_kw,
                  **lm_kw),
        ModelSpec("critic", enc, train="full", **critic_kw),
        ModelSpec("target critic", enc, train="frozen", **critic_kw),
    ]
    return naive, ours


def original_plans(micro_batch: int = 4, lora_rank: int = 16) -> tuple[MemoryPlan, MemoryPlan]:
    """The two tables of the case that ran out: (naive copies, ours) against 44.53 GiB."""
    naive, ours = original_setup(micro_batch, lora_rank)
    return (plan(naive, capacity_gib=ORIGINAL_CAPACITY_GIB,
                 title="(a) naive: full copies (base LLM, reference, guidance; critic, target critic, value fn)"),
            plan(ours, capacity_gib=ORIGINAL_CAPACITY_GIB,
                 title="(b) ours: one frozen backbone, LoRA actor and guidance, reference = adapters off"))


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m jaxrl_hier.llm.memory_case`: print the naive and our table for the original set-up."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m jaxrl_hier.llm.memory_case",
                                 description="Memory of the guidance agent (Llama-3.2-3B-shaped, bfloat16) on a "
                                             f"{ORIGINAL_CAPACITY_GIB} GiB device: full copies vs LoRA roles.")
    ap.add_argument("--micro-batch", type=int, default=4,
                    help="rows per gradient micro-batch (default 4; the original used 8, docs/llm_memory.md)")
    ap.add_argument("--lora-rank", type=int, default=16)
    args = ap.parse_args(argv)
    if not 1 <= args.micro_batch <= 16 or args.lora_rank < 1:
        ap.error("--micro-batch must be in 1..16 (the base batch is 16) and --lora-rank >= 1.")
    naive, ours = original_plans(args.micro_batch, args.lora_rank)
    print("Llama-3.2-3B-shaped LLM (bfloat16), RoBERTa-base critic (float32); base batch 16, critic batch 32, "
          f"sequence 512, micro-batch {args.micro_batch}\n")
    print(naive.table(), "\n")
    print(ours.table())


if __name__ == "__main__":
    main()
