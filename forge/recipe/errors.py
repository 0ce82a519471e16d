"""Reporting recipe problems: pydantic errors as one line per problem naming
the dotted path, the line, what was given and what was expected; dotted command-line overrides."""
from __future__ import annotations

import copy
import dataclasses
import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from forge.errors import ForgeError
from forge.recipe.yaml import load_value


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(recipe)"


def _clean_loc(loc: tuple) -> tuple:
    """Drop the union tags pydantic puts in error paths; forge's schema writes them as <tag>."""
    return tuple(p for p in loc if not (isinstance(p, str) and p.startswith("<") and p.endswith(">")))


def _members(node: Any) -> list:
    """The concrete types inside a possibly Annotated / Union type."""
    origin = get_origin(node)
    if origin is Annotated:
        return _members(get_args(node)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(node) for m in _members(arg)]
    if isinstance(node, type) and callable(getattr(node, "members", None)):
        return list(node.members())  # a type chosen at validation time (AnyStage: the registered kinds)
    return [node]


def _is_model(node: Any) -> bool:
    """A pydantic model, or a dataclass validated as one (FormatSpec, HygieneConfig)."""
    return isinstance(node, type) and (issubclass(node, BaseModel) or dataclasses.is_dataclass(node))


def _fields(node: type) -> dict:
    if not issubclass(node, BaseModel):
        return {f.name: f for f in dataclasses.fields(node)}
    registered = getattr(node, "registered_fields", None)  # keys registered at run time (EvalBlock's evaluators)
    return {**node.model_fields, **(registered() if registered else {})}


def _allowed_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys a mapping at `loc` accepts, found by walking the schema (for 'unknown key' errors)."""
    nodes: list = [root]
    for part in loc:
        step = []
        for member in (m for n in nodes for m in _members(n)):
            if get_origin(member) in (list, dict):
                step.append(get_args(member)[-1])
            elif _is_model(member) and isinstance(part, str) and part in _fields(member):
                field = _fields(member)[part]
                step.append(field.annotation if hasattr(field, "annotation") else field.type)
        nodes = step
    return sorted({k for n in nodes for m in _members(n) if _is_model(m) for k in _fields(m)})


def _line_of(path: tuple, lines: dict) -> str:
    while path and path not in lines:
        path = path[:-1]
    return f"line {lines[path]}" if path in lines else ""


def format_errors(err: ValidationError, root: type[BaseModel], where: str, lines: dict,
                  overrides: dict[tuple, str]) -> list[str]:
    out: list[str] = []
    for e in err.errors():
        loc = _clean_loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "value_error" and not loc:
            # cross-reference checks name their own paths, one problem per line
            for line in msg.split("\n"):
                place = _line_of(parse_path(line.split(":", 1)[0]), lines)
                out.append(f"{where}{':' + place if place else ''}: {line}")
            continue
        origin = next((f"override {o!r}" for p, o in overrides.items() if loc[: len(p)] == p), None)
        place = origin or _line_of(loc, lines)
        given = ""
        if e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            msg = f"unknown key; expected one of {_allowed_keys(root, loc[:-1])}"
        elif not isinstance(e.get("input"), (dict, list)):
            given = f" (given: {e['input']!r})"
        line = f"{where}{':' + place if place else ''}: {dotted(loc)}: {msg}{given}"
        if line not in out:
            out.append(line)
    return out


# --------------------------------------------------------------------------------- overrides
_PART = re.compile(r"([^.\[\]]+)|\[([^\[\]]*)\]")
MAX_DEPTH = 32  # a recipe's deepest field is a few levels down; a deeper key is a mistake, not a field


def _shown(text: str, limit: int = 60) -> str:
    """`text` quoted for a message, shortened to `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_path(key: str) -> tuple:
    """'stages[1].optim.lr' or 'stages.1.optim.lr' -> ('stages', 1, 'optim', 'lr')."""
    parts: list = []
    for name, index in _PART.findall(key):
        word = name or index  # an index that is no number (stages[x], stages[-1]) is refused where it is used
        parts.append(int(word) if word.isdigit() else word)
    if not parts or "".join(str(p) for p in parts) == "":
        raise ForgeError(f"override {_shown(key)}: empty key")
    if len(parts) > MAX_DEPTH:
        raise ForgeError(f"override {_shown(key)}: {len(parts)} levels deep; recipe fields are at most "
                         f"{MAX_DEPTH} levels deep (e.g. stages[0].optim.lr)")
    return tuple(parts)


def _check_step(item: str, path: tuple, depth: int, node: Any) -> None:
    """That `node`, reached by `path[:depth]`, can be indexed by `path[depth]`; else the one line
    saying why (a list's index is a number from 0 to its length minus one)."""
    part, above = path[depth], dotted(path[:depth])
    if isinstance(node, list):
        if isinstance(part, int) and part < len(node):
            return
        span = f"index 0..{len(node) - 1}" if node else "no index: it is empty"
        raise ForgeError(f"override {item!r}: {above}[{part}]: {above} holds {len(node)} item"
                         f"{'' if len(node) == 1 else 's'} ({span})")
    if isinstance(part, int):
        raise ForgeError(f"override {item!r}: {dotted(path[:depth + 1])}: {above or 'the recipe'} is not a list")
    if not isinstance(node, dict):
        raise ForgeError(f"override {item!r}: {above} is not a mapping")


def apply_overrides(raw: dict, overrides: list[str]) -> tuple[dict, dict[tuple, str]]:
    data = copy.deepcopy(raw)
    origins: dict[tuple, str] = {}
    for item in overrides:
        if "=" not in item:
            raise ForgeError(f"override {item!r}: expected dotted.key=value, e.g. stages[0].optim.lr=1e-4")
        key, value = item.split("=", 1)
        path = parse_path(key.strip())
        try:
            parsed = load_value(value, f"override {item!r}") if value.strip() else ""
        except ForgeError as e:
            raise ForgeError(f"override {item!r}: value is not a valid YAML value: {e}") from None
        node = data
        for depth, part in enumerate(path):
            _check_step(item, path, depth, node)
            if depth == len(path) - 1:
                node[part] = parsed
            else:
                node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        origins[path] = item
    return data, origins
