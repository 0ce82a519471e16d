"""No silent phase: DPO's reference log-probs are counted as they are cached (n/N batches), a
counted phase prints a handful of lines rather than one per item, and a phase of unknown length
says what it is doing before it starts and, while it runs long, that it still is."""
from __future__ import annotations

import json
import re
import time

import pytest

from forge import progress
from forge.inputs import resolve_source
from forge.recipe import DataSource, DpoStage
from forge_testing import run_stage


def _pairs(tmp_path, n=40):
    rows = [{"prompt": f"What colour is thing {i}?", "chosen": f"Thing {i} is red.", "rejected": "I do not know."}
            for i in range(n)]
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"prefs": resolve_source("prefs", DataSource(path=str(tmp_path / "prefs.jsonl"), holdout=0.25,
                                                        chat={"kind": "preference"}), tmp_path)}


@pytest.mark.slow
def test_dpo_reference_caching_is_counted_in_batches(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # count even this quick pass
    stage = DpoStage(name="dpo", kind="dpo", data=["prefs"], max_steps=2, seq_len=64, batch_size=4,
                     optim={"lr": 1e-3}, schedule={"kind": "constant"})
    run_stage(stage, tiny_checkpoint, _pairs(tmp_path), tmp_path / "o")
    err = capsys.readouterr().err
    assert re.search(r"dpo: the reference's log-probs of \d+ pairs, computed once before training", err), err
    train = re.search(r"dpo: reference log-probs, train pairs: (\d+) batches", err)
    assert train, err
    total = int(train.group(1))
    counts = [int(n) for n in re.findall(rf"dpo: reference log-probs, train pairs: batch (\d+)/{total} \(", err)]
    assert counts and counts[-1] == total and counts == sorted(counts) and len(counts) <= 5
    assert re.search(r"dpo: reference log-probs, held pairs: batch (\d+)/\1 \(100%\)", err)

    run_stage(stage, tiny_checkpoint, _pairs(tmp_path), tmp_path / "o")  # cached now: nothing to count
    assert "reference log-probs" not in capsys.readouterr().err


def test_a_counted_phase_prints_a_handful_of_lines_not_one_per_item(capsys, monkeypatch):
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    assert list(progress.counted(range(100), 100, "tokenizing", "file")) == list(range(100))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tokenizing: 100 files"
    assert [re.match(r"tokenizing: file (\d+)/100", line).group(1) for line in lines[1:]] == ["25", "50", "75", "100"]

    monkeypatch.setattr(progress, "QUIET_S", 60.0)  # the default quiet start: quick work says its total only
    list(progress.counted(range(100), 100, "tokenizing", "file"))
    assert capsys.readouterr().err.splitlines() == ["tokenizing: 100 files"]


def test_a_phase_says_what_it_does_first_and_that_it_still_does_at_doubling_intervals(capsys):
    with progress.phase("registering the Novella", heartbeat=0.05):
        time.sleep(0.4)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "registering the Novella..."
    beats = [line for line in lines if line.startswith("registering the Novella: still working (")]
    assert 2 <= len(beats) <= 4, lines  # at 0.05, 0.15, 0.35 s: not one every 0.05 s
    assert len(lines) == 1 + len(beats)  # under 3 s: no "done in"

    with progress.phase("quiet", enabled=False):
        pass
    assert capsys.readouterr().err == ""


def test_a_long_count_says_its_first_eta_soon_then_keeps_its_cadence(monkeypatch):
    import io

    monkeypatch.setattr(progress, "FIRST_LINE_S", 0.0)  # "soon" is 10 s; here: at once
    out = io.StringIO()
    bar = progress.LogProgress(100, "cpt", every=50, seconds=3600, stream=out)
    bar.update(0)
    for _ in range(100):
        bar.update(1)
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == [
        "cpt: step 1/100 (1%)", "cpt: step 51/100 (51%)", "cpt: step 100/100 (100%)"]
