"""Device meshes and partition rules for the transformer parameters, caches and activations.

Mesh axes: "data" (batch only), "fsdp" (batch, and every weight split ZeRO-3 style), "tensor"
(attention heads and MLP width, Megatron style). Each parameter path (e.g. "layers/q_proj/kernel")
is matched against `PARAM_RULES`; the first regex that matches gives its PartitionSpec. Column
projections (embed, q/k/v, gate/up) split their output dim over "tensor" and their input dim over
"fsdp"; row projections (o, down) the other way round, so the pair needs one reduction. Stacked
layer weights keep their leading layer dim unsplit. A mesh axis that does not divide a dimension
is dropped for that dimension (the array is replicated along it) instead of failing.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_hier.config import ConfigError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
_COL = r"(q_proj|k_proj|v_proj|gate_proj|up_proj)"
_ROW = r"(o_proj|down_proj)"

#: (regex on the "/"-joined parameter path, spec per dimension); the first match wins.
PARAM_RULES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    (r"^embed/embedding$", ("tensor", "fsdp")),
    (r"^(pos_embed|type_embed)/embedding$", (None, "fsdp")),
    (r"^lm_head/kernel$", ("fsdp", "tensor")),
    (rf"^layers/{_COL}/kernel$", (None, "fsdp", "tensor")),
    (rf"^layers/{_COL}/bias$", (None, "tensor")),
    (rf"^layers/{_ROW}/kernel$", (None, "tensor", "fsdp")),
    (rf"^layers/{_ROW}/bias$", (None, None)),
    (r"^layers/\w+_norm/(scale|bias)$", (None, None)),
    (r"^(final_norm|embed_norm)/(scale|bias)$", (None,)),
    (r"^pooler/kernel$", ("fsdp", "tensor")),
    (r"^pooler/bias$", ("tensor",)),
    # LoRA adapters [layers, in, rank] / [layers, rank, out] (under `Lora.params`): split like the weight they adapt
    (rf"^(params/)?layers/{_COL}/a$", (None, "fsdp", None)),
    (rf"^(params/)?layers/{_COL}/b$", (None, None, "tensor")),
    (rf"^(params/)?layers/{_ROW}/a$", (None, "tensor", None)),
    (rf"^(params/)?layers/{_ROW}/b$", (None, None, "fsdp")),
)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; one size may be -1 (all remaining devices)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ConfigError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}.")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ConfigError(f"{len(devices)} devices cannot be split into data={data} fsdp={fsdp} tensor={tensor}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices) or min(sizes) < 1:
        raise ConfigError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} does not use the "
                          f"{len(devices)} available devices exactly; choose sizes whose product is {len(devices)}.")
    return jax.make_mesh(tuple(sizes), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)


def check_mesh(mesh: Mesh | None) -> Mesh | None:
    """Refuse a mesh with Explicit axes (plain `jax.make_mesh`'s default in this JAX): the model
    places and constrains arrays in Auto mode (with_sharding_constraint), which Explicit axes reject
    at the first gather deep inside a forward. Returns the mesh unchanged when it is usable."""
    if mesh is None:
        return None
    if not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; build one with "
                          "jaxrl_hier.llm.make_mesh(data=, fsdp=, tensor=).")
    auto = jax.sharding.AxisType.Auto
    explicit = [name for name, kind in zip(mesh.axis_names, mesh.axis_types) if kind != auto]
    if explicit:
        names = ", ".join(repr(n) for n in mesh.axis_names)
        raise ConfigError(
            f"mesh axes {', '.join(repr(n) for n in explicit)} are not Auto (jax.make_mesh makes Explicit axes by "
            f"default); the LLM models need Auto axes: build the "
            f"mesh with jaxrl_hier.llm.make_mesh(data=, fsdp=, tensor=) or jax.make_mesh(shape, ({names},), "
            f"axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axis_names)}).")
    return mesh


def path_str(path: tuple[Any, ...]) -> str:
    """'layers/q_proj/kernel' for a jax.tree_util key path."""
    parts = []
    for key in path:
        parts.append(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))))
    return "/".join(parts)


def fit_spec(spec: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> P:
    """Drop mesh axes that are missing from `mesh` or do not divide their dimension."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        names = tuple(n for n in names if n in mesh.shape)
        size = int(np.prod([mesh.shape[n] for n in names])) if names else 1
        if not names or dim % size:
            out.append(None)
        else:
            out.append(names[0] if len(names) == 1 else names)
    return P(*out)


def spec_for(path: str, shape: Sequence[int], mesh: Mesh) -> P:
    """The PartitionSpec of one parameter; every parameter must match a rule."""
    for pattern, spec in PARAM_RULES:
        if re.search(pattern, path):
            if len(spec) != len(shape):
                raise ConfigError(f"partition rule {pattern!r} has {len(spec)} dims but {path} has shape {shape}.")
            return fit_spec(spec, shape, mesh)
    raise ConfigError(f"no partition rule matches parameter '{path}'; add one to jaxrl_hier.llm.sharding.PARAM_RULES.")


def param_shardings(tree: Any, mesh: Mesh) -> Any:
    """A NamedSharding for every leaf of a parameter (or LoRA) tree of arrays or ShapeDtypeStructs."""
    check_mesh(mesh)
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, spec_for(path_str(path), leaf.shape, mesh)), tree)


def batch_spec(mesh: Mesh, batch: int, ndim: int, batch_dim: int = 0) -> P:
    """Split dim `batch_dim` over data x fsdp (as far as they divide it); other dims replicated."""
    spec: list[Any] = [None] * ndim
    spec[batch_dim] = BATCH_AXES
    return fit_spec(spec, (1,) * batch_dim + (batch,) + (1,) * (ndim - batch_dim - 1), mesh)


def constrain(x: jax.Array, mesh: Mesh | None, spec: P) -> jax.Array:
    """with_sharding_constraint when a mesh is given; identity without one."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def constrain_batch(x: jax.Array, mesh: Mesh | None, batch_dim: int = 0) -> jax.Array:
    """Activations [B, ...]: batch over data x fsdp, the rest replicated."""
    if mesh is None:
        return x
    return constrain(x, mesh, batch_spec(mesh, x.shape[batch_dim], x.ndim, batch_dim))


def cache_spec(mesh: Mesh, shape: Sequence[int]) -> P:
    """KV cache [layers, B, kv_heads, max_len, head_dim]: batch over data x fsdp, kv heads over tensor."""
    return fit_spec((None, BATCH_AXES, "tensor", None, None), shape, mesh)
