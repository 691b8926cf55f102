"""Memory planner figures checked against real models: transformers' PyTorch modules, our own arrays
(init_params, init_lora, init_cache, the optax optimiser state) and XLA's compiled training step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest
import torch  # noqa: F401  (the test extra installs it; a missing one must fail, not skip)
import transformers

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import decoder, encoder, memory, memory_case
from jaxrl_hier.llm.heads import value_head_init
from jaxrl_hier.llm.lora import LoraConfig, init_lora
from jaxrl_hier.llm.model_config import ModelConfig

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
ROBERTA = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=66, type_vocab_size=2)


def _hf_configs():
    t = transformers
    return {
        "llama": t.LlamaConfig(**TINY),
        "llama_tied": t.LlamaConfig(**TINY, tie_word_embeddings=True),
        "llama_bias": t.LlamaConfig(**TINY, attention_bias=True, mlp_bias=True),
        "mistral": t.MistralConfig(**TINY),
        "qwen2": t.Qwen2Config(**TINY),
        "qwen3": t.Qwen3Config(**TINY, head_dim=12),
        "gpt2": t.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        "roberta": t.RobertaConfig(**ROBERTA),
    }


def _adamw_bytes(tree) -> int:
    """The optimiser llm_rl trains with, built here independently of the planner."""
    state = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.01)).init(tree)
    return memory.tree_nbytes(state)


@pytest.mark.parametrize("name", list(_hf_configs()))
def test_param_count_matches_transformers(name):
    """Includes Llama with attention_bias / mlp_bias, which the old second parser undercounted."""
    cfg = _hf_configs()[name]
    if name == "roberta":
        for pooler in (False, True):
            model = transformers.RobertaModel(cfg, add_pooling_layer=pooler)
            assert memory.count_params(cfg, pooler=pooler) == sum(p.numel() for p in model.parameters())
        return
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    expected = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert memory.count_params(cfg) == expected


def test_dict_and_hf_config_read_through_model_config():
    fields = {"model_type": "llama", **TINY, "attention_bias": True, "mlp_bias": True}
    assert memory.model_config_of(fields) == ModelConfig.from_hf(_hf_configs()["llama_bias"])
    biased, plain = memory.count_params(fields), memory.count_params({"model_type": "llama", **TINY})
    # q, k, v, o biases (32 + 16 + 16 + 32) and gate/up/down biases (48 + 48 + 32) in each of 2 layers
    assert biased - plain == 2 * (32 + 16 + 16 + 32 + 48 + 48 + 32)
    with pytest.raises(ConfigError, match="model_type"):
        memory.count_params(TINY)
    with pytest.raises(ConfigError, match="no LM head"):
        memory.count_params(_hf_configs()["roberta"], head="lm")


@pytest.mark.parametrize("name", ["llama_bias", "qwen2", "qwen3", "gpt2"])
def test_full_training_figures_equal_real_arrays(name):
    """Parameter, gradient, Adam and KV-cache bytes equal the nbytes of real arrays."""
    cfg = ModelConfig.from_hf(_hf_configs()[name])
    params = decoder.init_params(cfg, jax.random.key(0), jnp.bfloat16)
    spec = memory.ModelSpec("actor", cfg, dtype="bfloat16", train="full", batch=3, seq_len=8, kv_cache_len=40)
    m = memory.plan([spec]).models[0]
    real = memory.tree_nbytes(params)
    assert m.params == real and m.grads == real
    assert m.optimizer == _adamw_bytes(params) == 2 * real + 4  # two bfloat16 moments and an int32 count
    assert m.kv_cache == memory.tree_nbytes(decoder.init_cache(cfg, 3, 40, jnp.bfloat16))
    assert m.num_params == m.trainable_params == sum(x.size for x in jax.tree_util.tree_leaves(params))


def test_lora_figures_equal_real_arrays():
    """Adapters (float32) on a shared frozen backbone: only the adapters and their Adam state are added."""
    cfg = ModelConfig.from_hf(_hf_configs()["llama_bias"])
    targets = ("q_proj", "v_proj", "gate_proj", "down_proj")
    base = decoder.init_params(cfg, jax.random.key(0), jnp.bfloat16)
    lora = init_lora(cfg, LoraConfig(rank=4, target_modules=targets), jax.random.key(1))
    kw = dict(dtype="bfloat16", train="lora", lora_rank=4, lora_targets=targets, batch=2, seq_len=8)
    actor, guide = memory.plan([memory.ModelSpec("actor", cfg, **kw),
                                memory.ModelSpec("guide", cfg, shares_base_with="actor", **kw)]).models
    adapters = memory.tree_nbytes(lora.params)
    assert actor.params == memory.tree_nbytes(base) + adapters and guide.params == adapters
    assert actor.grads == guide.grads == adapters
    assert actor.optimizer == _adamw_bytes(lora.params) == 2 * adapters + 4
    n_lora = sum(x.size for x in jax.tree_util.tree_leaves(lora.params))
    assert actor.trainable_params == memory.count_lora_params(cfg, 4, targets) == n_lora


def test_lora_param_count_matches_formula_by_hand():
    cfg = _hf_configs()["llama"]
    # heads 4, head_dim 8: q 32->32, k/v 32->16, o 32->32; rank 4 -> 4 * (in + out) each, 2 layers
    by_hand = 2 * 4 * ((32 + 32) + (32 + 16) + (32 + 16) + (32 + 32))
    assert memory.count_lora_params(cfg, 4, ("q_proj", "k_proj", "v_proj", "o_proj")) == by_hand


def test_roberta_critic_figures_equal_real_arrays():
    """A float32 RoBERTa with pooler and value head, fully trained, and its frozen target copy."""
    cfg = ModelConfig.from_hf(_hf_configs()["roberta"])
    params = {**encoder.init_params(cfg, jax.random.key(0), jnp.float32, pooler=True),
              "value_head": value_head_init(jax.random.key(1), cfg.hidden_size)}
    kw = dict(dtype="float32", batch=4, seq_len=16, head="value", pooler=True, phase="critic")
    critic, target = memory.plan([memory.ModelSpec("critic", cfg, train="full", **kw),
                                  memory.ModelSpec("target", cfg, **kw)]).models
    real = memory.tree_nbytes(params)
    assert critic.params == target.params == real and critic.grads == real
    assert critic.optimizer == _adamw_bytes(params) and target.optimizer == target.grads == 0
    assert target.activations < critic.activations  # a forward keeps one layer, training all of them


def test_fp32_master_and_head_params():
    cfg = ModelConfig.from_hf(_hf_configs()["qwen2"])
    n = memory.count_params(cfg)
    m = memory.plan([memory.ModelSpec("a", cfg, train="full", fp32_master=True, head_params=10)]).models[0]
    assert m.params == 2 * (n + 10) - 10 * 2 + 10 * 4  # bfloat16 weights, float32 heads
    assert m.optimizer == 4 * (n + 10) + 8 * (n + 10) + 4  # float32 master copy, float32 moments, count


def _actor_ref(train="lora"):
    cfg = _hf_configs()["qwen2"]
    actor = memory.ModelSpec("actor", cfg, dtype="bfloat16", train=train, lora_rank=8, batch=8, seq_len=32,
                             kv_cache_len=48)
    ref = memory.ModelSpec("reference", cfg, dtype="bfloat16", train="frozen", batch=8, seq_len=32,
                           shares_base_with="actor" if train == "lora" else None, phase="actor")
    return actor, ref


def test_lora_reference_shares_base_and_phases():
    n = memory.count_params(_hf_configs()["qwen2"])
    lora, full = memory.plan(list(_actor_ref("lora"))), memory.plan(list(_actor_ref("full")))
    (a_lora, r_lora), (a_full, r_full) = lora.models, full.models
    assert r_lora.params == 0 and r_full.params == 2 * n and a_full.optimizer == 4 * n + 4
    assert lora.total < full.total
    # the reference's forward is in the actor's phase: the peak is everything held plus both transients
    assert lora.phases() == {"actor": a_lora.transient + r_lora.transient}
    assert lora.peak == lora.total
    split = memory.plan([_actor_ref("lora")[0], dataclasses.replace(_actor_ref("lora")[1], phase="ref")])
    assert split.peak == split.total - min(m.transient for m in split.models)
    text = full.table()
    assert "actor" in text and "reference" in text and "peak" in text and f"{full.models[0].total:,}" in text


def test_mesh_splits_params_and_cache_per_device():
    actor, _ = _actor_ref("full")
    one = memory.plan([actor]).models[0]
    four = memory.plan([actor], {"data": 1, "fsdp": 2, "tensor": 2}).models[0]
    assert four.params * 4 == pytest.approx(one.params, abs=4)
    # batch over fsdp (2), kv heads (2) over tensor (2): a quarter of the cache per device
    assert four.kv_cache * 4 == one.kv_cache
    data = memory.plan([actor], {"data": 4}).models[0]
    assert data.params == one.params and data.kv_cache * 4 == one.kv_cache
    assert data.activations < one.activations


def test_activation_switches():
    actor, _ = _actor_ref("full")
    base = memory.plan([actor]).models[0].activations
    for change in (dict(remat=True), dict(flash_attention=True), dict(micro_batch=2)):
        assert memory.plan([dataclasses.replace(actor, **change)]).models[0].activations < base, change
    assert memory.plan([dataclasses.replace(actor, logits_chunk=0)]).models[0].activations > base


def test_remat_counts_the_projection_outputs_the_decoder_keeps(monkeypatch):
    """With remat, a program small enough for the decoder to keep its projections' outputs
    (`decoder.saves_dots`) is planned with them: L * B * T * values per token, LoRA's products included."""
    from jaxrl_hier.llm import decoder
    from jaxrl_hier.llm.lora import proj_shapes

    for train in ("full", "lora"):
        actor, _ = _actor_ref(train)
        remat = dataclasses.replace(actor, remat=True)
        cfg = memory.model_config_of(actor.config)
        kept = memory.plan([remat]).models[0].activations
        monkeypatch.setattr(decoder, "REMAT_SAVED_DOTS_MAX_BYTES", 0)
        inputs_only = memory.plan([remat]).models[0].activations
        monkeypatch.undo()
        shapes = proj_shapes(cfg)
        targets = ("q_proj", "k_proj", "v_proj", "o_proj") if train == "lora" else ()
        values = sum(out for _, out in shapes.values()) + sum(actor.lora_rank + shapes[t][1] for t in targets)
        assert kept - inputs_only == cfg.num_layers * actor.batch * actor.seq_len * values * 2, train


