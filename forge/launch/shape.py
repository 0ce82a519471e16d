"""A request checked against a botocore input shape: required members, unknown members, types,
enums, lengths and ranges (min/max) and string patterns, each problem named by its dotted path."""
from __future__ import annotations

import re

NUMBERS = ("integer", "long", "float", "double")


def shape_problems(value, shape, path: str) -> list[str]:
    """Every way `value` breaks `shape` (a botocore Shape), as 'path: what'."""
    where = path or "(request)"
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{where}: expected a structure, got {type(value).__name__}"]
        out = [f"{_join(path, m)}: required" for m in shape.required_members if m not in value]
        for key, item in value.items():
            if key not in shape.members:
                out.append(f"{_join(path, key)}: not a member of {shape.name}")
            else:
                out += shape_problems(item, shape.members[key], _join(path, key))
        return out
    if kind == "list":
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        out = _bounds(len(value), shape.metadata, where, "items")
        return out + [p for i, v in enumerate(value) for p in shape_problems(v, shape.member, f"{path}[{i}]")]
    if kind == "map":
        if not isinstance(value, dict):
            return [f"{where}: expected a map, got {type(value).__name__}"]
        out = _bounds(len(value), shape.metadata, where, "entries")
        for k, v in value.items():
            out += shape_problems(k, shape.key, f"{path}.<key {k!r}>")
            out += shape_problems(v, shape.value, f"{path}.{k}")
        return out
    if kind == "string":
        if not isinstance(value, str):
            return [f"{where}: expected a string, got {type(value).__name__}"]
        out = _bounds(len(value), shape.metadata, where, "characters")
        enum = getattr(shape, "enum", None) or []
        if enum and value not in enum:
            out.append(f"{where}: {value!r} is not one of {shape.name}'s {len(enum)} values")
        pattern = shape.metadata.get("pattern")
        if pattern and not _matches(pattern, value):
            out.append(f"{where}: {value!r} does not match {pattern}")
        return out
    if kind in NUMBERS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind in ("integer", "long")
                                                                            and not isinstance(value, int)):
            return [f"{where}: expected {kind}, got {type(value).__name__}"]
        return _bounds(value, shape.metadata, where, "")
    if kind == "boolean" and not isinstance(value, bool):
        return [f"{where}: expected a boolean, got {type(value).__name__}"]
    return []


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _bounds(n, meta: dict, where: str, unit: str) -> list[str]:
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and n < lo:
        return [f"{where}: {n} {unit} is below the minimum {lo}".replace("  ", " ")]
    if hi is not None and n > hi:
        return [f"{where}: {n} {unit} is above the maximum {hi}".replace("  ", " ")]
    return []


def _matches(pattern: str, value: str) -> bool:
    """AWS patterns are Java regexes; \\p{L}-style classes are widened to any character here."""
    try:
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return re.fullmatch(re.sub(r"\\p\{\w+\}", r"\\w\\s", pattern), value) is not None
