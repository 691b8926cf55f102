"""Frozen-dataclass configs loaded from YAML, with `key=value` overrides and validation.

Every user-facing mistake (missing file, unknown key, wrong type, invalid value) raises
`ConfigError` with one message that names the problem and the fix. The CLIs turn it into
exit code 2 before anything compiles.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import types
import typing
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A user-facing configuration error: the message says what is wrong and how to fix it."""


def closest(name: str, choices: Sequence[str]) -> str:
    """A ' Did you mean ...?' hint for a misspelt name, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else ""


def read_yaml_document(path: str | Path, what: str = "config file",
                       hint: str = "Pass an existing YAML file with --config.") -> Any:
    """Any YAML document, with clear errors for a missing file or invalid YAML (`what` names it)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}. {hint}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} {path} is not valid YAML: {err}") from None


def packaged_config_dir() -> Path:
    """The folder of the YAML configs shipped inside the package (`jaxrl_hier/configs`, package data).

    Found through `importlib.resources`, so it is the installed package's folder after `pip install .`
    and the source tree's in a clone (whose top-level `configs` links to it). A wheel installs as
    plain files, so the resource is a directory on disk.
    """
    return Path(importlib.resources.files("jaxrl_hier").joinpath("configs"))


def packaged_config_names() -> list[str]:
    """The names of the packaged configs (file stems), sorted: what a bare `--config NAME` accepts."""
    return sorted(p.stem for p in packaged_config_dir().glob("*.yaml"))


def resolve_config(path: str | Path) -> Path:
    """The config file a `--config` value names.

    An existing file is returned as given. Otherwise a bare name (no directory part, with or without
    `.yaml`: `ppo_cartpole`, `ppo_cartpole.yaml`) is looked up among the packaged configs. When
    neither exists, ConfigError names the value and lists the packaged configs.
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.parent == Path("."):
        packaged = packaged_config_dir() / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
        if packaged.is_file():
            return packaged
    names = packaged_config_names()
    raise ConfigError(f"config file not found: {path}.{closest(path.stem, names)} Pass an existing YAML file, "
                      f"or the name of a packaged config: {', '.join(names)}.")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with clear errors for a missing file or a non-mapping document."""
    data = read_yaml_document(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of key: value, not {type(data).__name__}.")
    return data


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse `key=value` strings; values are read as YAML scalars (so `lr=3e-4`, `anneal_lr=false`)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (for example num_envs=64).")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key.")
        try:
            out[key] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Check and convert one value against a field's type annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, value, arg)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"'{name}' cannot be None.")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"'{name}' must be one of {list(args)}, got {value!r}.")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{name}' must be a list, got {value!r}.")
        inner = args[0] if args else Any
        return tuple(_coerce(name, v, inner) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"'{name}' must be true or false, got {value!r}.")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"'{name}' must be an integer, got {value!r}.")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"'{name}' must be a number, got {value!r}.")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"'{name}' must be a string, got {value!r}.")
        return value
    return value


def _nest_dotted(values: Mapping[str, Any]) -> dict[str, Any]:
    """`{"ppo.lr": 1e-3}` (an override of one key of a nested section) as `{"ppo": {"lr": 1e-3}}`,
    merged into a `ppo:` mapping given beside it (the dotted key, an override, wins)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if not dot:
            if isinstance(out.get(key), dict) and isinstance(value, Mapping):
                out[key] = {**value, **out[key]}
            else:
                out[key] = value
            continue
        section = out.get(head)
        if section is None:
            section = out[head] = {}
        elif isinstance(section, Mapping):
            section = out[head] = dict(section)  # a copy: the caller's mapping is left as it was
        if not isinstance(section, dict):
            raise ConfigError(f"'{key}' sets a key of section '{head}', but '{head}' is {section!r}, not a section.")
        section[rest] = value
    return out


def _section(cls: type, name: str, base: Any, value: Any, source: str, overridden: Collection[str],
             overrides_source: str) -> Any:
    """A nested config section: its keys in `value` over the field's default `base` (so a section in
    YAML gives only what it changes), built and validated as a config of its own."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"'{name}' is a section of keys ({cls.__name__}): write it as a mapping, e.g. "
                          f"{name}: {{key: value}}, or override one key as {name}.KEY=VALUE; got {value!r}.")
    try:
        inner = {k.partition(".")[2] for k in overridden if k.startswith(f"{name}.")}
        return build_dataclass(cls, {**to_dict(base), **value}, source=f"{source}, section '{name}'", overridden=inner,
                               overrides_source=f"{overrides_source}, section '{name}'")
    except ConfigError as err:  # the section's own checks name its keys without the section
        raise (err if f"section '{name}'" in str(err) else ConfigError(f"section '{name}': {err}")) from None


def build_dataclass(cls: type[T], values: Mapping[str, Any], *, source: str = "config",
                    overridden: Collection[str] = (), overrides_source: str = "the command-line overrides") -> T:
    """Build a frozen dataclass from a mapping, rejecting unknown keys (with a suggestion) and
    checking types; then run the class's own `validate()` if it has one.

    A field typed as a config dataclass is a nested section (`ppo:` with PPOConfig's keys), given as a
    mapping over the field's default, or key by key with dotted names (`ppo.lr=1e-3`). A class may map
    keys it no longer has to their new home in `MOVED_KEYS` ({"sft_steps": "sft.steps"}), so an old
    config gets a message naming the new key. `source` names where the values came from, and
    `overridden` the keys (dotted for a section's) that came from the command line instead, so a
    message about one of those names the command line, not the file."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    moved: Mapping[str, str] = getattr(cls, "MOVED_KEYS", {})
    kwargs: dict[str, Any] = {}
    for key, value in _nest_dotted(values).items():
        where = overrides_source if key in overridden else source
        if key in moved:
            raise ConfigError(f"config key '{key}' in {where} is now '{moved[key]}': write it as "
                              f"{moved[key]}=VALUE, or under the '{moved[key].split('.')[0]}:' section in YAML.")
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{key}' in {where}.{closest(key, list(fields))} "
                f"Known keys: {', '.join(sorted(fields))}."
            )
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            f = fields[key]
            base = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            kwargs[key] = _section(hint, key, base, value, source, overridden, overrides_source)
        else:
            kwargs[key] = _coerce(key, value, hint)
    try:
        obj = cls(**kwargs)
    except TypeError as err:  # a required field without a default
        raise ConfigError(f"{source}: {err}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = ()
) -> T:
    """Load `cls` from an optional YAML file (a path, or a packaged config's name: `resolve_config`),
    then apply `key=value` overrides, then validate."""
    values: dict[str, Any] = {}
    source = "config"
    if path is not None:
        path = resolve_config(path)
        values.update(read_yaml(path))
        source = str(path)
    extra = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    values.update(extra)
    return build_dataclass(cls, values, source=source, overridden=set(extra))


def config_from_args(cls: type[T], raw: Mapping[str, Any], args: Any) -> T:
    """`build_dataclass` for a CLI: `args.config_source` names the file the mapping came from and
    `args.override_keys` the keys its command-line overrides set (`jaxrl_hier.train.load_raw_config`)."""
    return build_dataclass(cls, raw, source=getattr(args, "config_source", "config"),
                           overridden=getattr(args, "override_keys", ()))


def to_dict(config: Any) -> dict[str, Any]:
    """A plain dict of a config dataclass (nested sections as dicts), with tuples turned into lists for YAML."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically."""
    from jaxrl_hier.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))
