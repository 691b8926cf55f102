"""Per-device memory planner for LLM RL: parameters, gradients, Adam state, KV cache, activations.

A run holds several models at once (actor, reference, critic, guidance, ...). Each is a `ModelSpec`:
its architecture (a `jaxrl_hier.llm.ModelConfig`, a transformers config or a dict of HF config
fields with `model_type`, all read through `ModelConfig.from_hf`), dtype, how it is trained (full,
LoRA or frozen), the batch and sequence sizes it sees, and the phase (training step) in which its
gradients and activations are live. `plan(specs, mesh)` returns a `MemoryPlan` with bytes PER DEVICE
for a mesh of (data, fsdp, tensor) axes; `.table()` prints it. `python -m jaxrl_hier.llm.memory`
prints the two tables of the guidance-agent case (`original_setup`, docs/llm_memory.md).

Where each figure comes from:

* parameters, LoRA adapters, Adam state, KV cache: the SHAPES of the real arrays, taken with
  `jax.eval_shape` (nothing is allocated) of `decoder.init_params` / `encoder.init_params`,
  `heads.value_head_init`, `lora.init_lora`, the project's optimiser
  (`optax.chain(optax.clip_by_global_norm, optax.adamw)`, as in llm_rl's SFT and GRPO) and
  `decoder.init_cache`. They equal the real arrays' bytes (tested) for every family and switch
  (biases, tied embeddings, q/k norm) without a second description of the architectures.
  Sharded per device: weights and optimiser state / (fsdp * tensor) (rounded up), the cache's batch
  over data * fsdp and its kv heads over tensor. A model with `shares_base_with` (a LoRA role on
  another role's frozen backbone, or the reference = the backbone with adapters off) adds no base
  weights, only its adapters.
* gradients: one value per trainable parameter in its dtype (all weights for full training, only
  the adapters for LoRA), plus `head_params` in float32.
* activations: an estimate of what XLA keeps for the backward pass of one (micro-)batch, with the
  decoder and encoder as written in `jaxrl_hier.llm` (a `lax.scan` over layers that saves every
  layer's residuals, or with `remat=True` only the layer inputs, as `ModelConfig.remat` runs it):
  - per layer and token: the layer input, the two norm outputs and the residual after attention (4 H
    values in the activation dtype) plus the two norms' float32 upcasts (2 H float32); q, k, v and
    the attention output (2 Q + 2 KV, Q = heads * head_dim, KV = kv_heads * head_dim), the rotated q
    and k (Q + KV, rotary models) and q/k-normed copies (Q + KV, Qwen3); the MLP's gate, up,
    activation and product (4 I, gated) or pre-activation and activation (2 I), plus what the
    activation function's gradient keeps (`ACTIVATION_RESIDUALS`: I for silu's sigmoid, 2 I for
    GELU); each LoRA target's x @ a (rank values in the LoRA dtype);
  - per layer: the attention probabilities B * heads * T * T, float32 for the softmax's gradient plus
    their copy in the activation dtype (for the value product), 4 + act bytes each; 0 with
    `flash_attention=True` (a fused kernel keeps no T * T matrix);
  - training keeps all layers (`remat=True` models per-layer checkpointing instead: the layer inputs
    L * B * T * H plus one layer recomputed, and the projections' outputs where the decoder keeps
    them, `decoder.saves_dots`); a forward-only model keeps one layer at a time;
  - embeddings and final norm: 2 B * T * H values;
  - LM logits in float32 ([B, c, V] with c = min(logits_chunk, T - 1) positions at a time as
    `jaxrl_hier.llm.token_logprobs` scores them, fewer rows than B where that would pass
    `sampling.MAX_CHUNK_LOGITS` values, or [B, T, V] with `logits_chunk=0`, the full logits
    transformers computes): 3 copies when training (logits, log-probs, their gradient; 4 for full
    logits, where the softmax of the backward pass is a fourth), 2 for a forward.
  docs/llm_memory.md compares this estimate with XLA's `compiled.memory_analysis()` of the real
  training step (`compiled_step_memory`).
* peak: weights, optimiser state and KV cache are held for the whole run; gradients and activations
  only during their phase's step (the actor step, the critic step, ...). The peak is the held bytes
  plus the largest phase; `MemoryPlan.total` (every row summed) is the bound with all steps at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.model_config import ModelConfig

__all__ = ["MeshShape", "ModelSpec", "ModelMemory", "MemoryPlan", "plan", "plan_model", "model_config_of",
           "param_shapes", "count_params", "lora_shapes", "count_lora_params", "make_optimizer", "optimizer_bytes",
           "kv_cache_bytes", "layer_activation_bytes", "activation_bytes", "dtype_bytes", "tree_nbytes", "tree_size",
           "compiled_step_memory", "training_step", "measured_layout_peak", "device_memory_stats", "llama_3_2_3b",
           "roberta_base", "archer_head_params", "original_setup", "original_plans", "main", "ORIGINAL_CAPACITY_GIB"]

GIB = 1024**3
#: I-wide values the activation function's gradient keeps beyond its input and output: silu its
#: sigmoid; exact and tanh GELU the scaled input and the erf / tanh term; relu only a mask
ACTIVATION_RESIDUALS = {"silu": 1, "gelu": 2, "gelu_new": 2, "gelu_pytorch_tanh": 2, "relu": 0}
TRAIN_MODES = ("full", "lora", "frozen")
HEADS = ("lm", "value", "none")


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
    """One model of a run; see the module docstring for what each field contributes.

    `batch` rows are generated (KV cache) and trained on, `micro_batch` rows at a time (gradient
    accumulation; 0 = the whole batch in one pass). `head`: "lm" (vocabulary logits), "value" (a
    scalar head on the hidden states, no logits) or "none"; default "lm" for decoders, "none" for
    encoders. `head_params`: further parameters beside the backbone (e.g. the critic's MLP heads),
    float32, trained with the model. `phase`: the step in which the model's gradients and activations
    are live (default: its role); models of one phase (e.g. the actor and the reference it is
    compared with) add up, different phases do not.
    """

    role: str
    config: Any
    dtype: str = "bfloat16"
    train: str = "frozen"  # "full", "lora" or "frozen"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_dtype: str = "float32"
    batch: int = 1
    seq_len: int = 1
    micro_batch: int = 0
    kv_cache_len: int = 0
    remat: bool = False
    flash_attention: bool = False
    logits_chunk: int = 128
    fp32_master: bool = False
    shares_base_with: str | None = None
    head: str | None = None
    pooler: bool = False
    head_params: int = 0
    phase: str | None = None


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
    phase: str = ""

    @property
    def held(self) -> int:
        """Bytes held for the whole run: weights, optimiser state, KV cache."""
        return self.params + self.optimizer + self.kv_cache

    @property
    def transient(self) -> int:
        """Bytes live only during this model's phase: gradients and activations."""
        return self.grads + self.activations

    @property
    def total(self) -> int:
        return self.held + self.transient


@dataclass(frozen=True)
class MemoryPlan:
    """The per-device memory of every model of a run, with totals, the peak and a printable table."""

    mesh: MeshShape
    models: tuple[ModelMemory, ...]
    capacity_bytes: int | None = None
    title: str = ""

    def column(self, name: str) -> int:
        return int(sum(getattr(m, name) for m in self.models))

    @property
    def total(self) -> int:
        """Every row summed: all phases live at once (an upper bound of the peak)."""
        return int(sum(m.total for m in self.models))

    def phases(self) -> dict[str, int]:
        """Transient bytes (gradients + activations) of each phase."""
        out: dict[str, int] = {}
        for m in self.models:
            out[m.phase] = out.get(m.phase, 0) + m.transient
        return out

    @property
    def peak_phase(self) -> str:
        phases = self.phases()
        return max(phases, key=phases.get) if phases else ""

    @property
    def peak(self) -> int:
        """Held bytes of all models plus the largest phase's gradients and activations."""
        return self.column("held") + max(self.phases().values(), default=0)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.peak <= self.capacity_bytes

    def table(self) -> str:
        """A fixed-width table in GiB per device, one row per model, with each row's bytes."""
        cols = ("params", "grads", "optimizer", "kv_cache", "activations")
        head = (f"{'model':<16}{'phase':<10}{'#params':>9}" + "".join(f"{c:>12}" for c in cols)
                + f"{'total GiB':>11}{'total bytes':>17}")
        lines = ([self.title] if self.title else []) + [
            f"per-device memory (GiB = 2^30 bytes), mesh data={self.mesh.data} fsdp={self.mesh.fsdp} "
            f"tensor={self.mesh.tensor}", head, "-" * len(head)]
        for m in self.models:
            lines.append(f"{m.role:<16}{m.phase:<10}{_human(m.num_params):>9}"
                         + "".join(f"{getattr(m, c) / GIB:>12.3f}" for c in cols)
                         + f"{m.total / GIB:>11.3f}{m.total:>17,}")
        lines.append("-" * len(head))
        lines.append(f"{'sum of rows':<16}{'':<10}{'':>9}" + "".join(f"{self.column(c) / GIB:>12.3f}" for c in cols)
                     + f"{self.total / GIB:>11.3f}{self.total:>17,}")
        held = self.column("held")
        lines.append(f"peak = held (params + optimizer + kv_cache) {held / GIB:.3f} GiB + largest phase "
                     f"'{self.peak_phase}' {(self.peak - held) / GIB:.3f} GiB = {self.peak / GIB:.3f} GiB "
                     f"({self.peak:,} bytes)")
        if self.capacity_bytes is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"device capacity {self.capacity_bytes / GIB:.2f} GiB ({self.capacity_bytes:,} bytes): "
                         f"{verdict}")
        return "\n".join(lines)


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype name or object ('bfloat16', jnp.float32, ...)."""
    import jax.numpy as jnp

    try:
        return int(jnp.dtype("bfloat16" if dtype == "bf16" else dtype).itemsize)
    except TypeError:
        raise ConfigError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16.") from None


def model_config_of(config: Any) -> ModelConfig:
    """A `ModelConfig` from a ModelConfig, a transformers config, or a dict of HF config fields
    (with `model_type`), always through `ModelConfig.from_hf`."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, Mapping):
        fields = dict(config)
        model_type = fields.pop("model_type", None)
        if model_type is None:
            raise ConfigError("a config dict needs 'model_type' (e.g. 'llama', 'qwen2', 'roberta'); or pass a "
                              "jaxrl_hier.llm.ModelConfig or a transformers config.")
        fields.pop("dtype", None)  # the planner's dtype is the ModelSpec's
        import transformers

        try:
            config = transformers.AutoConfig.for_model(str(model_type), **fields)
        except ValueError as err:
            raise ConfigError(f"cannot build a transformers config for model_type '{model_type}': {err}") from None
    if getattr(config, "model_type", None) is None:
        raise ConfigError(f"cannot read an architecture from {type(config).__name__}; pass a "
                          "jaxrl_hier.llm.ModelConfig, a transformers config or a dict with model_type.")
    return ModelConfig.from_hf(config)


