"""Sharding: partition rules cover every parameter; on 4 and 8 simulated CPU devices the loaded,
sharded models give the 1-device logits (one subprocess, XLA_FLAGS set before jax starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transformers

import jax
from jax.sharding import PartitionSpec as P

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm import LoraConfig, ModelConfig, decoder, encoder, init_lora, make_mesh, sharding

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32)
CONFIGS = {
    "llama": transformers.LlamaConfig(**TINY, attention_bias=True, mlp_bias=True),
    "llama_tied": transformers.LlamaConfig(**TINY, tie_word_embeddings=True),
    "qwen2": transformers.Qwen2Config(**TINY),
    "qwen3": transformers.Qwen3Config(**TINY, head_dim=16),
    "mistral": transformers.MistralConfig(**TINY),
    "gpt2": transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32),
    "roberta": transformers.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=48, max_position_embeddings=40),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_parameter_has_a_partition_rule(name):
    cfg = ModelConfig.from_hf(CONFIGS[name])
    shapes = decoder.param_shapes(cfg) if cfg.is_decoder else encoder.param_shapes(cfg)
    mesh = make_mesh(1, 1, 1)
    specs = {sharding.path_str(p): sharding.spec_for(sharding.path_str(p), leaf.shape, mesh)
             for p, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
    lora = jax.eval_shape(lambda k: init_lora(cfg, LoraConfig(rank=2, target_modules=("q_proj", "v_proj",
                                                                                     "up_proj", "down_proj")), k),
                          jax.random.key(0))
    sharding.param_shardings(lora, mesh)  # raises if an adapter has no rule
    assert specs["layers/q_proj/kernel"] == P(None, "fsdp", "tensor")
    assert specs["layers/down_proj/kernel"] == P(None, "tensor", "fsdp")
    assert specs["embed/embedding"] == P("tensor", "fsdp")
    with pytest.raises(ConfigError, match="no partition rule matches parameter 'layers/mystery/kernel'"):
        sharding.spec_for("layers/mystery/kernel", (2, 4, 4), mesh)


def test_mesh_sizes_are_checked():
    with pytest.raises(ConfigError, match="does not use the 1 available devices"):
        make_mesh(2, 1, 1)
    assert dict(make_mesh(1, -1, 1).shape) == {"data": 1, "fsdp": 1, "tensor": 1}


SUBPROCESS = textwrap.dedent(r"""
    import json, sys, tempfile
    import numpy as np, jax, jax.numpy as jnp, transformers
    from jaxrl_hier.llm import EncoderModel, LanguageModel, load_pretrained, make_mesh, save_pretrained
    from jaxrl_hier.llm.decoder import default_positions
    assert jax.device_count() == 8
    tiny = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32)
    hf = {"llama": transformers.LlamaConfig(**tiny),
          "gpt2": transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32),
          "roberta": transformers.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=48,
                                                max_position_embeddings=40)}
    devs = jax.devices()
    meshes = {"4": make_mesh(1, 2, 2, devices=devs[:4]), "8": make_mesh(2, 2, 2, devices=devs)}
    ids = np.array([[0, 0, 7, 8, 9, 10], [3, 4, 5, 6, 2, 11], [0, 12, 13, 14, 15, 16], [1, 1, 1, 1, 1, 9]])
    mask = np.array([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    out = {}
    for name, cfg in hf.items():
        cls = LanguageModel if name != "roberta" else EncoderModel
        path = tempfile.mkdtemp()
        save_pretrained(cls.random(cfg, jax.random.key(0), jnp.float32), None, path)
        base = load_pretrained(path)
        if name == "roberta":
            r_ids = np.where(mask > 0, ids + 2, 1)
            ref = np.asarray(base.encode(base.params, r_ids, mask)[1])
        else:
            ref = np.asarray(base.logits(base.params, ids, mask))
        for key, mesh in meshes.items():
            lm = load_pretrained(path, mesh=mesh)
            q = lm.params["layers"]["q_proj"]["kernel"]
            assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor"), q.sharding.spec
            assert q.addressable_shards[0].data.shape == (2, 16, 16)  # never whole on one device
            if name == "roberta":
                got = np.asarray(lm.encode(lm.params, r_ids, mask)[1])
            else:
                got = np.asarray(lm.logits(lm.params, ids, mask))
                # incremental decode under the mesh (sharded cache) equals the full forward
                pos = default_positions(jnp.asarray(mask))
                @jax.jit
                def decode(params):
                    cache = lm.init_cache(4, 6)
                    m = jnp.zeros((4, 6), jnp.int32).at[:, :4].set(mask[:, :4])
                    l1, cache = lm.forward(params, ids[:, :4], m, positions=pos[:, :4], cache=cache, cache_index=0)
                    logits = [l1]
                    for i in (4, 5):
                        m = m.at[:, i].set(mask[:, i])
                        li, cache = lm.forward(params, ids[:, i:i + 1], m, positions=pos[:, i:i + 1], cache=cache,
                                               cache_index=jnp.int32(i))
                        logits.append(li)
                    return jnp.concatenate(logits, 1), cache
                dec, cache = decode(lm.params)
                spec = list(cache.k.sharding.spec) + [None] * (5 - len(cache.k.sharding.spec))
                out[f"{name}/{key}/cache_spec"] = [list(a) if isinstance(a, tuple) else a for a in spec]
                out[f"{name}/{key}/decode"] = float(np.abs(np.asarray(dec) - ref)[mask > 0].max())
            err = np.abs(got - ref)
            out[f"{name}/{key}"] = float((err[mask > 0] if name != "roberta" else err).max())
            out[f"{name}/scale"] = float(np.abs(ref).max())
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def multi_device_results():
    root = str(Path(__file__).resolve().parents[2])  # this checkout, not some other installed copy
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"  # after the session's
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SUBPROCESS], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(li for li in proc.stdout.splitlines() if li.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("name", ["llama", "gpt2", "roberta"])
@pytest.mark.parametrize("devices", ["4", "8"])
def test_sharded_logits_equal_single_device(multi_device_results, name, devices):
    r = multi_device_results
    assert r[f"{name}/scale"] > 0.01
    assert r[f"{name}/{devices}"] < 1e-5 * max(1.0, r[f"{name}/scale"])
    if name != "roberta":
        assert r[f"{name}/{devices}/decode"] < 1e-5 * max(1.0, r[f"{name}/scale"])
        # cache: batch over data x fsdp (8 devices) or fsdp (4), kv heads over tensor
        want = ["data", "fsdp"] if devices == "8" else "fsdp"
        assert r[f"{name}/{devices}/cache_spec"] == [None, want, "tensor", None, None]
