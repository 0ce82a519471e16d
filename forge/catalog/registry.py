"""The shape of FORGE_HOME/catalog.yaml, checked once when it is read: `forge catalog add` writes
it, but a person or a tool may edit it, so every family, phase and field is checked before the
catalog uses it, and the first wrong one is named by its dotted key (families.acme.phases.v1.path).
Family and phase names are strict slugs, so a name cannot carry a newline or an '@' into a
`catalog://FAMILY@PHASE` reference that could then never be written."""
from __future__ import annotations

import re
from typing import Any

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")   # a family or phase name, matched whole (fullmatch)
NAME_RULE = "lowercase letters, digits, '.', '_', '-', starting with a letter or digit, at most 64"

# field -> (the types it may have, what to call them): what the catalog reads of a registered phase
_PHASE_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "path": ((str,), "a folder path"), "hub": ((str,), "a Hub repository"), "revision": ((str,), "a revision"),
    "architecture": ((str,), "a string"), "tokenizer": ((str,), "a string"), "licence": ((str,), "a string"),
    "cite": ((str,), "a string"), "planner": ((str,), "a plan preset name"),
    "parameters": ((int,), "a whole number"), "context": ((int,), "a whole number"),
    "curated": ((list,), "a list of curated set names"), "registered_from": ((dict,), "a mapping"),
}
_FAMILY_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "description": ((str,), "a string"), "licence": ((str,), "a string"), "tokenizer": ((str,), "a string"),
    "phases": ((dict,), "a mapping of phase names"), "curated": ((dict,), "a mapping of curated set names"),
    "tokenizer_from": ((dict,), "a mapping"),
}


def valid_name(name: Any) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


def _fields(where: str, raw: dict[str, Any], fields: dict[str, tuple[tuple[type, ...], str]]) -> str | None:
    for key, (types, what) in fields.items():
        value = raw.get(key)
        # bool is an int in Python; a count of True parameters is still wrong
        if key in raw and (not isinstance(value, types) or isinstance(value, bool)):
            return f"{where}.{key}: expected {what}, got {_kind(value)}"
    return None


def _phase_problem(where: str, raw: Any, points: tuple[str, ...]) -> str | None:
    if not isinstance(raw, dict):
        return f"{where}: expected a mapping (point, path, ...), got {_kind(raw)}"
    if raw.get("point") not in points:
        return f"{where}.point: {raw.get('point')!r}; expected one of {', '.join(points)}"
    wrong = _fields(where, raw, _PHASE_FIELDS)
    if wrong:
        return wrong
    if not raw.get("path") and not raw.get("hub"):
        return f"{where}: no path (the registered checkpoint folder)"
    if not all(isinstance(c, str) for c in raw.get("curated") or []):
        return f"{where}.curated: expected a list of curated set names"
    return None


def problem(families: Any, points: tuple[str, ...]) -> str | None:
    """The first thing wrong with catalog.yaml's `families:` mapping, by its dotted key, or None."""
    if not isinstance(families, dict):
        return f"families: expected a mapping of registered families, got {_kind(families)}"
    for name, raw in families.items():
        if not valid_name(name):
            return f"families: {name!r} is not a family name ({NAME_RULE})"
        where = f"families.{name}"
        if not isinstance(raw, dict):
            return f"{where}: expected a mapping (phases: ...), got {_kind(raw)}"
        wrong = _fields(where, raw, _FAMILY_FIELDS)
        if wrong:
            return wrong
        for phase, entry in (raw.get("phases") or {}).items():
            if not valid_name(phase):
                return f"{where}.phases: {phase!r} is not a phase name ({NAME_RULE})"
            wrong = _phase_problem(f"{where}.phases.{phase}", entry, points)
            if wrong:
                return wrong
        for name_, entry in (raw.get("curated") or {}).items():
            if not valid_name(name_) or not isinstance(entry, dict):
                return f"{where}.curated.{name_}: expected a curated set name and a mapping (purpose, path, ...)"
    return None