def _eval_shape(fn: Any) -> Any:
    import jax

    return jax.eval_shape(fn, jax.random.key(0))


def tree_nbytes(tree: Any) -> int:
    """Total bytes of the arrays (or ShapeDtypeStructs) of a pytree."""
    import jax

    return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def tree_size(tree: Any) -> int:
    """Number of values in the arrays (or ShapeDtypeStructs) of a pytree."""
    import jax

    return int(sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def _head_of(config: ModelConfig, head: str | None) -> str:
    head = head if head is not None else ("lm" if config.is_decoder else "none")
    if head not in HEADS:
        raise ConfigError(f"head={head!r}; use one of {HEADS}.")
    if head == "lm" and not config.is_decoder:
        raise ConfigError(f"a {config.model_type} encoder has no LM head; use head='value' or head='none'.")
    return head


def param_shapes(config: Any, dtype: Any = "bfloat16", head: str | None = None, pooler: bool = False) -> dict:
    """The parameter tree of a model as ShapeDtypeStructs, from the real init functions: a decoder
    with its LM head (head='lm'), without it ('none'), or with a float32 value head instead ('value');
    a RoBERTa encoder (with its pooler if `pooler`) with or without a value head."""
    from jaxrl_hier.llm import decoder, encoder
    from jaxrl_hier.llm.heads import value_head_init

    cfg = model_config_of(config)
    head = _head_of(cfg, head)
    if cfg.is_decoder:
        tree = dict(decoder.param_shapes(cfg, dtype_of(dtype)))
        if head != "lm":
            tree.pop("lm_head", None)
    else:
        tree = dict(encoder.param_shapes(cfg, dtype_of(dtype), pooler))
    if head == "value":
        tree["value_head"] = _eval_shape(lambda k: value_head_init(k, cfg.hidden_size))
    return tree


def dtype_of(dtype: Any) -> Any:
    import jax.numpy as jnp

    dtype_bytes(dtype)  # the clear message for an unknown name
    return jnp.dtype("bfloat16" if dtype == "bf16" else dtype)


def count_params(config: Any, head: str | None = None, pooler: bool = False) -> int:
    """Exact parameter count of the model (see `param_shapes`)."""
    return tree_size(param_shapes(config, "float32", head, pooler))


def lora_shapes(config: Any, rank: int, targets: Sequence[str], dtype: Any = "float32") -> Any:
    """The adapters `jaxrl_hier.llm.init_lora` creates, as ShapeDtypeStructs."""
    from jaxrl_hier.llm.lora import LoraConfig, init_lora

    cfg = model_config_of(config)
    lora_config = LoraConfig(rank=int(rank), target_modules=tuple(targets), dtype=str(dtype_of(dtype)))
    return _eval_shape(lambda k: init_lora(cfg, lora_config, k)).params


def count_lora_params(config: Any, rank: int, targets: Sequence[str]) -> int:
    """Parameters of the LoRA adapters: rank * (in + out) per targeted projection per layer."""
    return tree_size(lora_shapes(config, rank, targets))


def make_optimizer(learning_rate: float = 1e-5, max_grad_norm: float = 1.0) -> Any:
    """The optimiser whose state the planner counts: global-norm clipping + AdamW, as jaxrl_hier.llm_rl
    trains (two moments in the parameters' dtype and a step count)."""
    import optax

    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(learning_rate))


