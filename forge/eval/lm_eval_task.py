"""Standard benchmarks through lm-eval (optional: `pip install 'forge[eval]'`), run on the model
already in memory. A task is an lm-eval task name or a path to a task YAML file (a local JSONL
task works offline: `dataset_path: json` with `dataset_kwargs: {data_files: ...}`). The data sets
lm-eval loads are cached where the user's HF_DATASETS_CACHE or HF_HOME says, else in
FORGE_HOME/datasets: never in the home folder's ~/.cache."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import yaml

from forge.errors import ForgeError


def _task_names(tasks: list[str], root: Path | None) -> tuple[list[str], list[str]]:
    """(task names, folders to include): a task given as a YAML file is named by its `task:`."""
    names, include = [], []
    for t in tasks:
        path = Path(t) if root is None or Path(t).is_absolute() else root / t
        if t.endswith((".yaml", ".yml")):
            if not path.is_file():
                raise ForgeError(f"eval.lm_eval.tasks: no task file {path}")
            spec = yaml.safe_load(path.read_text()) or {}
            if not isinstance(spec, dict) or "task" not in spec:
                raise ForgeError(f"eval.lm_eval.tasks: {path} has no 'task:' name")
            names.append(str(spec["task"]))
            include.append(str(path.parent.resolve()))
        else:
            names.append(t)
    return names, list(dict.fromkeys(include))


def datasets_cache() -> Path:
    """Where lm-eval's data sets go: HF_DATASETS_CACHE or HF_HOME/datasets, else FORGE_HOME/datasets."""
    from forge.catalog.hub import hf_cache

    return hf_cache("HF_DATASETS_CACHE", "datasets")


@contextlib.contextmanager
def _datasets_cached_in(folder: Path) -> Iterator[None]:
    """`datasets` reads its cache root from its config at each load: point it at `folder` meanwhile."""
    import datasets.config

    before = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = folder
    try:
        yield
    finally:
        datasets.config.HF_DATASETS_CACHE = before


def run_lm_eval(model, tokenizer, settings, root: Path | None, device, batch_size: int = 8) -> dict[str, float]:
    """`lm_eval.<task>.<metric>` for each task (standard errors left out)."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ForgeError("eval.lm_eval needs lm-eval: pip install 'forge[eval]'") from None
    names, include = _task_names(settings.tasks, root)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(device))
    manager = TaskManager(include_path=include or None)
    with _datasets_cached_in(datasets_cache()):
        out = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=settings.limit,
                                      num_fewshot=settings.num_fewshot, log_samples=False)
    metrics = {}
    for task, row in (out or {}).get("results", {}).items():
        for key, value in row.items():
            metric = key.split(",")[0]
            if metric.endswith("_stderr") or metric == "alias" or not isinstance(value, (int, float)):
                continue
            metrics[f"lm_eval.{task}.{metric}"] = float(value)
    return metrics
