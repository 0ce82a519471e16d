"""Recipes on the catalog: `base: catalog://FAMILY@PHASE` validates, runs and lands in the lineage
and MLflow; its context is the phase's; a curated set replays at exact shares; an unbuilt offline
family is built on the first `forge run` (never by `forge validate`); and the starting-point advice
appears in `forge validate` and `forge plan`."""
from __future__ import annotations

import json
import sys
import types

import pytest

from catalog_testing import write_tiny_foundation
from forge import catalog
from forge.cli import main
from forge_testing import pretrain_stage, write_recipe


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    return tmp_path / "forge-home"


def recipe(tmp_path, base, stages=None, data=None, **kw) -> str:
    r = {"name": "cat", "base": base,
         "data": data or {"kb": {"generate": {"kind": "facts", "documents": 200, "seed": 1}, "proprietary": True}},
         "stages": stages or [pretrain_stage(mixture={"kb": 1.0}, max_steps=3)],
         "output": str(tmp_path / "out"), **kw}
    return str(write_recipe(tmp_path / "r.yaml", r))


@pytest.mark.slow
def test_a_catalog_base_validates_runs_and_is_recorded(tiny_checkpoint, tmp_path, capsys):
    assert main(["catalog", "add", "acme@mid-trained", str(tiny_checkpoint)]) == 0
    path = recipe(tmp_path, "catalog://acme@mid-trained")
    assert main(["validate", path]) == 0
    assert ": ok: cat" in capsys.readouterr().out
    assert main(["run", path]) == 0
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    assert lineage["base"]["spec"] == "catalog://acme@mid-trained"
    assert lineage["base"]["catalog"] == {"ref": "catalog://acme@mid-trained", "family": "acme",
                                          "phase": "mid-trained", "point": "mid-trained",
                                          "location": str(tiny_checkpoint.resolve()), "revision": ""}
    assert lineage["base"]["checkpoint"] == str(tiny_checkpoint.resolve())
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run = mlflow.search_runs(experiment_names=["cat"], filter_string="tags.`forge.pipeline` = 'novella'",
                             output_format="list")[0]
    assert run.data.params["base"] == "catalog://acme@mid-trained"
    assert run.data.params["base.point"] == "mid-trained" and run.data.params["base.family"] == "acme"


def test_the_context_check_uses_the_phases_context(tiny_checkpoint, tmp_path, capsys):
    catalog.add("acme@mid-trained", tiny_checkpoint)
    path = recipe(tmp_path, "catalog://acme@mid-trained", [pretrain_stage(mixture={"kb": 1.0}, seq_len=256)])
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert "stages[0].seq_len: 256 exceeds the model's context (128, from catalog://acme@mid-trained)" in err


def test_an_unknown_phase_in_a_recipe_names_the_field_and_line(tiny_checkpoint, tmp_path, capsys):
    catalog.add("acme@mid-trained", tiny_checkpoint)
    assert main(["validate", recipe(tmp_path, "catalog://acme@annealed")]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:line 2: base: family 'acme' has no phase 'annealed'; its phases: mid-trained (mid-trained)" in err


@pytest.mark.slow
def test_curated_replay_trains_at_exact_shares(tiny_checkpoint, tmp_path, home):
    write_tiny_foundation(home, tiny_checkpoint, holdout=0.1)
    data = {"kb": {"generate": {"kind": "facts", "documents": 300, "seed": 1}, "proprietary": True},
            "general": {"source": "curated://forge-tiny/general"}}
    stage = pretrain_stage(mixture={"customer": {"kb": 70}, "curated": {"general": 30}}, max_steps=8)
    assert main(["run", recipe(tmp_path, "catalog://forge-tiny@mid-trained", [stage], data)]) == 0
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    tokens = lineage["stages"][0]["tokens_by_source"]
    total = sum(tokens.values())
    assert total == 8 * 4 * 32
    # the deficit rule keeps each share within one piece (at most a block) of its weight
    assert abs(tokens["general"] / total - 0.30) <= 32 / total, tokens
    assert lineage["data"]["general"]["location"].endswith("foundations/forge-tiny/curated/general.jsonl")
    assert lineage["base"]["catalog"]["point"] == "mid-trained"
    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    src = resolve_source("general", DataSource(source="curated://forge-tiny/general"), tmp_path)
    assert src.holdout == 0.1 and not src.proprietary  # the family's holdout fraction


@pytest.mark.slow
def test_an_unbuilt_family_is_built_on_the_first_run_never_by_validate(tiny_checkpoint, tmp_path, home,
                                                                      monkeypatch, capsys):
    built = []

    def build(where, log):
        built.append(where)
        log("fake foundation build")
        write_tiny_foundation(home, tiny_checkpoint)

    monkeypatch.setitem(sys.modules, "pipelines.foundation", types.SimpleNamespace(build=build))
    path = recipe(tmp_path, "catalog://forge-tiny@mid-trained")
    assert main(["validate", path]) == 0
    out = capsys.readouterr()
    assert not built and "not built yet" in out.err and "first `forge run`" in out.err
    assert main(["run", path]) == 0
    out = capsys.readouterr()
    assert built == [home / "foundations" / "forge-tiny"]
    assert "building the forge-tiny foundation once" in out.err and str(home / "foundations" / "forge-tiny") in out.err
    assert main(["run", path, "--overwrite"]) == 0
    assert len(built) == 1  # cached: later runs reuse it


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("forge: warning:")]


