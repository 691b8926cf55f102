"""Per-device memory planner for LLM RL: parameters, gradients, Adam state, KV cache, activations.

A run holds several models at once (actor, reference, critic, guidance, reward model). Each is a
`ModelSpec`: its architecture (a `jaxrl_hier.llm.ModelConfig`, a transformers config, or a dict of
HF config fields), dtype, how it is trained (full, LoRA or frozen), and the batch and sequence sizes
it sees. `plan(specs, mesh)` returns a `MemoryPlan` with bytes PER DEVICE for a mesh of
(data, fsdp, tensor) axes, and `.table()` prints it.

Model of each figure (documented so the numbers can be checked by hand):

* parameters: exact parameter count of the architecture (Llama / Mistral / Qwen2 / Qwen3 / GPT-2 /
  RoBERTa) times the dtype size, divided by fsdp * tensor (ZeRO-3 style: every weight is split,
  replicated along `data`). A model with `shares_base_with` set (e.g. the reference policy of a LoRA
  actor: the same base weights with the adapter switched off) adds no base parameter bytes.
* gradients: one value per trainable parameter in the trainable dtype (all weights for full training,
  only the adapters for LoRA), split like the parameters.
* optimizer: Adam, two fp32 moments per trainable parameter (8 bytes), plus a fp32 master copy
  (4 bytes) when `fp32_master=True` and the parameters are not already fp32.
* KV cache (generation only, `kv_cache_len > 0`): 2 * layers * batch * kv_cache_len * kv_heads *
  head_dim * dtype size; batch split over data * fsdp, kv heads over tensor.
* activations (per micro-batch, batch split over data * fsdp, heads / MLP width over tensor):
  - training with `remat=True` (per-layer checkpointing): the residual stream at every layer
    input (layers * B * T * H) plus one layer's working set recomputed in the backward pass;
  - training with `remat=False`: every layer's working set is kept;
  - forward only (frozen models, generation): one layer's working set;
  - a layer's working set: B * T * (8 H + 3 I) values (norm outputs, q/k/v/attention output,
    residuals, gate/up/activation) plus the attention scores B * heads * T * T in fp32 (no flash);
  - the final logits B * T * vocab in fp32, counted twice when training (logits and log-softmax /
    their gradient), once for a forward.
  This is an estimate of what XLA keeps live, good to about a factor of 1.5; fused or flash
  attention makes the T * T term vanish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_hier.config import ConfigError

GIB = 1024**3
TRAIN_MODES = ("full", "lora", "frozen")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Dims:
    """The architecture figures the planner needs, read from any supported config."""

    family: str  # "llama" (Llama/Mistral/Qwen2/Qwen3), "gpt2" or "roberta"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    max_positions: int = 0


@dataclass(frozen=True)
class MeshShape:
    """Device mesh sizes: data (batch), fsdp (batch and weight shards), tensor (heads / MLP width)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def num_devices(self) -> int:
        return self.data * self.fsdp * self.tensor


@dataclass(frozen=True)
class ModelSpec:
    """One model of a run; see the module docstring for what each field contributes."""

    role: str
    config: Any
    dtype: str = "bfloat16"
    train: str = "frozen"  # "full", "lora" or "frozen"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_dtype: str = "float32"
    batch: int = 1
    seq_len: int = 1
    kv_cache_len: int = 0
    remat: bool = True
    fp32_master: bool = False
    shares_base_with: str | None = None
    head: str = "lm"  # "lm" (vocab logits) or "value" (scalar head, no logits)


@dataclass(frozen=True)
class ModelMemory:
    """Bytes per device for one model."""

    role: str
    params: int
    grads: int
    optimizer: int
    kv_cache: int
    activations: int
    num_params: int
    trainable_params: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.kv_cache + self.activations


