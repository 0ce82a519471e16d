"""Load a Python function a recipe names as `path/to/file.py:function` (the file relative to the
recipe) or `package.module:function`: the one loader behind reward sources (forge.lm.rewards)
and custom evaluators (forge.eval.evaluators). Errors name the recipe field and the spec."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from forge.errors import ForgeError


def split_spec(spec: str, what: str, modules: bool = True) -> tuple[str, str]:
    """(`file.py` or `module`, `function`), or a ForgeError saying the form expected."""
    target, sep, name = spec.rpartition(":")
    forms = "'file.py:function' or 'module:function'" if modules else "'file.py:function'"
    if not sep or not target or not name.isidentifier() or (not modules and not target.endswith(".py")):
        raise ForgeError(f"{what} {spec!r}: expected {forms}")
    return target, name


def load_function(spec: str, root: Path | None = None, what: str = "function", modules: bool = True) -> Callable:
    """The callable `spec` names. A `.py` target is a file (relative to `root` unless absolute),
    imported under its own module name so two files with one stem do not collide; anything else is
    an importable module (when `modules`)."""
    target, name = split_spec(spec, what, modules)
    if target.endswith(".py"):
        path = Path(target) if root is None or Path(target).is_absolute() else Path(root) / target
        if not path.is_file():
            raise ForgeError(f"{what} {spec!r}: no file {path}")
        module_name = f"forge_user_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
        mod_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[module_name] = module  # dataclasses and pickling inside the file look themselves up here
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(module_name, None)
            raise ForgeError(f"{what} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ForgeError(f"{what} {spec!r}: cannot import module {target!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ForgeError(f"{what} {spec!r}: {target} has no function {name!r}")
    return fn


def describe_code(spec: str) -> str:
    """What a Python reward or evaluator spec runs, for `forge validate`'s listing, loading nothing: a
    file by its resolved path, or a module with where its package is installed."""
    target, _, function = spec.rpartition(":")
    if target.endswith(".py"):
        return f"{Path(target).resolve()}:{function} (Python file)"
    top = target.split(".")[0]
    try:  # the top-level package's location only: finding a submodule would run its parents' code
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    origin = found.origin if found is not None and found.origin else "not installed"
    return f"{spec} (module {target}, package {top} at {origin})"
