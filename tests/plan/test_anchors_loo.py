"""forge plan --anchors --leave-one-out: each anchor is predicted from a refit that did not see it
(a twin anchor published 30% faster is predicted from its twin, not from itself); a figure only the
held-out anchor identifies takes its stated prior, or leaves no prediction; the table says how many
land within +-20% and names the rest; the fitted figures read back the catalog's values."""
import copy
import math

import pytest

from forge.cli import main
from forge.plan import holdout
from forge.plan.anchors import load_anchors
from forge.plan.holdout import Fitter, format_holdouts, leave_one_out, load_figures

ANCHORS = {a["name"]: a for a in load_anchors()}
FIGURES = {f.name: f for f in load_figures()}


def twins(scale: float) -> list[dict]:
    a = copy.deepcopy(ANCHORS["megatron-bridge-llama3-8b-fp8-b200"])
    b = copy.deepcopy(a)
    b["name"] = "twin"
    b["published"]["value"] *= scale
    return [a, b]


def test_the_fitted_figures_point_at_the_catalog_values():
    fitter = Fitter(list(ANCHORS.values()), list(FIGURES.values()))
    assert fitter.base["h100-bf16"] == 0.544 and fitter.base["trn1-collective"] == 0.217
    assert fitter.base["fsdp-elementwise"] == 4.38 and fitter.base["megatron-tp-overlap"] == 0.581
    assert fitter.acts["trn1-bf16"] == {n for n in ANCHORS if n.startswith("nxd-")}
    for f in FIGURES.values():
        assert fitter.acts[f.name], f"{f.name} acts on no anchor"


def test_each_anchor_is_predicted_from_the_other_not_from_itself():
    rows = {h.name: h for h in leave_one_out(twins(1.3), [FIGURES["b200-fp8"]])}
    # the twin publishes 1.3x the throughput: fitted on it, the first anchor's step is predicted 1/1.3 of its own
    assert rows["megatron-bridge-llama3-8b-fp8-b200"].out_of_sample == pytest.approx(1 / 1.3, rel=0.02)
    assert rows["twin"].out_of_sample == pytest.approx(1.3, rel=0.02)
    assert not rows["twin"].within and rows["twin"].error == pytest.approx(0.3, abs=0.03)
    assert rows["twin"].in_sample == pytest.approx(rows["megatron-bridge-llama3-8b-fp8-b200"].in_sample * 1.3)


def test_a_figure_no_other_anchor_identifies_takes_its_prior_or_gives_no_prediction():
    b200, h100 = ANCHORS["megatron-bridge-llama3-8b-fp8-b200"], ANCHORS["megatron-bridge-llama3-8b-fp8-h100"]
    alone = leave_one_out([b200], [FIGURES["b200-fp8"]])[0]
    assert math.isnan(alone.out_of_sample) and "no other anchor identifies b200-fp8" in alone.basis
    rows = {h.name: h for h in leave_one_out([b200, h100], [FIGURES["b200-fp8"], FIGURES["h100-fp8"]])}
    got = rows[b200["name"]]
    assert "b200-fp8 from its prior" in got.basis and math.isfinite(got.out_of_sample)
    fitter = Fitter([b200, h100], [FIGURES["b200-fp8"], FIGURES["h100-fp8"]])
    h100_fp8 = fitter.fit({"h100-fp8"}, {h100["name"]})["h100-fp8"]
    assert got.refit == {"b200-fp8": pytest.approx(h100_fp8)} and h100_fp8 != FIGURES["h100-fp8"].bounds[0]
    table = format_holdouts([alone, got])
    assert "n/a" in table and "Within +-20% out of sample: " in table


def test_the_command_reports_misses_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(holdout, "load_anchors", lambda: twins(1.3))
    monkeypatch.setattr(holdout, "load_figures", lambda: [FIGURES["b200-fp8"]])
    assert main(["plan", "--anchors", "--leave-one-out"]) == 1
    out = capsys.readouterr().out
    assert "Within +-20% out of sample: 0/2; not: megatron-bridge-llama3-8b-fp8-b200, twin" in out
    assert "b200-fp8 0.447 ->" in out  # the full refit beside the catalog's figure
    monkeypatch.setattr(holdout, "load_anchors", lambda: twins(1.05))
    assert main(["plan", "--anchors", "--leave-one-out"]) == 0
    assert "2/2; all are" in capsys.readouterr().out


def test_leave_one_out_needs_anchors(capsys):
    assert main(["plan", "--leave-one-out"]) == 2
    assert "--leave-one-out checks the anchors" in capsys.readouterr().err