def optimizer_bytes(trainable: Any) -> int:
    """Bytes of `make_optimizer()`'s state for a tree of trainable arrays or ShapeDtypeStructs."""
    import jax

    return tree_nbytes(jax.eval_shape(make_optimizer().init, trainable))


def kv_cache_bytes(config: Any, batch: int, max_len: int, dtype: Any) -> int:
    """Bytes of a full (unsharded) KV cache from `decoder.init_cache`: keys and values of every layer."""
    from jaxrl_hier.llm import decoder

    cfg = model_config_of(config)
    if not cfg.is_decoder:
        raise ConfigError(f"a {cfg.model_type} encoder has no KV cache; set kv_cache_len=0.")
    return tree_nbytes(_eval_shape(lambda k: decoder.init_cache(cfg, int(batch), int(max_len), dtype_of(dtype))))


def layer_activation_bytes(config: ModelConfig, batch: int, seq: int, act_bytes: int, *, tensor: int = 1,
                           flash_attention: bool = False, lora_values: int = 0, lora_bytes: int = 4) -> int:
    """Bytes one layer keeps for the backward pass of a [batch, seq] slice (module docstring).

    `lora_values`: the rank values per token of all of the layer's adapters (rank * number of targets)."""
    c = config
    q, kv = c.num_heads * c.head_dim // tensor, max(c.num_kv_heads // tensor, 1) * c.head_dim
    extra = int(c.rope) + int(c.qk_norm)  # rotated and / or normed copies of q and k
    mlp = ((4 if c.gated_mlp else 2) + ACTIVATION_RESIDUALS[c.activation]) * c.intermediate_size // tensor
    values = 4 * c.hidden_size + (2 + extra) * (q + kv) + mlp
    tokens = batch * seq
    out = tokens * (values * act_bytes + 2 * c.hidden_size * 4 + lora_values * lora_bytes)
    if not flash_attention:
        out += batch * max(c.num_heads // tensor, 1) * seq * seq * (4 + act_bytes)
    return out


def activation_bytes(config: Any, spec: ModelSpec, batch: int, tensor: int = 1) -> int:
    """Activation bytes per device for `batch` rows (the per-device micro-batch) of `spec`."""
    cfg = model_config_of(config)
    act = dtype_bytes(spec.dtype)
    seq = spec.seq_len
    head = _head_of(cfg, spec.head)
    from jaxrl_hier.llm.lora import resolve_targets

    targets = resolve_targets(cfg, spec.lora_targets) if spec.train == "lora" else ()
    layer = layer_activation_bytes(cfg, batch, seq, act, tensor=tensor, flash_attention=spec.flash_attention,
                                   lora_values=spec.lora_rank * len(targets), lora_bytes=dtype_bytes(spec.lora_dtype))
    training = spec.train != "frozen"
    logits = 0
    if head == "lm":
        from jaxrl_hier.llm.sampling import chunk_rows

        positions = seq if spec.logits_chunk <= 0 else min(spec.logits_chunk, max(seq - 1, 1))
        rows = batch if spec.logits_chunk <= 0 else chunk_rows(batch, positions, cfg.vocab_size)
        copies = (4 if spec.logits_chunk <= 0 else 3) if training else 2
        logits = copies * rows * positions * cfg.vocab_size * 4
    edges = 2 * batch * seq * cfg.hidden_size * act
    if not training:
        return layer + logits + edges
    if spec.remat:
        from jaxrl_hier.llm import decoder

        kept = cfg.num_layers * batch * seq * cfg.hidden_size * act
        # the decoder decides on the micro-batch its program runs (all devices' rows)
        if decoder.saves_dots(cfg, (spec.micro_batch or spec.batch) * seq, act, targets, spec.lora_rank):
            values = decoder.saved_dot_values(cfg, targets, spec.lora_rank)
            kept += cfg.num_layers * batch * seq * values * act // tensor
        return kept + layer + logits + edges
    return cfg.num_layers * layer + logits + edges


def _validate(spec: ModelSpec, mesh: MeshShape, roles: set[str]) -> None:
    if spec.train not in TRAIN_MODES:
        raise ConfigError(f"model '{spec.role}': train={spec.train!r}; use one of {TRAIN_MODES}.")
    if spec.train == "lora" and spec.lora_rank <= 0:
        raise ConfigError(f"model '{spec.role}': train='lora' needs lora_rank > 0.")
    if spec.shares_base_with is not None and spec.shares_base_with not in roles:
        raise ConfigError(f"model '{spec.role}' shares_base_with '{spec.shares_base_with}', "
                          f"which is not a model of this plan ({sorted(roles)}).")
    if spec.shares_base_with is not None and spec.train == "full":
        raise ConfigError(f"model '{spec.role}': a fully trained model cannot share another's frozen base; "
                          "use train='lora' or drop shares_base_with.")
    if min(spec.batch, spec.seq_len) <= 0 or spec.kv_cache_len < 0 or spec.micro_batch < 0 or spec.head_params < 0:
        raise ConfigError(f"model '{spec.role}': batch and seq_len must be positive; kv_cache_len, micro_batch "
                          "and head_params >= 0.")
    if spec.micro_batch > spec.batch:
        raise ConfigError(f"model '{spec.role}': micro_batch {spec.micro_batch} exceeds batch {spec.batch}.")
    if min(mesh.data, mesh.fsdp, mesh.tensor) <= 0:
        raise ConfigError(f"mesh sizes must be positive, got {mesh}.")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_model(spec: ModelSpec, mesh: MeshShape, roles: set[str] | None = None) -> ModelMemory:
    """Per-device bytes of one model under `mesh`."""
    import jax
    import jax.numpy as jnp

    _validate(spec, mesh, roles if roles is not None else {spec.role})
    cfg = model_config_of(spec.config)
    shards = mesh.fsdp * mesh.tensor
    base = param_shapes(cfg, spec.dtype, spec.head, spec.pooler)
    n_params = tree_size(base) + spec.head_params
    heads = [jax.ShapeDtypeStruct((spec.head_params,), jnp.float32)] if spec.head_params else []
    adapters = lora_shapes(cfg, spec.lora_rank, spec.lora_targets, spec.lora_dtype) if spec.train == "lora" else []
    trainable: Any = {"lora": [adapters, *heads], "full": [base, *heads], "frozen": []}[spec.train]
    held_weights = tree_nbytes(adapters) + (0 if spec.shares_base_with else tree_nbytes(base) + tree_nbytes(heads))
    grads = tree_nbytes(trainable)
    optimizer = 0
    if spec.train != "frozen":
        if spec.fp32_master:  # a float32 master copy of what trains, with the moments kept over it
            trainable = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), trainable)
            optimizer += tree_nbytes(trainable)
        optimizer += optimizer_bytes(trainable)
    batch = _ceil_div(spec.batch, mesh.data * mesh.fsdp)
    micro = _ceil_div(spec.micro_batch or spec.batch, mesh.data * mesh.fsdp)
    cache = 0
    if spec.kv_cache_len:
        kv_heads_split = mesh.tensor if cfg.num_kv_heads % mesh.tensor == 0 else 1
        cache = kv_cache_bytes(cfg, batch, spec.kv_cache_len, spec.dtype) // kv_heads_split
    n_trainable = tree_size(trainable)
    return ModelMemory(
        role=spec.role,
        params=_ceil_div(held_weights, shards),
        grads=_ceil_div(grads, shards),
        optimizer=_ceil_div(optimizer, shards),
        kv_cache=cache,
        activations=activation_bytes(cfg, spec, micro, mesh.tensor),
        num_params=n_params + tree_size(adapters),
        trainable_params=n_trainable,
        phase=spec.phase or spec.role,
    )


