"""Load and save HF-format checkpoints (config.json + safetensors) without PyTorch.

Loading reads one tensor (slice) at a time with `safetensors.safe_open` and builds each parameter
with `jax.make_array_from_callback` on its NamedSharding: every device receives only its own shard,
read straight from the file, so the full model is never held whole on one device nor twice in host
memory. Per-layer HF tensors are stacked into the [num_layers, ...] leaves of our tree as they are
read; GPT-2's fused c_attn is split into q/k/v by column ranges.

Saving streams the tensors into one `model.safetensors` (the header is computed from the shapes
first, then each tensor is gathered and written in turn) and writes config.json, so
`transformers.AutoModelForCausalLM.from_pretrained(path)` (or AutoModel for RoBERTa) opens it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from jaxrl_hier.config import ConfigError
from jaxrl_hier.io import atomic_write_json, atomic_writer
from jaxrl_hier.llm import decoder, encoder, sharding
from jaxrl_hier.llm.lora import Lora, merge_lora
from jaxrl_hier.llm.model_config import SUPPORTED_MODEL_TYPES, ModelConfig
from jaxrl_hier.llm.models import HF_ARCHITECTURES, EncoderModel, LanguageModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
              "int32": "I32"}


@dataclass(frozen=True)
class Source:
    """Where one leaf of our tree lives in an HF checkpoint.

    names: one tensor name per layer (stacked leaves) or a single name. transpose: HF stores
    nn.Linear weights as [out, in], we use [in, out]. cols: (start, stop) of our last dimension
    inside a fused HF tensor of `fused` columns (GPT-2 c_attn), else None.
    """

    names: tuple[str, ...]
    stacked: bool
    transpose: bool = False
    cols: tuple[int, int] | None = None
    fused: int = 0


# ----------------------------------------------------------------------------- name maps


def _default_prefix(config: ModelConfig) -> str:
    return {"llama": "model.", "gpt2": "transformer.", "roberta": ""}[config.family]


def _layout_llama(c: ModelConfig, pre: str) -> dict[str, Source]:
    n = c.num_layers

    def per_layer(suffix: str, transpose: bool = False) -> Source:
        return Source(tuple(f"{pre}layers.{i}.{suffix}" for i in range(n)), True, transpose)

    out = {"embed/embedding": Source((f"{pre}embed_tokens.weight",), False),
           "final_norm/scale": Source((f"{pre}norm.weight",), False),
           "layers/attn_norm/scale": per_layer("input_layernorm.weight"),
           "layers/mlp_norm/scale": per_layer("post_attention_layernorm.weight")}
    for proj, module in (("q_proj", "self_attn"), ("k_proj", "self_attn"), ("v_proj", "self_attn"),
                         ("o_proj", "self_attn"), ("gate_proj", "mlp"), ("up_proj", "mlp"), ("down_proj", "mlp")):
        out[f"layers/{proj}/kernel"] = per_layer(f"{module}.{proj}.weight", transpose=True)
        out[f"layers/{proj}/bias"] = per_layer(f"{module}.{proj}.bias")
    out["layers/q_norm/scale"] = per_layer("self_attn.q_norm.weight")
    out["layers/k_norm/scale"] = per_layer("self_attn.k_norm.weight")
    out["lm_head/kernel"] = Source(("lm_head.weight",), False, transpose=True)
    return out


def _layout_gpt2(c: ModelConfig, pre: str) -> dict[str, Source]:
    n, h = c.num_layers, c.hidden_size

    def per_layer(suffix: str, **kw: Any) -> Source:
        return Source(tuple(f"{pre}h.{i}.{suffix}" for i in range(n)), True, **kw)

    out = {"embed/embedding": Source((f"{pre}wte.weight",), False),
           "pos_embed/embedding": Source((f"{pre}wpe.weight",), False),
           "final_norm/scale": Source((f"{pre}ln_f.weight",), False),
           "final_norm/bias": Source((f"{pre}ln_f.bias",), False),
           "lm_head/kernel": Source(("lm_head.weight",), False, transpose=True)}
    for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
        out[f"layers/{ours}/scale"] = per_layer(f"{theirs}.weight")
        out[f"layers/{ours}/bias"] = per_layer(f"{theirs}.bias")
    # Conv1D weights are already [in, out]; c_attn holds q | k | v side by side
    for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        cols = (j * h, (j + 1) * h)
        out[f"layers/{proj}/kernel"] = per_layer("attn.c_attn.weight", cols=cols, fused=3 * h)
        out[f"layers/{proj}/bias"] = per_layer("attn.c_attn.bias", cols=cols, fused=3 * h)
    for ours, theirs in (("o_proj", "attn.c_proj"), ("up_proj", "mlp.c_fc"), ("down_proj", "mlp.c_proj")):
        out[f"layers/{ours}/kernel"] = per_layer(f"{theirs}.weight")
        out[f"layers/{ours}/bias"] = per_layer(f"{theirs}.bias")
    return out


def _layout_roberta(c: ModelConfig, pre: str) -> dict[str, Source]:
    n = c.num_layers

    def per_layer(suffix: str, transpose: bool = False) -> Source:
        return Source(tuple(f"{pre}encoder.layer.{i}.{suffix}" for i in range(n)), True, transpose)

    e = f"{pre}embeddings."
    out = {"embed/embedding": Source((e + "word_embeddings.weight",), False),
           "pos_embed/embedding": Source((e + "position_embeddings.weight",), False),
           "type_embed/embedding": Source((e + "token_type_embeddings.weight",), False),
           "embed_norm/scale": Source((e + "LayerNorm.weight",), False),
           "embed_norm/bias": Source((e + "LayerNorm.bias",), False),
           "pooler/kernel": Source((f"{pre}pooler.dense.weight",), False, transpose=True),
           "pooler/bias": Source((f"{pre}pooler.dense.bias",), False)}
    for ours, theirs in (("q_proj", "attention.self.query"), ("k_proj", "attention.self.key"),
                         ("v_proj", "attention.self.value"), ("o_proj", "attention.output.dense"),
                         ("up_proj", "intermediate.dense"), ("down_proj", "output.dense")):
        out[f"layers/{ours}/kernel"] = per_layer(f"{theirs}.weight", transpose=True)
        out[f"layers/{ours}/bias"] = per_layer(f"{theirs}.bias")
    for ours, theirs in (("attn_norm", "attention.output.LayerNorm"), ("mlp_norm", "output.LayerNorm")):
        out[f"layers/{ours}/scale"] = per_layer(f"{theirs}.weight")
        out[f"layers/{ours}/bias"] = per_layer(f"{theirs}.bias")
    return out


def layout(config: ModelConfig, prefix: str | None = None) -> dict[str, Source]:
    """Our parameter path -> its HF tensor(s), for every parameter the family can have."""
    pre = _default_prefix(config) if prefix is None else prefix
    return {"llama": _layout_llama, "gpt2": _layout_gpt2, "roberta": _layout_roberta}[config.family](config, pre)


def _flat(tree: Any) -> dict[str, Any]:
    return {sharding.path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflat(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = out
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    return out


# ----------------------------------------------------------------------------- reading


def _check_dir(path: str | os.PathLike) -> Path:
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"model directory not found: {root}. Pass a local directory holding config.json and "
                          f"{SINGLE_FILE} (jaxrl_hier never downloads; fetch it with `huggingface-cli download`).")
    if not (root / "config.json").is_file():
        raise ConfigError(f"{root / 'config.json'} not found: the model directory needs the HF config.json.")
    return root


def _weight_files(root: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded index)."""
    if (root / INDEX_FILE).is_file():
        weight_map = json.loads((root / INDEX_FILE).read_text()).get("weight_map", {})
        missing = sorted({f for f in weight_map.values() if not (root / f).is_file()})
        if missing:
            raise ConfigError(f"{root / INDEX_FILE} lists shard(s) that are missing: {', '.join(missing)}.")
        return {name: root / f for name, f in weight_map.items()}
    if (root / SINGLE_FILE).is_file():
        from safetensors import safe_open

        with safe_open(root / SINGLE_FILE, "np") as f:
            return {name: root / SINGLE_FILE for name in f.keys()}
    others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack"))
    hint = f" (found {', '.join(others)}: convert them to safetensors first)" if others else ""
    raise ConfigError(f"no weights in {root}: expected {SINGLE_FILE} or {INDEX_FILE}{hint}.")