@dataclass(frozen=True)
class MemoryPlan:
    """The per-device memory of every model of a run, with totals and a printable table."""

    mesh: MeshShape
    models: tuple[ModelMemory, ...]
    capacity_bytes: int | None = None

    def column(self, name: str) -> int:
        return int(sum(getattr(m, name) for m in self.models))

    @property
    def total(self) -> int:
        return int(sum(m.total for m in self.models))

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total <= self.capacity_bytes

    def table(self) -> str:
        """A fixed-width table in GiB per device, one row per model plus a total row."""
        cols = ("params", "grads", "optimizer", "kv_cache", "activations")
        head = f"{'model':<12}{'#params':>10}" + "".join(f"{c:>13}" for c in cols) + f"{'total':>11}"
        lines = [f"per-device memory (GiB), mesh data={self.mesh.data} fsdp={self.mesh.fsdp} "
                 f"tensor={self.mesh.tensor}", head, "-" * len(head)]
        for m in self.models:
            lines.append(f"{m.role:<12}{_human(m.num_params):>10}"
                         + "".join(f"{getattr(m, c) / GIB:>13.3f}" for c in cols) + f"{m.total / GIB:>11.3f}")
        lines.append("-" * len(head))
        lines.append(f"{'total':<12}{'':>10}" + "".join(f"{self.column(c) / GIB:>13.3f}" for c in cols)
                     + f"{self.total / GIB:>11.3f}")
        if self.capacity_bytes is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"device capacity {self.capacity_bytes / GIB:.1f} GiB: {verdict}")
        return "\n".join(lines)


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype name or object ('bfloat16', jnp.float32, ...)."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return 2
    try:
        import jax.numpy as jnp

        return int(jnp.dtype(dtype).itemsize)
    except TypeError:
        raise ConfigError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16.") from None


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def dims_of(config: Any) -> Dims:
    """Read the architecture from a ModelConfig, a transformers config or a dict of HF fields."""
    if isinstance(config, Dims):
        return config
    model_type = str(_get(config, "model_type", default="") or "")
    family = str(_get(config, "family", "arch", default="") or "")
    if model_type == "gpt2" or family == "gpt2":
        hidden = int(_get(config, "n_embd", "hidden_size"))
        heads = int(_get(config, "n_head", "num_heads", "num_attention_heads"))
        return Dims("gpt2", int(_get(config, "vocab_size")), hidden,
                    int(_get(config, "n_inner", "intermediate_size", default=4 * hidden)),
                    int(_get(config, "n_layer", "num_layers", "num_hidden_layers")), heads, heads,
                    hidden // heads, True, qkv_bias=True,
                    max_positions=int(_get(config, "n_positions", "max_position_embeddings")))
    hidden = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads", "num_heads")
    layers = _get(config, "num_hidden_layers", "num_layers")
    if hidden is None or heads is None or layers is None:
        raise ConfigError(f"cannot read hidden_size / num_heads / num_layers from {type(config).__name__}; "
                          "pass a jaxrl_hier.llm.ModelConfig or a transformers config.")
    hidden, heads, layers = int(hidden), int(heads), int(layers)
    kv = int(_get(config, "num_key_value_heads", "num_kv_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=hidden // heads))
    if model_type in ("roberta", "bert") or family == "roberta":
        # token-type rows are counted with the position rows (both are embedding tables of width H)
        rows = int(_get(config, "max_position_embeddings")) + int(_get(config, "type_vocab_size", default=1))
        return Dims("roberta", int(_get(config, "vocab_size")), hidden, int(_get(config, "intermediate_size")),
                    layers, heads, heads, head_dim, True, qkv_bias=True, max_positions=rows)
    qkv_bias = bool(_get(config, "attention_bias", "qkv_bias", default=model_type == "qwen2"))
    qk_norm = bool(_get(config, "qk_norm", default=model_type == "qwen3"))
    return Dims("llama", int(_get(config, "vocab_size")), hidden, int(_get(config, "intermediate_size")),
                layers, heads, kv, head_dim, bool(_get(config, "tie_word_embeddings", default=False)),
                qkv_bias=qkv_bias, qk_norm=qk_norm)


def count_params(d: Dims, head: str = "lm") -> int:
    """Exact parameter count of the architecture (a value head adds hidden + 1 instead of an LM head)."""
    h, i, v = d.hidden_size, d.intermediate_size, d.vocab_size
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    if d.family == "gpt2":
        layer = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        total = v * h + d.max_positions * h + d.num_layers * layer + 2 * h
    elif d.family == "roberta":
        layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        total = (v + d.max_positions) * h + 2 * h + d.num_layers * layer
    else:
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if d.qkv_bias else 0)
        norms = 2 * h + (2 * d.head_dim if d.qk_norm else 0)
        total = v * h + d.num_layers * (attn + 3 * h * i + norms) + h
    if head == "value":
        return total + h + 1
    if d.family == "llama" and not d.tie_word_embeddings:
        total += v * h
    return total


def lora_shapes(d: Dims) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA-targetable projection of one decoder layer."""
    h, i = d.hidden_size, d.intermediate_size
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def count_lora_params(d: Dims, rank: int, targets: Sequence[str]) -> int:
    """Parameters of the LoRA adapters: rank * (in + out) per targeted projection per layer."""
    shapes = lora_shapes(d)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ConfigError(f"unknown LoRA target(s) {unknown}; choose from {list(shapes)}.")
    return d.num_layers * sum(rank * sum(shapes[t]) for t in targets)


def kv_cache_bytes(d: Dims, batch: int, max_len: int, dtype: Any) -> int:
    """Bytes of a full (unsharded) KV cache: keys and values for every layer and slot."""
    return 2 * d.num_layers * batch * max_len * d.num_kv_heads * d.head_dim * dtype_bytes(dtype)


def _layer_working_set(d: Dims, batch: int, seq: int, act_bytes: int, tensor: int) -> int:
    """Bytes one layer holds live: B*T*(8H + 3I) values plus fp32 attention scores B*heads*T*T."""
    values = batch * seq * (8 * d.hidden_size + 3 * d.intermediate_size // tensor)
    scores = batch * max(d.num_heads // tensor, 1) * seq * seq * 4
    return values * act_bytes + scores


def activation_bytes(d: Dims, spec: ModelSpec, batch: int, tensor: int) -> int:
    """Activation bytes per device for the model's batch slice (see the module docstring)."""
    act = dtype_bytes(spec.dtype)
    seq = spec.seq_len
    layer = _layer_working_set(d, batch, seq, act, tensor)
    logit_copies = 0 if spec.head == "value" else (2 if spec.train != "frozen" else 1)
    logits = logit_copies * batch * seq * d.vocab_size * 4
    if spec.train == "frozen":
        return layer + logits
    if spec.remat:
        return d.num_layers * batch * seq * d.hidden_size * act + layer + logits
    return d.num_layers * layer + logits


def _validate(spec: ModelSpec, mesh: MeshShape, roles: set[str]) -> None:
    if spec.train not in TRAIN_MODES:
        raise ConfigError(f"model '{spec.role}': train={spec.train!r}; use one of {TRAIN_MODES}.")
    if spec.train == "lora" and spec.lora_rank <= 0:
        raise ConfigError(f"model '{spec.role}': train='lora' needs lora_rank > 0.")
    if spec.head not in ("lm", "value"):
        raise ConfigError(f"model '{spec.role}': head={spec.head!r}; use 'lm' or 'value'.")
    if spec.shares_base_with is not None and spec.shares_base_with not in roles:
        raise ConfigError(f"model '{spec.role}' shares_base_with '{spec.shares_base_with}', "
                          f"which is not a model of this plan ({sorted(roles)}).")
    if min(spec.batch, spec.seq_len) <= 0 or spec.kv_cache_len < 0:
        raise ConfigError(f"model '{spec.role}': batch and seq_len must be positive, kv_cache_len >= 0.")
    if min(mesh.data, mesh.fsdp, mesh.tensor) <= 0:
        raise ConfigError(f"mesh sizes must be positive, got {mesh}.")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_model(spec: ModelSpec, mesh: MeshShape, roles: set[str] | None = None) -> ModelMemory:
    """Per-device bytes of one model under `mesh`."""
    _validate(spec, mesh, roles if roles is not None else {spec.role})
    d = dims_of(spec.config)
    shards = mesh.fsdp * mesh.tensor
    n_params = count_params(d, spec.head)
    base = 0 if spec.shares_base_with else n_params * dtype_bytes(spec.dtype)
    if spec.train == "lora":
        trainable, train_dtype = count_lora_params(d, spec.lora_rank, spec.lora_targets), spec.lora_dtype
    elif spec.train == "full":
        trainable, train_dtype = n_params, spec.dtype
    else:
        trainable, train_dtype = 0, spec.dtype
    lora_bytes = trainable * dtype_bytes(train_dtype) if spec.train == "lora" else 0
    master = 4 if spec.fp32_master and dtype_bytes(train_dtype) != 4 else 0
    batch = _ceil_div(spec.batch, mesh.data * mesh.fsdp)
    kv_heads_split = mesh.tensor if d.num_kv_heads % mesh.tensor == 0 else 1
    cache = kv_cache_bytes(d, batch, spec.kv_cache_len, spec.dtype) // kv_heads_split
    return ModelMemory(
        role=spec.role,
        params=_ceil_div(base + lora_bytes, shards),
        grads=_ceil_div(trainable * dtype_bytes(train_dtype), shards),
        optimizer=_ceil_div(trainable * (8 + master), shards),
        kv_cache=cache,
        activations=activation_bytes(d, spec, batch, mesh.tensor),
        num_params=n_params + (trainable if spec.train == "lora" else 0),
        trainable_params=trainable,
    )


def plan(specs: Sequence[ModelSpec], mesh: MeshShape | Mapping[str, int] | None = None,
         capacity_gib: float | None = None) -> MemoryPlan:
    """Plan the per-device memory of all models of a run; `capacity_gib` adds a fits / does-not-fit line."""
    if mesh is None:
        mesh = MeshShape()
    elif isinstance(mesh, Mapping):
        unknown = set(mesh) - {"data", "fsdp", "tensor"}
        if unknown:
            raise ConfigError(f"unknown mesh axes {sorted(unknown)}; use data, fsdp and tensor.")
        mesh = MeshShape(**mesh)
    roles = [s.role for s in specs]
    if len(set(roles)) != len(roles):
        raise ConfigError(f"model roles must be distinct, got {roles}.")
    models = tuple(plan_model(s, mesh, set(roles)) for s in specs)
    cap = None if capacity_gib is None else int(capacity_gib * GIB)
    return MemoryPlan(mesh, models, cap)


def tree_nbytes(tree: Any) -> int:
    """Total bytes of the arrays of a pytree (for checking the planner against real arrays)."""
    import jax

    return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree)))


__all__ = ["Dims", "MeshShape", "ModelSpec", "ModelMemory", "MemoryPlan", "dims_of", "count_params",
           "count_lora_params", "kv_cache_bytes", "activation_bytes", "plan", "plan_model", "dtype_bytes",
           "tree_nbytes", "LORA_TARGETS"]
