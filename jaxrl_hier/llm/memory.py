"""Per-device memory planner for LLM RL: parameters, gradients, Adam state, KV cache, activations.

A run holds several models at once (actor, reference, critic, guidance, ...). Each is a `ModelSpec`:
its architecture (a `jaxrl_hier.llm.ModelConfig`, a transformers config or a dict of HF config
fields with `model_type`, all read through `ModelConfig.from_hf`), dtype, how it is trained (full,
LoRA or frozen), the batch and sequence sizes it sees, and the phase (training step) in which its
gradients and activations are live. `plan(specs, mesh)` returns a `MemoryPlan` with bytes PER DEVICE
for a mesh of (data, fsdp, tensor) axes; `.table()` prints it. The guidance-agent case study (its
models and sizes, its two tables, our layout run for real) is `jaxrl_hier.llm.memory_case`;
`python -m jaxrl_hier.llm.memory_case` prints its tables.

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
           "compiled_step_memory", "training_step", "device_memory_stats"]

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


def device_memory_stats(device: Any) -> dict[str, int | None]:
    """bytes_in_use and peak_bytes_in_use of the device's allocator (None where the backend has none,
    e.g. XLA:CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 (a backend without allocator statistics)
        stats = None
    stats = stats or {}
    return {k: (int(stats[k]) if k in stats else None) for k in ("bytes_in_use", "peak_bytes_in_use")}