def _detect_prefix(config: ModelConfig, names: Any) -> str:
    """The name prefix of this checkpoint ('model.', 'transformer.', 'roberta.' or none)."""
    probe = {"llama": "embed_tokens.weight", "gpt2": "wte.weight",
             "roberta": "embeddings.word_embeddings.weight"}[config.family]
    candidates = {"llama": ("model.", ""), "gpt2": ("transformer.", ""), "roberta": ("", "roberta.")}[config.family]
    for pre in candidates:
        if pre + probe in names:
            return pre
    raise ConfigError(f"the checkpoint has no {' or '.join(p + probe for p in candidates)}: not a "
                      f"{config.model_type} checkpoint in HF naming.")


def _expected_leaves(config: ModelConfig, names: Any, dtype: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """Our leaves for this checkpoint: the config's tree, with the optional RoBERTa pooler as present."""
    if config.is_decoder:
        return _flat(decoder.param_shapes(config, dtype))
    has_pooler = any(n.endswith("pooler.dense.weight") for n in names)
    return _flat(encoder.param_shapes(config, dtype, pooler=has_pooler))


def _hf_shape(src: Source, leaf_shape: tuple[int, ...]) -> tuple[int, ...]:
    shape = list(leaf_shape[1:] if src.stacked else leaf_shape)
    if src.cols is not None:
        shape[-1] = src.fused
    return tuple(reversed(shape)) if src.transpose else tuple(shape)


def _check_shapes(handles: dict[str, Any], files: dict[str, Path], plan: dict[str, tuple[Source, Any]]) -> None:
    for path, (src, leaf) in plan.items():
        want = _hf_shape(src, leaf.shape)
        for name in src.names:
            if name not in files:
                raise ConfigError(f"tensor '{name}' (for {path}) is missing from the checkpoint.")
            got = tuple(handles[str(files[name])].get_slice(name).get_shape())
            if got != want:
                raise ConfigError(f"tensor '{name}' has shape {got} but the config implies {want}; "
                                  "the weights do not match config.json.")


def _reader(handles: dict[str, Any], files: dict[str, Path], src: Source, shape: tuple[int, ...], dtype: Any):
    """The data callback of make_array_from_callback: read one shard of one leaf from the files."""

    def read(index: tuple[slice, ...]) -> np.ndarray:
        idx = [slice(*s.indices(d)[:2]) for s, d in zip(index, shape)]
        names = src.names
        if src.stacked:
            names, idx = names[idx[0]], idx[1:]
        if src.cols is not None:  # shift our column range into the fused tensor
            last = idx[-1]
            idx[-1] = slice(last.start + src.cols[0], last.stop + src.cols[0])
        hf_idx = tuple(reversed(idx)) if src.transpose else tuple(idx)
        parts = []
        for name in names:
            part = handles[str(files[name])].get_slice(name)[hf_idx]
            parts.append(np.asarray(part.T if src.transpose else part).astype(dtype))
        return np.stack(parts) if src.stacked else parts[0]

    return read


def load_params(path: str | os.PathLike, config: ModelConfig, *, dtype: Any = jnp.float32,
                mesh: Mesh | None = None) -> tuple[dict[str, Any], str]:
    """Read the weights of `path` into our tree (sharded over `mesh`); returns (params, name prefix)."""
    from safetensors import safe_open

    sharding.check_mesh(mesh)
    root = Path(path)
    files = _weight_files(root)
    prefix = _detect_prefix(config, files)
    sources = layout(config, prefix)
    leaves = _expected_leaves(config, files, dtype)
    if config.is_decoder and config.tie_word_embeddings:
        leaves.pop("lm_head/kernel", None)
    plan = {p: (sources[p], leaf) for p, leaf in leaves.items()}
    np_dtype = np.dtype(jnp.dtype(dtype))
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        handles = {str(f): stack.enter_context(safe_open(f, "np")) for f in sorted(set(files.values()))}
        _check_shapes(handles, files, plan)
        for path_, (src, leaf) in plan.items():
            target = (NamedSharding(mesh, sharding.spec_for(path_, leaf.shape, mesh)) if mesh is not None
                      else SingleDeviceSharding(jax.devices()[0]))
            out[path_] = jax.make_array_from_callback(leaf.shape, target,
                                                      _reader(handles, files, src, leaf.shape, np_dtype))
    return _unflat(out), prefix


def _read_model_type(root: Path) -> str:
    try:
        raw = json.loads((root / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{root / 'config.json'} is not valid JSON: {err}") from None
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(raw.get("architectures") or []) or "no architectures listed"
        raise ConfigError(f"unsupported architecture model_type='{model_type}' ({arch}) in {root / 'config.json'}; "
                          f"jaxrl_hier.llm supports {', '.join(SUPPORTED_MODEL_TYPES)}.")
    return model_type


#: tokenizer_config.json classes that mean "exactly the pipeline in tokenizer.json" (transformers 5 / 4 names)
PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_class(root: Path) -> str | None:
    try:
        return json.loads((root / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None  # AutoTokenizer then reports what is wrong with the files


def _load_tokenizer(root: Path) -> Any:
    if not any((root / f).is_file() for f in TOKENIZER_FILES):
        return None
    import transformers

    try:
        # A plain tokenizer.json (ours: tasks.build_char_tokenizer) is loaded as written. AutoTokenizer
        # would pick the class of config.json's model_type instead (Qwen2Tokenizer for a qwen2 model)
        # and rebuild the pipeline with that model's pre-tokenizer, which drops newlines.
        if _tokenizer_class(root) in PLAIN_FAST_TOKENIZERS and (root / "tokenizer.json").is_file():
            return transformers.PreTrainedTokenizerFast.from_pretrained(str(root), local_files_only=True)
        return transformers.AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except Exception as err:  # a broken tokenizer must not pass silently
        raise ConfigError(f"the tokenizer files in {root} could not be loaded: {err}") from None


def load_pretrained(path: str | os.PathLike, *, dtype: Any = jnp.float32,
                    mesh: Mesh | None = None) -> LanguageModel | EncoderModel:
    """Load an HF checkpoint directory (config.json + safetensors [+ tokenizer]); never downloads.

    Returns a `LanguageModel` for Llama / Mistral / Qwen2 / Qwen3 / GPT-2, an `EncoderModel` for
    RoBERTa. Weights are cast to `dtype` and placed shard by shard on `mesh` (default: the first device).
    """
    import transformers

    sharding.check_mesh(mesh)  # an Explicit-axes mesh is refused here, not at the first forward
    root = _check_dir(path)
    _read_model_type(root)
    hf_config = transformers.AutoConfig.from_pretrained(str(root), local_files_only=True)
    config = ModelConfig.from_hf(hf_config)
    params, prefix = load_params(root, config, dtype=dtype, mesh=mesh)
    cls = LanguageModel if config.is_decoder else EncoderModel
    return cls(config, params, hf_config=hf_config, tokenizer=_load_tokenizer(root), mesh=mesh,
               weight_prefix=prefix)


# ----------------------------------------------------------------------------- writing


def _hf_tensors(config: ModelConfig, params: dict[str, Any], prefix: str) -> dict[str, list[tuple[str, Any]]]:
    """HF name -> the pieces (path, layer index or None, column start) that make it up, in order."""
    sources = layout(config, prefix)
    flat = _flat(params)
    pieces: dict[str, list[tuple[str, Any]]] = {}
    for path, leaf in flat.items():
        if path not in sources:
            raise ConfigError(f"parameter '{path}' has no HF name for a {config.model_type} model.")
        src = sources[path]
        for i, name in enumerate(src.names):
            pieces.setdefault(name, []).append((path, i if src.stacked else None,
                                                src.cols[0] if src.cols else 0))
    return {name: sorted(parts, key=lambda p: p[2]) for name, parts in pieces.items()}


def _gather(flat: dict[str, Any], sources: dict[str, Source], parts: list[tuple[str, Any]]) -> np.ndarray:
    """Assemble one HF tensor on the host from its piece(s)."""
    arrays = []
    for path, layer, _ in parts:
        leaf = flat[path][layer] if layer is not None else flat[path]
        arr = _host_value(leaf)
        arrays.append(arr.T if sources[path].transpose else arr)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)


def _host_value(leaf: Any) -> np.ndarray:
    """The whole value of `leaf` on this host. A leaf with shards on other processes is
    all-gathered: a collective, so every process calls this for the same leaves in the same order."""
    if getattr(leaf, "is_fully_addressable", True):
        return np.asarray(jax.device_get(leaf))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))


def _write_safetensors(path: Path, names: list[str], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any],
                       produce: Any) -> None:
    """Stream tensors into a safetensors file: header from the shapes, then each tensor in turn.

    Process 0 writes (atomically, through jaxrl_hier.io.atomic_writer); the other processes of a
    multi-process run still produce every tensor, since producing one may be a collective gather.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        nbytes = int(np.prod(shapes[name])) * np.dtype(dtypes[name]).itemsize
        header[name] = {"dtype": _ST_DTYPES[np.dtype(dtypes[name]).name], "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    if jax.process_index() != 0:
        for name in names:
            produce(name)
        return
    with atomic_writer(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            arr = np.ascontiguousarray(produce(name))
            if arr.shape != tuple(shapes[name]) or arr.dtype != np.dtype(dtypes[name]):
                raise RuntimeError(f"{name}: produced {arr.shape} {arr.dtype}, header says "
                                   f"{shapes[name]} {dtypes[name]}")
            f.write(arr.tobytes())


def _tensor_meta(flat: dict[str, Any], sources: dict[str, Source], parts: list[tuple[str, Any]]
                 ) -> tuple[tuple[int, ...], Any]:
    shapes = []
    for path, layer, _ in parts:
        shape = tuple(flat[path].shape[1:] if layer is not None else flat[path].shape)
        shapes.append(tuple(reversed(shape)) if sources[path].transpose else shape)
    shape = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
    return shape, np.dtype(flat[parts[0][0]].dtype)


def save_pretrained(model: LanguageModel | EncoderModel, params: dict[str, Any] | None, path: str | os.PathLike, *,
                    lora: Lora | None = None, save_tokenizer: bool = True) -> Path:
    """Write `params` (default: model.params; a LoRA adapter is merged first) as an HF checkpoint.

    Tied models write no lm_head (transformers ties it on load). The tensors are streamed one at
    a time from the devices into model.safetensors; config.json follows the model's HF config.
    In a multi-process run every process calls this (shards on other processes are all-gathered)
    and process 0 writes the files; all return once they are complete.
    """
    if model.hf_config is None:
        raise ConfigError("this model has no HF config to write; build it with load_pretrained or .random(hf_config).")
    params = merge_lora(model.params if params is None else params, lora, model.config)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    prefix = model.weight_prefix if model.weight_prefix is not None else _default_prefix(model.config)
    sources = layout(model.config, prefix)
    flat = _flat(params)
    pieces = _hf_tensors(model.config, params, prefix)
    names = sorted(pieces)
    meta = {n: _tensor_meta(flat, sources, pieces[n]) for n in names}
    _write_safetensors(root / SINGLE_FILE, names, {n: m[0] for n, m in meta.items()},
                       {n: m[1] for n, m in meta.items()}, lambda n: _gather(flat, sources, pieces[n]))
    if jax.process_index() == 0:  # in a multi-process run, process 0 alone writes the files
        stale = root / INDEX_FILE  # a sharded index left from an earlier save would shadow the new file
        if stale.exists():
            stale.unlink()
        cfg = json.loads(model.hf_config.to_json_string(use_diff=False))
        cfg["architectures"] = cfg.get("architectures") or [HF_ARCHITECTURES[model.config.model_type]]
        cfg["dtype"] = jnp.dtype(meta[names[0]][1]).name
        atomic_write_json(root / "config.json", cfg)
        if save_tokenizer and model.tokenizer is not None:
            model.tokenizer.save_pretrained(str(root))
    if jax.process_count() > 1:  # no process returns before the checkpoint is complete on disk
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"jaxrl_hier.save_pretrained:{root}")
    return root


def iter_hf_names(model: LanguageModel | EncoderModel) -> Iterator[str]:
    """The HF tensor names save_pretrained writes for this model."""
    prefix = model.weight_prefix if model.weight_prefix is not None else _default_prefix(model.config)
    yield from sorted(_hf_tensors(model.config, model.params, prefix))
