"""Helpers shared by the tests: recipe builders and the path to ../shared/data."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FORGE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_path(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test saying why."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/data is not beside this checkout; set FORGE_SHARED_DATA)")
    return path


def tiny_scratch(tokenizer_sources=("general",), **kw) -> dict:
    cfg = {"hidden_size": 32, "layers": 2, "heads": 4, "kv_heads": 2, "vocab_size": 384,
           "max_position": 128, "tokenizer_sources": list(tokenizer_sources)}
    cfg.update(kw)
    return {"scratch": cfg}


def pretrain_stage(name="cpt", mixture=None, **kw) -> dict:
    stage = {"name": name, "kind": "pretrain", "mixture": mixture or {"general": 1.0}, "max_steps": 4,
             "seq_len": 32, "batch_size": 4, "optim": {"lr": 3e-3}, "schedule": {"kind": "constant"},
             "eval": {"max_blocks": 8}}
    stage.update(kw)
    return stage


class Recorder:
    """A tracker that keeps what it is given, satisfying forge.track.Tracker (checked by mypy in
    tests/test_layering.py): each metrics row as (step, metrics) in `rows`, each table in `tables`,
    single figures in `summaries`, and every call, in order, as (method, arguments) in `calls`."""

    def __init__(self) -> None:
        self.rows: list[tuple[int | None, dict[str, float]]] = []
        self.tables: list[tuple[str, dict[str, list[Any]]]] = []
        self.summaries: list[tuple[str, dict[str, Any], str | None]] = []
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._runs = 0

    def _note(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))

    # what a stage calls (forge.track.StageTracker)
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._note("set_tags", dict(tags))

    def log_params(self, params: dict[str, Any]) -> None:
        self._note("log_params", dict(params))

    def log_summary(self, section: str, values: dict[str, Any], run_id: str | None = None) -> None:
        self.summaries.append((section, dict(values), run_id))

    def log_table(self, table: dict[str, list[Any]], artifact_file: str) -> None:
        self.tables.append((artifact_file, table))

    # what the pipeline, the runner and the evaluation call (forge.track.Tracker)
    @contextlib.contextmanager
    def run(self, name: str, tags: dict[str, str] | None = None, run_id: str | None = None) -> Iterator[str | None]:
        self._runs += 1
        self._note("run", name, dict(tags or {}), run_id)
        yield run_id or f"run{self._runs}"

    def run_status(self, run_id: str) -> str | None:
        return None

    def end_stale(self, run_id: str, message: str) -> None:
        self._note("end_stale", run_id, message)

    def describe(self, markdown: str) -> None:
        self._note("describe", markdown)

    def log_dataset(self, name: str, path: str, digest: str, context: str = "train",
                    tags: dict[str, str] | None = None) -> None:
        self._note("log_dataset", name, path, digest, context, tags)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._note("log_text", text, artifact_file)

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        self._note("log_dict", data, artifact_file)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        self._note("log_artifact", str(path), artifact_path)

    def log_bytes(self, data: bytes, artifact_file: str) -> None:
        self._note("log_bytes", len(data), artifact_file)

    def register_model(self, model_dir: str | os.PathLike[str], name: str, alias: str,
                       tags: dict[str, str]) -> int | None:
        self._note("register_model", str(model_dir), name, alias, dict(tags))
        return None

    def describe_model(self, name: str, version: int, markdown: str, model_markdown: str | None = None) -> None:
        self._note("describe_model", name, version, markdown, model_markdown)

    def alias_version(self, name: str, alias: str) -> tuple[int, dict[str, str]] | None:
        return None

    def set_alias(self, name: str, alias: str, version: int) -> None:
        self._note("set_alias", name, alias, version)

    def set_version_tags(self, name: str, version: int, tags: dict[str, str]) -> None:
        self._note("set_version_tags", name, version, dict(tags))


def run_stage(stage, checkpoint, sources, out, tracker=None, resume=False, outputs=None):
    """Run one stage directly (no pipeline), as the runner would."""
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    inputs = StageInputs(Path(checkpoint), sources, Path(out), tracker or null_tracker(), resume, outputs or {},
                         lambda *_: None)
    return KINDS[stage.kind].runner()(stage, inputs)


def refusal(err: str) -> str:
    """A command's refusal as it printed it: the last stderr line, after at most the progress lines
    of what it had begun (its first line, the phases it had started); those hold no error."""
    lines = err.strip().splitlines()
    assert lines and not any(line.startswith(("forge: error", "forge: unexpected")) for line in lines[:-1]), err
    return lines[-1] + "\n"


def write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def base_recipe(tmp: Path, **kw) -> dict:
    """A complete, valid recipe on generated data and a scratch base, writing under `tmp`."""
    recipe = {
        "name": "tiny",
        "base": tiny_scratch(),
        "data": {"general": {"generate": {"kind": "stories", "documents": 300, "seed": 0}},
                 "domain": {"generate": {"kind": "facts", "documents": 300, "seed": 1}, "proprietary": True}},
        "stages": [pretrain_stage()],
        "output": str(tmp / "out"),
    }
    recipe.update(kw)
    return recipe


class Crash(RuntimeError):
    """A simulated crash mid-stage."""


def crash_after(monkeypatch, calls: int):
    """Make the data loader fail on its `calls`+1-th batch (a crash mid-stage)."""
    from forge.data.mixing import MixedBlocks

    real, seen = MixedBlocks.next_batch, {"n": 0}

    def flaky(self, *args, **kwargs):
        seen["n"] += 1
        if seen["n"] > calls:
            raise Crash("simulated crash")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MixedBlocks, "next_batch", flaky)


def memorise(model, tok, texts, steps=120):
    """Train on the texts (each after and before EOS, as documents are packed), one padded batch
    per step, until they are memorised."""
    import torch

    torch.manual_seed(0)
    seqs = [[tok.eos_token_id] + tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, seqs))
    x = torch.tensor([s + [tok.eos_token_id] * (width - len(s)) for s in seqs])
    labels = torch.tensor([s + [-100] * (width - len(s)) for s in seqs])
    mask = (labels != -100).long()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    model.train()
    for _ in range(steps):
        model(input_ids=x, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


def _hold_folder(out, fingerprint, ready, done):
    from forge.rundir import RunFolder

    with RunFolder.open(out, fingerprint):
        ready.set()
        done.wait(60)


@contextlib.contextmanager
def folder_held_by_another_process(out, fingerprint=None):
    """A forked process holding the run folder `out` (its lock) until the block ends; yields it (its pid)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_folder, args=(out, fingerprint or {"name": "tiny"}, ready, done))
    proc.start()
    try:
        assert ready.wait(30)
        yield proc
    finally:
        done.set()
        proc.join(30)
