"""YAML -> typed dataclasses, with errors that name the file and the key.

Only ``yaml.safe_load`` is used. Unknown keys are errors (a typo must not silently
fall back to a default). ``apply_overrides`` takes ``a.b.c=value`` strings from a CLI.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from comsim.errors import ComSimError

T = TypeVar("T")

# The built-in configs (twin/, lab/, tasks/, translator/, experiments/), found from the package
# itself: commands and library calls work from any working directory.
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PANDA_CELL = CONFIGS / "twin" / "panda_cell.yaml"  # the nominal twin of the built-in lab's cell
PANDA_PUSH_CELL = CONFIGS / "twin" / "panda_cell_push.yaml"  # ... with the push task's target sticker
# arithmetic of policy training and translator sampling: float32, or bfloat16 under torch.autocast
PRECISIONS = ("fp32", "bf16")


def config_file(path: str | Path) -> Path:
    """A config named by the user: the file itself if it exists (absolute, or relative to the
    working directory), else a built-in one named from the repository (``configs/...``) or from
    ``configs/`` (``twin/panda_cell.yaml``)."""
    p = Path(path)
    if p.is_absolute() or p.is_file():
        return p
    if p.parts and p.parts[0] == CONFIGS.name and (CONFIGS.parent / p).is_file():
        return CONFIGS.parent / p
    return CONFIGS / p if (CONFIGS / p).is_file() else p


class ConfigError(ComSimError, ValueError):
    """A config file or value is not what its dataclass expects; the message names the file and key."""


def read_config_text(path: str | Path) -> str:
    """The text of a config file; a missing file or one that is not UTF-8 text is a ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text (UTF-8) file: byte {e.start} is {e.object[e.start:e.start + 1]!r}") from None


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    text = read_config_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected None")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}: {value!r}")
            return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        out = [_convert(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        vt = args[1] if args else Any
        return {k: _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; a float field means a number
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):  # YAML's .nan/.inf: NaN passes every range check that follows
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown or mistyped keys raise ConfigError."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where or cls.__name__}: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def load_config(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    data = load_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b=value`` overrides; values are parsed as YAML scalars/lists. A number
    after a list indexes it (``look.lights.1.castshadow=false``: the second light)."""
    import copy

    data = copy.deepcopy(data)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key.path=value")
        key, raw = ov.split("=", 1)
        value = yaml.safe_load(raw)
        node, above = data, "the top level"
        parts = key.strip().split(".")
        for p, below in zip(parts, parts[1:] + [None]):
            if isinstance(node, list):
                if not (p.isdigit() and int(p) < len(node)):
                    raise ConfigError(f"override {ov!r}: {p!r} is not an index of {above}, a list of {len(node)}")
                p = int(p)
            elif not isinstance(node, dict):
                raise ConfigError(f"override {ov!r}: {above} is not a mapping")
            above = p
            if below is None:
                node[p] = value
            elif isinstance(node, dict):
                node = node.setdefault(p, {})
            else:
                node = node[p]
    return data


def to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj)