def test_advice_on_the_starting_point_in_validate_and_plan(tiny_checkpoint, tmp_path, home, capsys):
    catalog.add("acme@mid-trained", tiny_checkpoint)
    catalog.add("acme@post-trained", tiny_checkpoint)
    small = recipe(tmp_path, "catalog://acme@mid-trained")
    for command in (["validate", small], ["plan", small]):
        main(command)
        found = _warnings(capsys)
        assert any("starts from a mid-trained checkpoint" in w and "post-trained" in w for w in found), found
    # a post-trained base continued-pretrained without its instruction data
    post = recipe(tmp_path, "catalog://acme@post-trained")
    assert main(["validate", post]) == 0
    found = _warnings(capsys)
    assert any("continued-pretrains a post-trained base" in w and "stages[0]" in w for w in found), found
    assert not any("starts from a" in w for w in found)  # few proprietary tokens: post-trained fits
    # plenty of proprietary tokens from a post-trained base: start earlier
    big = recipe(tmp_path, "catalog://acme@post-trained", [pretrain_stage(mixture={"kb": 1.0}, max_steps=None,
                                                                          max_tokens=10**9)])
    main(["validate", big])
    assert any("pre- or mid-trained" in w for w in _warnings(capsys))


def test_replaying_the_instruction_set_silences_the_post_trained_advice(tiny_checkpoint, tmp_path, home, capsys):
    write_tiny_foundation(home, tiny_checkpoint)
    data = {"kb": {"generate": {"kind": "facts", "documents": 200, "seed": 1}, "proprietary": True},
            "instructions": {"source": "curated://forge-tiny/instructions"}}
    stage = pretrain_stage(mixture={"customer": {"kb": 80}, "curated": {"instructions": 20}})
    assert main(["validate", recipe(tmp_path, "catalog://forge-tiny@post-trained", [stage], data)]) == 0
    assert not any("post-trained base" in w for w in _warnings(capsys))


def test_sources_drawn_from_one_curated_set_hold_out_the_same_records(tiny_checkpoint, tmp_path, home):
    """A recipe may read one curated set under two names (the domain stage's replay and a smaller
    slice for SFT): both hold out exactly the records the family held out, so neither trains on
    what the other's perplexity check reads."""
    from forge.data.mixing import in_holdout
    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    write_tiny_foundation(home, tiny_checkpoint)
    big = resolve_source("general", DataSource(source="curated://forge-tiny/general"), tmp_path)
    small = resolve_source("replay", DataSource(source="curated://forge-tiny/general", max_records=60), tmp_path)
    assert small.holdout_key == big.holdout_key == "general"

    def held(src):
        return [text for n, text in src.records() if in_holdout(src.holdout_key, n, src.holdout)]

    assert held(small) and held(small) == held(big)[:len(held(small))]
