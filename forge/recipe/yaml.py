"""Reading a recipe file safely: UTF-8 checked with the byte and line named, YAML composed once
with PyYAML's safe loader, then refused before construction when it repeats a key in one mapping,
nests too deep, or uses aliases that expand past a bound (a "billion laughs" bomb would otherwise
exhaust memory in validation, which walks the expanded tree). Returns the data and a line index.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from forge.errors import ForgeError

MAX_NODES = 100_000  # a real recipe has a few hundred nodes; aliases may not expand past this
MAX_DEPTH = 64       # the schema nests about six deep
MAX_BYTES = 1 << 20  # a recipe is configuration; a bigger file is a mistake (and slow to scan)


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ForgeError(f"{where}:line {line}: not UTF-8 text (byte {e.start} of the file, column {col}: "
                         f"{e.reason}); save the recipe as UTF-8") from None


def _check(root: yaml.Node, where: str) -> None:
    """Duplicate keys, depth and the expanded size, visiting each distinct node once (aliases
    share node objects, so the expanded size is computed bottom-up with a memo, not by walking)."""
    size: dict[int, int] = {}

    def visit(node: yaml.Node, depth: int) -> int:
        known = size.get(id(node))
        if known is not None:
            return known
        if depth > MAX_DEPTH:
            raise ForgeError(f"{where}:line {node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
        size[id(node)] = 1  # a node that contains itself (a recursive alias) counts once
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    first = seen.get((key.tag, key.value))
                    if first is not None:
                        raise ForgeError(f"{where}:line {key.start_mark.line + 1}: duplicate key {key.value!r} "
                                         f"(first at line {first}); give each key once")
                    seen[(key.tag, key.value)] = key.start_mark.line + 1
                total += visit(key, depth + 1) + visit(value, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += visit(item, depth + 1)
        if total > MAX_NODES:
            raise ForgeError(f"{where}:line {node.start_mark.line + 1}: YAML aliases expand this document past "
                             f"{MAX_NODES:,} values (an alias bomb?); write the recipe without nested aliases")
        size[id(node)] = total
        return total

    visit(root, 0)


def line_index(root: yaml.Node | None) -> dict[tuple, int]:
    """Map each path (tuple of keys/indices) to its 1-based line; an alias is not entered (its
    paths fall back to the line of the key that holds it), so this stays linear in the file."""
    lines: dict[tuple, int] = {}
    entered: set[int] = set()

    def walk(node: yaml.Node, path: tuple) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in entered:
            return
        entered.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[path + (key.value,)] = key.start_mark.line + 1
                    walk(value, path + (key.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    if root is not None:
        walk(root, ())
    return lines


def _compose(text: str, where: str) -> tuple[object, dict[tuple, int]]:
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the pure-Python one: deep nesting ends in RecursionError, not a crash
        root = loader.get_single_node()
        if root is None:
            return None, {}
        _check(root, where)
        return loader.construct_document(root), line_index(root)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f":line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ForgeError(f"{where}{line}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ForgeError(f"{where}: nested too deeply to read (more than {MAX_DEPTH} levels)") from None
    except TypeError as e:  # e.g. a mapping used as a key: unhashable once constructed
        raise ForgeError(f"{where}: not a valid recipe: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_value(text: str, where: str) -> object:
    """One YAML value (a command-line override), with the same checks as a recipe file."""
    return _compose(text, where)[0]


def read_recipe_yaml(path: Path) -> tuple[object, dict[tuple, int]]:
    """The recipe file's data and its line index; ForgeError naming the file for anything wrong."""
    where = str(path)
    try:
        if Path(path).stat().st_size > MAX_BYTES:
            raise ForgeError(f"{where}: {Path(path).stat().st_size:,} bytes is too big for a recipe "
                             f"(at most {MAX_BYTES:,}); data belongs in data files the recipe names")
        data = Path(path).read_bytes()
    except OSError as e:
        raise ForgeError(f"{where}: cannot read the recipe: {e.strerror or e}") from None
    return _compose(_decode(data, where), where)
