"""Helpers shared by the tests: recipe builders and the path to ../shared/data."""
from __future__ import annotations

import os
from pathlib import Path

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
    """A tracker that keeps each logged metrics row as (step, metrics)."""

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def set_tags(self, tags):
        pass


def run_stage(stage, checkpoint, sources, out, tracker=None, resume=False, outputs=None):
    """Run one stage directly (no pipeline), as the runner would."""
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    inputs = StageInputs(Path(checkpoint), sources, Path(out), tracker or null_tracker(), resume, outputs or {},
                         lambda *_: None)
    return KINDS[stage.kind].runner()(stage, inputs)


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
