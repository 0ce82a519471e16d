"""A full disk while safetensors writes a training checkpoint's weights (safetensors reports it as
its own SafetensorError, not an OSError): one line that says how to resume, the earlier checkpoint
intact, no half-written folder, and `--resume` finishes the run."""
from __future__ import annotations

import errno
import json

import pytest
import transformers.modeling_utils
from safetensors import SafetensorError

from forge import cli
from forge.train.checkpoint import latest_checkpoint
from forge_testing import base_recipe, pretrain_stage, write_recipe


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["safetensors", "oserror"])
def test_disk_full_while_writing_checkpoint_weights(failure, tmp_path, monkeypatch, capsys):
    recipe = base_recipe(tmp_path, stages=[pretrain_stage(max_steps=6, checkpoint={"every": 2})],
                         tracking={"register_model": False})
    path = write_recipe(tmp_path / "r.yaml", recipe)
    real = transformers.modeling_utils.safe_save_file

    def full(tensors, filename, *args, **kwargs):
        if "step-0000004" in str(filename):  # the second checkpoint
            if failure == "oserror":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                  'message: "No space left on device" })')
        return real(tensors, filename, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(transformers.modeling_utils, "safe_save_file", full)
        assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("forge: error:"))
    assert "cannot write checkpoint" in line and "No space left on device" in line and "--resume" in line
    assert "Traceback" not in err and "unexpected error" not in err
    checkpoints = tmp_path / "out" / "stages" / "cpt" / "checkpoints"
    assert latest_checkpoint(checkpoints) == checkpoints / "step-0000002"  # intact
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-0000002"]  # no .partial, no .old
    assert cli.main(["run", str(path), "--resume"]) == 0
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert lineage["stages"][0]["steps"] == 6
