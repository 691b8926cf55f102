"""LoRA adapters held apart from the base weights.

`Lora` is a pytree: `params` (trainable, {"layers": {proj: {"a": [L, in, r], "b": [L, r, out]}}})
and the static `scale` = alpha / rank. Pass it as `forward(..., lora=adapter)`; the same base
`params` with `lora=None` is the frozen reference policy, so no second copy of the model exists.
`b` starts at zero: a fresh adapter leaves the model unchanged. `merge_lora` folds it into the
weights for export (`save_pretrained`).

Targets use the Llama names q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj for every
family. GPT-2 / PEFT names are accepted too: c_attn -> q, k, v (one adapter per projection rather
than one over the fused matrix), c_proj -> o_proj and down_proj (PEFT matches both), c_fc -> up_proj;
RoBERTa's query/key/value -> q/k/v, dense -> o_proj, up_proj, down_proj.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.layers import Init, init_tree, traced_init
from jaxrl_hier.llm.model_config import ModelConfig
from jaxrl_hier.llm.sharding import param_shardings

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALIASES = {
    "c_attn": ("q_proj", "k_proj", "v_proj"),
    "c_proj": ("o_proj", "down_proj"),
    "c_fc": ("up_proj",),
    "query": ("q_proj",),
    "key": ("k_proj",),
    "value": ("v_proj",),
    "dense": ("o_proj", "up_proj", "down_proj"),
}


@dataclass(frozen=True)
class LoraConfig:
    """rank r, alpha (update scale alpha / r), and the projections that get an adapter."""

    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dtype: str = "float32"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@flax.struct.dataclass
class Lora:
    """The adapter weights (a pytree leaf set) and their static scale."""

    params: dict[str, Any]
    scale: float = flax.struct.field(pytree_node=False, default=1.0)


def resolve_targets(config: ModelConfig, targets: Sequence[str]) -> tuple[str, ...]:
    """Expand aliases and keep the projections this architecture has (gate_proj is Llama-only)."""
    out: list[str] = []
    for name in targets:
        if name in TARGETS:
            out.append(name)
        elif name in ALIASES:
            out.extend(ALIASES[name])
        else:
            raise ConfigError(f"unknown LoRA target '{name}'; choose from {TARGETS} "
                              f"(GPT-2/RoBERTa aliases: {tuple(ALIASES)}).")
    present = [t for t in dict.fromkeys(out) if t != "gate_proj" or config.gated_mlp]
    if not present:
        raise ConfigError(f"LoRA targets {tuple(targets)} select no projection of a {config.model_type} model.")
    return tuple(present)


def proj_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one layer."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def init_lora(config: ModelConfig, lora_config: LoraConfig, key: jax.Array, mesh: Mesh | None = None) -> Lora:
    """a ~ N(0, 1 / (3 fan_in)) (the variance of PEFT's Kaiming-uniform A), b = 0: the adapter starts
    as identity. With a mesh the adapters are split like the weights they adapt."""
    if lora_config.rank < 1:
        raise ConfigError(f"LoRA rank must be >= 1, got {lora_config.rank}.")
    dtype = jnp.dtype(lora_config.dtype)
    shapes = proj_shapes(config)
    targets = resolve_targets(config, lora_config.target_modules)
    rank, n = lora_config.rank, config.num_layers

    def build(init: Init) -> dict[str, Any]:
        layers = {}
        for name in targets:
            fan_in, fan_out = shapes[name]
            layers[name] = {"a": init.normal((n, fan_in, rank), dtype, std=(3 * fan_in) ** -0.5),
                            "b": init.zeros((n, rank, fan_out), dtype)}
        return {"layers": layers}

    shardings = None
    if mesh is not None:
        shardings = param_shardings(jax.eval_shape(lambda k: traced_init(build, k), key), mesh)
    return Lora(init_tree(build, key, shardings), scale=float(lora_config.scale))


def merge_lora(params: dict[str, Any], lora: Lora | None, config: ModelConfig | None = None) -> dict[str, Any]:
    """Base params with every adapter folded in: kernel + scale * a @ b (same dtype as the kernel).

    `config` is accepted for symmetry with the other model functions; the shapes come from the trees.
    """
    if lora is None:
        return params
    layers = dict(params["layers"])
    for name, ab in lora.params["layers"].items():
        if name not in layers:
            raise ConfigError(f"the LoRA adapter targets '{name}', which this model does not have.")
        proj = dict(layers[name])
        delta = jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
        proj["kernel"] = (proj["kernel"].astype(jnp.float32) + lora.scale * delta).astype(proj["kernel"].dtype)
        layers[name] = proj
    return {**params, "layers": layers}


def count(lora: Lora) -> int:
    """Number of adapter parameters."""
    return int(sum(x.size for x in jax.tree_util.tree_leaves(lora)))
