"""The import rules of DESIGN.md hold: forge.data never imports the recipe, only forge/track/
imports mlflow, and the library never imports pipelines/ statically."""
from __future__ import annotations

import ast
from pathlib import Path

from forge_testing import REPO


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _files(folder: str):
    return sorted((REPO / folder).rglob("*.py"))


def test_data_layer_does_not_import_the_recipe():
    bad = {str(p.relative_to(REPO)): sorted(m for m in _imports(p) if m.startswith(("forge.recipe", "forge.inputs")))
           for p in _files("forge/data")}
    assert not {k: v for k, v in bad.items() if v}


def test_only_track_imports_mlflow_and_nothing_imports_pipelines():
    users = [str(p.relative_to(REPO)) for p in _files("forge")
             if any(m == "mlflow" or m.startswith("mlflow.") for m in _imports(p))]
    assert users and all(u.startswith("forge/track/") for u in users), users
    assert "forge/track/names.py" not in users  # metric naming is plain text work, testable without MLflow
    assert not [p for p in _files("forge") if any(m.startswith("pipelines") for m in _imports(p))]


def test_the_kinds_table_is_the_recipe_schema():
    from forge.kinds import KINDS
    from forge.recipe import SETTINGS, stage_kinds

    assert stage_kinds() == tuple(KINDS)  # what a recipe's stages[i] accepts is what the table lists
    for name, kind in KINDS.items():
        assert SETTINGS[name] is kind.settings
        assert kind.settings.model_fields["kind"].annotation.__args__ == (name,)
        assert kind.data == kind.settings.reads and kind.evaluates == kind.settings.evaluates
        assert callable(kind.runner())
        assert kind.workload is None or callable(kind.builder().from_stage)