def plan(specs: Sequence[ModelSpec], mesh: MeshShape | Mapping[str, int] | None = None,
         capacity_gib: float | None = None, title: str = "") -> MemoryPlan:
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
    return MemoryPlan(mesh, models, cap, title)


# ----------------------------------------------------------------------------- the measured step


def _step_functions(cfg: ModelConfig, params: Any, logits_chunk: int = 128) -> tuple[Any, Any]:
    """(score, loss) of the training step, each `f(params, lora, input_ids, attention_mask)`.

    Decoder: score = `jaxrl_hier.llm.token_logprobs` [B, T-1] (`logits_chunk` positions of logits at
    a time), loss = minus its mean. Encoder (RoBERTa): score = the value head (`params["value_head"]`)
    at the first token's hidden state [B], loss = the mean of its square (a critic's regression).
    `params` (arrays or ShapeDtypeStructs) only names the decoder's weight dtype."""
    import jax.numpy as jnp

    from jaxrl_hier.llm import encoder
    from jaxrl_hier.llm.heads import value_head_apply
    from jaxrl_hier.llm.models import LanguageModel
    from jaxrl_hier.llm.sampling import token_logprobs

    if not cfg.is_decoder:
        def score(p: Any, lora: Any, input_ids: Any, mask: Any) -> Any:
            hidden, _ = encoder.forward(cfg, p, input_ids, mask, lora=lora)
            return value_head_apply(p["value_head"], hidden[:, 0])

        def loss(p: Any, lora: Any, input_ids: Any, mask: Any) -> Any:
            return jnp.mean(score(p, lora, input_ids, mask) ** 2)
    else:
        lm = LanguageModel(cfg, params)

        def score(p: Any, lora: Any, input_ids: Any, mask: Any) -> Any:
            return token_logprobs(lm, p, input_ids, mask, lora, chunk_size=logits_chunk)

        def loss(p: Any, lora: Any, input_ids: Any, mask: Any) -> Any:
            return -jnp.mean(score(p, lora, input_ids, mask))
    return score, loss


