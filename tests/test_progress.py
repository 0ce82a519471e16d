"""Progress without a terminal: plain lines every N steps (or M seconds), with loss, tokens/s, ETA."""
from __future__ import annotations

import io

from forge import progress as progress_mod
from forge.progress import LogProgress


def test_plain_lines_every_n_steps_with_step_loss_rate_and_eta():
    out = io.StringIO()
    bar = LogProgress(20, "general", every=5, seconds=3600, stream=out)
    bar.update(0)
    for step in range(1, 21):
        bar.set_postfix(loss=f"{5 - step / 10:.3f}", tok_s="1,234")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"general: step {n}/20 (" + f"{n * 5}%)" for n in (5, 10, 15, 20)]
    assert lines[0].startswith("general: step 5/20 (25%), loss 4.500, tok/s 1,234, ETA 0:00:")
    assert "ETA" not in lines[-1]  # done


def test_time_based_lines_and_resume_starting_point():
    out = io.StringIO()
    bar = LogProgress(100, "cpt", every=1000, seconds=0.0, stream=out)
    bar.update(40)  # resumed at step 40: the starting point, not progress
    assert out.getvalue() == ""
    bar.update(1)
    assert out.getvalue().startswith("cpt: step 41/100 (41%)")


def test_not_a_terminal_gives_plain_lines_and_disabled_is_silent(monkeypatch, capsys):
    monkeypatch.setattr(progress_mod, "is_terminal", lambda: False)
    assert isinstance(progress_mod.progress(10, "x"), LogProgress)
    silent = progress_mod.progress(10, "x", enabled=False)
    silent.update(0), silent.update(10), silent.close()
    assert capsys.readouterr().err == ""
