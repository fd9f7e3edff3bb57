"""Parameters of primitives and success predicates: kinds, defaults, allowed ranges, parsing.

A float parameter may be written as a number or as ``[low, high]``: a randomization range
sampled once per episode. Names refer to the task's object roles or targets; a place may
also be a literal point ``[x, y]`` (or ``[x, y, z]`` for ``move``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    kind: str  # float | int | bool | object | place | point
    default: Any = REQUIRED
    bounds: tuple[float, float] | None = None  # allowed values (floats, ints)
    doc: str = ""


@dataclass(frozen=True)
class Ref:
    """Where a parameter points: an object role, a target, or a literal point (world frame)."""
    kind: str  # object | target | point
    name: str = ""
    point: tuple[float, ...] = ()

    def __str__(self) -> str:
        return self.name if self.kind != "point" else str(list(self.point))


def parse_params(specs: dict[str, Param], raw, line: int, what: str, names: dict[str, set],
                 fail: Callable[[int, str], None]) -> tuple[dict, dict]:
    """Check ``raw`` (a mapping from the YAML, or None) against ``specs``.

    Returns (values, lines): floats become (low, high) ranges, references become ``Ref``.
    ``names`` has the known "objects" and "targets"; ``fail(line, msg)`` raises.
    """
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        fail(line, f"{what}: parameters must be a mapping like {{{', '.join(specs)}: ...}}, got {raw!r}")
    key_line = getattr(raw, "line_of", lambda k: line)
    unknown = sorted(set(raw) - set(specs))
    if unknown:
        fail(key_line(unknown[0]), f"{what}: unknown parameter {unknown[0]!r}; known: {sorted(specs)}")
    values, lines = {}, {}
    for name, spec in specs.items():
        ln = key_line(name) if name in raw else line
        lines[name] = ln
        if name not in raw:
            if spec.default is REQUIRED:
                fail(line, f"{what}: parameter {name!r} is required ({spec.doc})")
            value = spec.default
        else:
            value = raw[name]
        values[name] = _parse_value(spec, value, ln, f"{what}.{name}", names, fail)
    return values, lines


def _parse_value(spec: Param, v, line: int, where: str, names: dict[str, set], fail):
    k = spec.kind
    if v is None and spec.default is None:
        return None  # optional parameter left unset: the primitive picks (see its doc)
    if k == "float":
        lo, hi = parse_range(v, line, where, fail)
        if spec.bounds and (lo < spec.bounds[0] or hi > spec.bounds[1]):
            fail(line, f"{where}: {v!r} is out of range; allowed [{spec.bounds[0]}, {spec.bounds[1]}]")
        return lo, hi
    if k == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            fail(line, f"{where}: expected an integer, got {v!r}")
        if spec.bounds and not spec.bounds[0] <= v <= spec.bounds[1]:
            fail(line, f"{where}: {v} is out of range; allowed [{spec.bounds[0]}, {spec.bounds[1]}]")
        return v
    if k == "bool":
        if not isinstance(v, bool):
            fail(line, f"{where}: expected true/false, got {v!r}")
        return v
    if k in ("object", "place", "point"):
        if v is None:
            return None
        if isinstance(v, str):
            if v in names["objects"]:
                return Ref("object", v)
            if v in names["targets"] and k != "object":
                return Ref("target", v)
            known = sorted(names["objects"]) if k == "object" else sorted(names["objects"] | names["targets"])
            noun = "object" if k == "object" else "object or target"
            fail(line, f"{where}: {noun} {v!r} unknown; known: {known}")
        if k != "object" and isinstance(v, (list, tuple)) and len(v) in ((2,) if k == "place" else (2, 3)) \
                and all(_is_number(x) for x in v):
            return Ref("point", point=tuple(float(x) for x in v))
        shape = "[x, y]" if k == "place" else "[x, y] or [x, y, z]"
        fail(line, f"{where}: expected {'an object name' if k == 'object' else 'a name or ' + shape}, got {v!r}")
    raise AssertionError(f"unknown parameter kind {k!r}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_range(v, line: int, where: str, fail) -> tuple[float, float]:
    """A number (fixed) or ``[low, high]`` -> (low, high)."""
    if _is_number(v):
        return float(v), float(v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(x) for x in v):
        lo, hi = float(v[0]), float(v[1])
        if lo > hi:
            fail(line, f"{where}: range [{lo}, {hi}] has low > high")
        return lo, hi
    fail(line, f"{where}: expected a number or a range [low, high], got {v!r}")


def sample(value, rng: np.random.Generator):
    """A parsed value for one episode: ranges are drawn uniformly (a fixed range costs no draw)."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(x, float) for x in value):
        lo, hi = value
        return lo if lo == hi else float(rng.uniform(lo, hi))
    return value