def training_step(config: Any, batch: int, seq_len: int, dtype: Any = "float32", *, lora_rank: int = 0,
                  lora_targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                  logits_chunk: int = 128) -> tuple[Any, tuple]:
    """The real training step and its argument shapes: `(fn, (params, adapters, input_ids, mask))`.

    `fn(params, adapters, input_ids, attention_mask) -> (loss, grads)` is `jax.value_and_grad` of the
    loss of `_step_functions`: a decoder's minus mean `token_logprobs`, an encoder's squared value
    head at the first token. Gradients are with respect to the LoRA adapters (`lora_rank > 0`, the
    frozen backbone an argument) or to all weights (`lora_rank=0`, adapters None). The shapes are
    ShapeDtypeStructs: a decoder's weights with its LM head, an encoder's (no pooler) with a float32
    value head, float32 adapters (`init_lora`), int32 [batch, seq_len] ids and mask.
    `compiled_step_memory` compiles it; `measured_layout_peak` runs it on real arrays."""
    import jax
    import jax.numpy as jnp

    from jaxrl_hier.llm.lora import LoraConfig, init_lora

    cfg = model_config_of(config)
    ids = jax.ShapeDtypeStruct((int(batch), int(seq_len)), jnp.int32)
    lora_config = LoraConfig(rank=max(int(lora_rank), 1), target_modules=tuple(lora_targets))
    adapters = _eval_shape(lambda k: init_lora(cfg, lora_config, k)) if lora_rank > 0 else None
    params = param_shapes(cfg, dtype, "lm" if cfg.is_decoder else "value")
    _, loss = _step_functions(cfg, params, logits_chunk)
    fn = jax.value_and_grad(loss, argnums=1 if adapters is not None else 0)
    return fn, (params, adapters, ids, ids)


