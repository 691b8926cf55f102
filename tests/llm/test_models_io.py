"""Checkpoint I/O: RoBERTa encoder parity, sharded safetensors index, tokenizer, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import save_file

import jax
import jax.numpy as jnp

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import EncoderModel, LanguageModel, ModelConfig, load_pretrained, save_pretrained

ROBERTA = dict(vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
               max_position_embeddings=40, pad_token_id=1)
LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32, bos_token_id=None, eos_token_id=None)


def _redraw(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.15)
            elif "LayerNorm" in name or "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    torch.manual_seed(1)
    model = _redraw(transformers.RobertaModel(transformers.RobertaConfig(**ROBERTA))).eval()
    path = tmp_path_factory.mktemp("roberta")
    model.save_pretrained(path)
    return model, load_pretrained(path), path


# right-padded (pad_token_id 1), as RoBERTa tokenizers pad
R_IDS = np.array([[0, 11, 12, 13, 2, 1, 1], [0, 5, 6, 7, 8, 9, 2]], np.int64)
R_MASK = (R_IDS != 1).astype(np.int64)


def test_roberta_hidden_and_pooled_match_transformers(roberta):
    model, enc, _ = roberta
    assert isinstance(enc, EncoderModel) and enc.config.family == "roberta"
    with torch.no_grad():
        ref = model(torch.tensor(R_IDS), attention_mask=torch.tensor(R_MASK))
    hidden, pooled = enc.encode(enc.params, R_IDS, R_MASK)
    real = R_MASK.astype(bool)
    np.testing.assert_allclose(np.asarray(hidden)[real], ref.last_hidden_state.numpy()[real], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(enc.pooled(enc.params, R_IDS, R_MASK)), ref.pooler_output.numpy(),
                               atol=1e-4, rtol=1e-4)
    assert np.abs(ref.pooler_output.numpy()).max() > 0.3


def test_roberta_round_trip(roberta, tmp_path):
    model, enc, _ = roberta
    save_pretrained(enc, enc.params, tmp_path)
    back = transformers.AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        a = back(torch.tensor(R_IDS), attention_mask=torch.tensor(R_MASK)).pooler_output.numpy()
        b = model(torch.tensor(R_IDS), attention_mask=torch.tensor(R_MASK)).pooler_output.numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    torch.manual_seed(2)
    model = _redraw(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))).eval()
    single = tmp_path_factory.mktemp("single")
    model.save_pretrained(single)
    return model, single


def test_sharded_index_checkpoint_loads(llama_ckpt, tmp_path):
    model, single = llama_ckpt
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3  # really split over several files
    a, b = load_pretrained(tmp_path), load_pretrained(single)
    for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "again": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def test_tokenizer_loaded_and_saved_with_the_model(llama_ckpt, tmp_path):
    model, single = llama_ckpt
    assert load_pretrained(single).tokenizer is None  # no tokenizer files: None
    model.save_pretrained(tmp_path / "a")
    _tiny_tokenizer().save_pretrained(tmp_path / "a")
    lm = load_pretrained(tmp_path / "a")
    assert lm.tokenizer("hello world again")["input_ids"] == [2, 3, 4]
    save_pretrained(lm, lm.params, tmp_path / "b")
    assert load_pretrained(tmp_path / "b").tokenizer("world hello")["input_ids"] == [3, 2]


def test_missing_directory_and_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="model directory not found: .*nowhere"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        load_pretrained(tmp_path / "empty")
    transformers.LlamaConfig(**LLAMA).save_pretrained(tmp_path / "noweights")
    with pytest.raises(ConfigError, match="no weights in .*model.safetensors"):
        load_pretrained(tmp_path / "noweights")


def test_unsupported_architecture_lists_supported(tmp_path):
    transformers.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=8).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model_type='bert'.*supports llama, mistral, qwen2, qwen3, gpt2, roberta"):
        load_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="unsupported architecture"):
        ModelConfig.from_hf(transformers.T5Config())
    with pytest.raises(ConfigError, match="rope scaling type 'yarn'"):
        ModelConfig.from_hf(transformers.LlamaConfig(**LLAMA, rope_scaling=dict(rope_type="yarn", factor=2.0)))


def test_wrong_shape_tensor_names_both_shapes(llama_ckpt, tmp_path):
    _, single = llama_ckpt
    with safe_open(single / "model.safetensors", "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((40, 32), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((single / "config.json").read_text())
    with pytest.raises(ConfigError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' has shape \(40, 32\) but the "
                                          r"config implies \(48, 32\)"):
        load_pretrained(tmp_path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' .* missing"):
        load_pretrained(tmp_path)


def test_random_model_saves_as_a_transformers_checkpoint(tmp_path):
    """A model built without a checkpoint (benchmarks, tests) is written so transformers opens it."""
    hf = transformers.Qwen2Config(**LLAMA, tie_word_embeddings=True)
    lm = LanguageModel.random(hf, jax.random.key(0), jnp.float32)
    assert "lm_head" not in lm.params
    save_pretrained(lm, None, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = np.array([[3, 4, 5, 6]])
    with torch.no_grad():
        ref = back(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(lm.logits(lm.params, ids, np.ones_like(ids))), ref, atol=1e-5)


def test_gpt2_hub_layout_without_prefix_and_with_buffers(tmp_path):
    """The gpt2 / DialoGPT hub files name tensors without 'transformer.' and carry attn.bias buffers."""
    torch.manual_seed(3)
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    model = _redraw(transformers.GPT2LMHeadModel(cfg)).eval()
    model.save_pretrained(tmp_path / "std")
    with safe_open(tmp_path / "std" / "model.safetensors", "np") as f:
        tensors = {k.removeprefix("transformer."): f.get_tensor(k) for k in f.keys()}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))  # old causal-mask buffer
    (tmp_path / "hub").mkdir()
    save_file(tensors, tmp_path / "hub" / "model.safetensors", metadata={"format": "pt"})
    cfg.save_pretrained(tmp_path / "hub")
    lm = load_pretrained(tmp_path / "hub")
    assert lm.weight_prefix == ""
    ids = np.array([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(lm.logits(lm.params, ids, np.ones_like(ids))), ref, atol=1e-4, rtol=1e-4)
