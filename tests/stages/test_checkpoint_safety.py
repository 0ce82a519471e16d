"""Checkpoints load without executing code: torch.load only with weights_only=True, weights only
from safetensors; a planted pickle payload is refused, never run."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from forge_testing import REPO
from forge.errors import ForgeError
from forge.train.checkpoint import STATE, TRAINING, restore_training_state, training_state


class _Payload:
    """Pickles to a call that creates a file: what a hostile training_state.pt would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _opt():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_training_state_round_trips_with_weights_only(tmp_path):
    opt, sched = _opt()
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    torch.save(training_state(opt, sched), tmp_path / TRAINING)
    (tmp_path / STATE).write_text(json.dumps({"step": 3}))
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    opt2, sched2 = _opt()
    assert restore_training_state(tmp_path, opt2, sched2) == {"step": 3}
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_planted_pickle_payload_is_refused_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    opt, sched = _opt()
    state = training_state(opt, sched)
    state["extra"] = _Payload(marker)
    torch.save(state, tmp_path / TRAINING)
    (tmp_path / STATE).write_text(json.dumps({"step": 1}))
    with pytest.raises(ForgeError, match=rf"{TRAINING}.*(refus|unsafe|not allowed)"):
        restore_training_state(tmp_path, *_opt())
    assert not marker.exists()


def test_every_torch_load_in_forge_is_weights_only():
    calls = []
    for path in list((REPO / "forge").rglob("*.py")) + list((REPO / "pipelines").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\((.*)", text):
            calls.append((path.name, m.group(1)))
            assert "weights_only=True" in m.group(1), f"{path}: torch.load without weights_only=True"
        assert "pickle.load" not in text, path
        assert "use_safetensors=False" not in text, path
    assert calls, "expected at least the training-state load"


def test_from_pretrained_loads_only_safetensors():
    for rel in ("forge/stages/pretrain.py", "forge/track.py"):
        text = (REPO / rel).read_text()
        for m in re.finditer(r"AutoModelForCausalLM\.from_pretrained\(([^)]*)\)", text):
            assert "use_safetensors=True" in m.group(1), f"{rel}: {m.group(0)}"