def test_capacity_verdict_and_bad_input():
    actor, ref = _actor_ref("lora")
    assert memory.plan([actor, ref], capacity_gib=80).fits is True
    assert "DOES NOT FIT" in memory.plan([actor, ref], capacity_gib=1e-6).table()
    llama = {"model_type": "llama", **TINY}
    with pytest.raises(ConfigError, match="lora_rank"):
        memory.plan([memory.ModelSpec("a", llama, train="lora")])
    with pytest.raises(ConfigError, match="shares_base_with"):
        memory.plan([memory.ModelSpec("ref", llama, shares_base_with="actor")])
    with pytest.raises(ConfigError, match="mesh axes"):
        memory.plan([actor], {"model": 2})
    with pytest.raises(ConfigError, match="LoRA target"):
        memory.plan([memory.ModelSpec("a", llama, train="lora", lora_rank=2, lora_targets=("qkv",))])
    with pytest.raises(ConfigError, match="micro_batch"):
        memory.plan([memory.ModelSpec("a", llama, batch=2, micro_batch=4)])


def test_original_case_naive_runs_out_and_ours_fits(capsys):
    """The guidance agent's case: the copies exceed 44.53 GiB (even their weights and Adam state
    alone), LoRA roles on one backbone fit under 44.53 GB (10^9 bytes, the stricter reading)."""
    naive, ours = memory_case.original_plans()
    cap_gib = int(44.53 * 2**30)
    assert naive.peak > cap_gib and naive.column("held") > cap_gib and naive.fits is False
    assert ours.peak < 44.53e9 and ours.fits is True
    rows = {m.role: m for m in ours.models}
    assert rows["reference"].params == 0 and rows["guidance"].params == rows["guidance"].grads  # adapters only
    assert rows["actor+backbone"].params > 2 * 3.2e9  # the one bfloat16 backbone
    assert set(m.role for m in naive.models) == {"actor (base)", "reference", "guidance", "critic", "target critic",
                                                 "value function"}
    memory_case.main([])
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and out.count("fits") == 1
    for m in naive.models + ours.models:  # every row's bytes are printed
        assert f"{m.total:,}" in out


def test_activation_estimate_against_compiled_step():
    """The estimate against XLA's memory_analysis of the real LoRA training step (float32, CPU):
    within 0.7..1.3 (docs/llm_memory.md reports the measured ratios)."""
    cfg = ModelConfig.from_hf(transformers.LlamaConfig(**{**TINY, "vocab_size": 256}, tie_word_embeddings=True))
    spec = memory.ModelSpec("actor", cfg, dtype="float32", train="lora", lora_rank=4, batch=2, seq_len=48)
    estimate = memory.plan([spec]).models[0].activations
    xla = memory.compiled_step_memory(cfg, 2, 48, "float32", lora_rank=4)
    assert 0.7 < estimate / xla["temp_bytes"] < 1.3, (estimate, xla)
    assert xla["output_bytes"] >= memory.count_lora_params(cfg, 4, spec.lora_targets) * 4  # the adapters' grads
