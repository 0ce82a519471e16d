"""Checkpoints load without executing code: torch.load only with weights_only=True, weights only
from safetensors; a planted pickle payload is refused, never run."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from forge.errors import ForgeError
from forge.train.checkpoint import STATE, TRAINING, load_state, split_state
from forge.train.state import TrainState
from forge_testing import REPO


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


class _Data:
    def __init__(self, position=0):
        self.position = position

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _save(state: dict, folder):
    as_json, tensors = split_state(state)
    torch.save(tensors, folder / TRAINING)
    (folder / STATE).write_text(json.dumps(as_json))


def test_training_state_round_trips_with_weights_only(tmp_path):
    opt, sched = _opt()
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    _save(TrainState(opt, sched, _Data(5), step=3).state_dict(), tmp_path)
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    opt2, sched2 = _opt()
    restored = TrainState(opt2, sched2, _Data())
    restored.load_state_dict(load_state(tmp_path))
    assert restored.step == 3 and restored.data.position == 5
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_planted_pickle_payload_is_refused_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    opt, sched = _opt()
    state = TrainState(opt, sched, _Data(), step=1).state_dict()
    state["rng"]["extra"] = _Payload(marker)
    _save(state, tmp_path)
    with pytest.raises(ForgeError, match=rf"{TRAINING}.*(refus|unsafe|not allowed)"):
        load_state(tmp_path)
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
    import ast

    loads = []
    for path in sorted((REPO / "forge").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.startswith("AutoModel")):
                ok = any(k.arg == "use_safetensors" and getattr(k.value, "value", None) is True for k in node.keywords)
                loads.append(path.name)
                assert ok, f"{path.relative_to(REPO)}:{node.lineno}: from_pretrained without use_safetensors=True"
    assert "checkpointer.py" in loads