def compiled_step_memory(config: Any, batch: int, seq_len: int, dtype: Any = "float32", *, lora_rank: int = 0,
                         lora_targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                         logits_chunk: int = 128) -> dict[str, int]:
    """XLA's `compiled.memory_analysis()` of a real training step, compiled, not run.

    Decoder: `jax.value_and_grad` of a token-level loss (minus the mean of
    `jaxrl_hier.llm.token_logprobs` over a [batch, seq_len] batch), with respect to LoRA adapters
    (`lora_rank > 0`, the frozen backbone an argument) or to all weights (`lora_rank=0`).
    Encoder (RoBERTa): the same for a squared value-head output read at the first token, all weights
    and the head trained (a critic's regression step). The step is `training_step`'s; its arguments
    are ShapeDtypeStructs, so a model of any size compiles without being allocated. Returns temp
    (XLA's scratch beyond arguments and outputs, i.e. what the step keeps: the activations), argument
    and output bytes.
    """
    import jax

    fn, args = training_step(config, batch, seq_len, dtype, lora_rank=lora_rank, lora_targets=lora_targets,
                             logits_chunk=logits_chunk)
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    return {"temp_bytes": int(stats.temp_size_in_bytes), "argument_bytes": int(stats.argument_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes)}


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


def device_memory_stats(device: Any) -> dict[str, int | None]:
    """bytes_in_use and peak_bytes_in_use of the device's allocator (None where the backend has none,
    e.g. XLA:CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 (a backend without allocator statistics)
        stats = None
    stats = stats or {}
    return {k: (int(stats[k]) if k in stats else None) for k in ("bytes_in_use", "peak_bytes_in_use")}


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
    """`python -m jaxrl_hier.llm.memory`: print the naive and our table for the original set-up."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m jaxrl_hier.llm.memory",
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
