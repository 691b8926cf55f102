"""`memory_case.measured_layout_peak` runs our layout for real (tiny models on CPU here), and
`memory.compiled_step_memory` still compiles the same step after its move into `training_step`."""

from __future__ import annotations

import math

import jax
import pytest

from jaxrl_hier.llm import memory, memory_case
from jaxrl_hier.llm.model_config import ModelConfig

LLM = ModelConfig(model_type="llama", family="llama", vocab_size=256, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128,
                  tie_word_embeddings=True)
ENC = ModelConfig(model_type="roberta", family="roberta", vocab_size=128, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=4, head_dim=8, max_position_embeddings=66, norm="layer",
                  activation="gelu", gated_mlp=False, rope=False, qkv_bias=True, o_bias=True, mlp_bias=True,
                  tie_word_embeddings=True, pad_token_id=1, type_vocab_size=1)


def test_measured_layout_peak_runs_every_phase():
    r = memory_case.measured_layout_peak(LLM, ENC, batch=4, seq_len=32, critic_batch=8, micro_batch=2, lora_rank=2)
    names = [p["name"] for p in r["phases"]]
    assert names == ["actor", "reference", "guidance", "critic", "target critic", "polyak"]
    assert [p["plan_phase"] for p in r["phases"]] == ["actor", "actor", "guidance", "critic", "critic", None]
    assert r["setup"]["micro_batch"] == 2 and r["setup"]["critic_micro_batch"] == 4
    # the held arrays are exactly the plan's held bytes (weights, optimiser states, KV cache)
    specs = memory_case._layout_specs(LLM, ENC, batch=4, seq_len=32, critic_batch=8, micro_batch=2, lora_rank=2)
    p = memory.plan(specs)
    assert r["held"]["array_bytes"] == r["held"]["plan_bytes"] == p.column("held")
    assert r["plan"]["peak_bytes"] == p.peak and r["plan"]["phases"] == p.phases()
    assert set(r["held"]["arrays"]) == {"backbone", "actor", "actor_opt", "guidance", "guidance_opt", "critic",
                                        "critic_opt", "target_critic", "kv_cache"}
    assert r["held"]["arrays"]["kv_cache"] == memory.kv_cache_bytes(LLM, 4, 32, "bfloat16")
    for ph in r["phases"]:
        assert ph["compiled"]["temp_bytes"] is not None and ph["run_s"] >= 0 and ph["compile_s"] >= 0
        if ph["name"] != "polyak":
            assert math.isfinite(ph["loss"]) and ph["loss"] > 0
    for name in ("actor", "guidance", "critic"):  # the optimiser moved the trained parameters
        assert 0 < r["phases"][names.index(name)]["update_norm"] < 1
    assert r["phases"][names.index("polyak")]["target_change"] > 0
    # reference = the actor's backbone with adapters off: the actor's loss before its update
    assert r["phases"][names.index("reference")]["loss"] == pytest.approx(r["phases"][0]["loss"], rel=1e-4)
    stats = jax.devices()[0].memory_stats()
    if stats is None:  # XLA:CPU: no allocator statistics, recorded as None
        assert r["peak_bytes"] is None and r["ratio_peak_measured_over_plan"] is None
        assert r["memory_stats_available"] is False
    else:
        assert r["peak_bytes"] > 0 and r["ratio_peak_measured_over_plan"] > 0


def test_layout_defaults_are_the_original_setup():
    assert memory_case._layout_specs() == memory_case.original_setup()[1]


def test_compiled_step_memory_unchanged():
    """The figures compiled_step_memory gave before the step moved into training_step (jax 0.10.2, XLA:CPU,
    under the XLA flags of tests/conftest.py: with its elemental emitters the decoder's step takes 64
    more temporary bytes than with the fusion emitters, 1,165,768 against 1,165,704, and the encoder's
    192 more, 647,280 against 647,088)."""
    if jax.__version__ != "0.10.2" or jax.default_backend() != "cpu":
        pytest.skip("reference figures were taken with jax 0.10.2 on XLA:CPU")
    assert memory.compiled_step_memory(LLM, 2, 48, "float32", lora_rank=4) == {
        "temp_bytes": 1165768, "argument_bytes": 102784, "output_bytes": 7244}
    assert memory.compiled_step_memory(ENC, 2, 32, "float32") == {
        "temp_bytes": 647280, "argument_bytes": 85892, "output_bytes": 85576}
    fn, (params, adapters, ids, mask) = memory.training_step(LLM, 2, 48, "float32", lora_rank=4)
    assert adapters is not None and ids.shape == mask.shape == (2, 48)
    assert memory.tree_nbytes(jax.eval_shape(fn, params, adapters, ids, mask)[1]) == memory.tree_nbytes(adapters)
