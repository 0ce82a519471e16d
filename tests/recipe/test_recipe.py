"""Recipe loading: every bad recipe is refused before work starts, naming the field and the line."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from forge.errors import ForgeError
from forge.recipe import load_recipe, resolved_yaml
from forge.recipe.errors import parse_path
from forge_testing import REPO, base_recipe, pretrain_stage, write_recipe


def _error(path: Path, overrides=None) -> str:
    with pytest.raises(ForgeError) as info:
        load_recipe(path, overrides)
    return str(info.value)


def test_valid_recipe_loads_with_defaults(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path)))
    stage = recipe.stages[0]
    assert stage.optim.lr == 3e-3 and stage.optim.betas == (0.9, 0.95)
    assert stage.total_steps() == 4
    assert recipe.tracking_uri == f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    assert "max_steps: 4" in resolved_yaml(recipe)


def _with_stage(tmp, **kw):
    return base_recipe(tmp, stages=[pretrain_stage(**kw)])


BAD = {
    "unknown top-level key": (lambda t: base_recipe(t, epochs=3), "epochs: unknown key"),
    "unknown nested key": (lambda t: _with_stage(t, optim={"learning_rate": 1e-3}),
                           "stages[0].optim.learning_rate: unknown key"),
    "wrong type": (lambda t: _with_stage(t, seq_len="long"), "stages[0].seq_len"),
    "negative lr": (lambda t: _with_stage(t, optim={"lr": -1.0}), "stages[0].optim.lr"),
    "zero batch": (lambda t: _with_stage(t, batch_size=0), "stages[0].batch_size"),
    "bad precision": (lambda t: _with_stage(t, precision="fp64"), "stages[0].precision"),
    "unknown stage kind": (lambda t: base_recipe(t, stages=[{"kind": "distill", "name": "x"}]), "stages[0]"),
    "missing name": (lambda t: {k: v for k, v in base_recipe(t).items() if k != "name"}, "name: required"),
    "both budgets": (lambda t: _with_stage(t, max_tokens=1000), "give exactly one of 'max_tokens' or 'max_steps'"),
    "unknown mixture source": (lambda t: _with_stage(t, mixture={"nope": 1.0}), "stages[0].mixture.nope: unknown data source"),
    "zero weight": (lambda t: _with_stage(t, mixture={"general": 0.0}), "mixture weights must be > 0"),
    "missing data file": (lambda t: base_recipe(t, data={"general": {"path": str(t / "absent.jsonl")}}),
                          "absent.jsonl' does not exist"),
    "path and generate": (lambda t: base_recipe(t, data={"general": {"path": "a",
                                                                     "generate": {"kind": "stories", "documents": 3}}}),
                          "data.general"),
    "base not a checkpoint": (lambda t: base_recipe(t, base=str(t)), "base:"),
    "seq_len beyond context": (lambda t: _with_stage(t, seq_len=4096),
                               "stages[0].seq_len: 4096 exceeds the model's context (128, from base.scratch.max_position)"),
    "midtrain context shorter than seq_len": (
        lambda t: _with_stage(t, kind="midtrain", seq_len=512, context={"rope_theta": 5e4, "max_position": 256}),
        "stages[0].seq_len: 512 exceeds context.max_position (256)"),
    "context block without rope": (lambda t: _with_stage(t, kind="midtrain", context={}),
                                   "give rope_theta and/or rope_scaling"),
    "context on a pretrain stage": (lambda t: _with_stage(t, context={"rope_theta": 5e4}), "stages[0].context"),
    "unknown rope type": (lambda t: _with_stage(t, kind="midtrain", seq_len=256,
                                                context={"rope_scaling": {"type": "ntk", "factor": 2}}),
                          "stages[0].context.rope_scaling.type"),
    "soup of a later stage": (lambda t: base_recipe(t, stages=[
        {"name": "s", "kind": "soup", "ingredients": ["a", "b"]}, pretrain_stage("a"), pretrain_stage("b")]),
        "stages[0].ingredients[0]: stage 'a' does not run before 's'"),
    "soup of a missing folder": (lambda t: base_recipe(t, stages=[
        pretrain_stage("a"), {"name": "s", "kind": "soup", "ingredients": ["a", "./nowhere/ckpt"]}]),
        "is neither an earlier stage nor a checkpoint folder"),
    "soup weights count": (lambda t: base_recipe(t, stages=[
        pretrain_stage("a"), pretrain_stage("b"), {"name": "s", "kind": "soup", "ingredients": ["a", "b"], "weights": [1]}]),
        "give one weight per ingredient (2), got 1"),
    "unknown hygiene key": (lambda t: base_recipe(t, hygiene={"ngrams": 5}),
                            "hygiene.ngrams: unknown key; expected one of ['decontam_min_ngram'"),
    "unknown chat key": (lambda t: base_recipe(t, data={"general": {"generate": {"kind": "stories", "documents": 3},
                                                                    "chat": {"kind": "messages", "loss": "all"}}}),
                         "data.general.chat.loss: unknown key"),
    "infinite eps": (lambda t: _with_stage(t, optim={"eps": float("inf")}), "stages[0].optim.eps"),
    "dot-dot stage name": (lambda t: _with_stage(t, name=".."), "stages[0].name"),
    "spike factor below one": (lambda t: _with_stage(t, guard={"spike_factor": 0.5}), "stages[0].guard.spike_factor"),
    "warmup past the end": (lambda t: _with_stage(t, schedule={"warmup_steps": 10}),
                            "warmup_steps (10) must be below max_steps (4)"),
    "duplicate stage names": (lambda t: base_recipe(t, stages=[pretrain_stage(), pretrain_stage()]),
                              "stage names must be unique"),
    "bad betas": (lambda t: _with_stage(t, optim={"betas": [0.9, 1.5]}), "stages[0].optim"),
    "heads do not divide hidden": (lambda t: base_recipe(t, base={"scratch": {"hidden_size": 30, "heads": 4,
                                                                              "tokenizer_sources": ["general"]}}),
                                   "base.scratch"),
    "percentages not 100": (lambda t: _with_stage(t, mixture={"customer": {"domain": 30}, "curated": {"general": 60}}),
                            "stages[0].mixture: customer and curated percentages must add to 100, they add to 90"),
    "unknown curated source": (lambda t: _with_stage(t, mixture={"customer": {"domain": 30}, "curated": {"web": 70}}),
                               "stages[0].mixture.curated.web: unknown data source"),
    "unknown eval set": (lambda t: base_recipe(t, hygiene={"decontaminate_against": ["bench"]}),
                         "hygiene.decontaminate_against[0]: unknown data source 'bench'"),
    "bad pii mode": (lambda t: base_recipe(t, hygiene={"pii": "mask"}), "hygiene.pii"),
    "reserved alias": (lambda t: base_recipe(t, tracking={"alias": "latest"}), "tracking.alias"),
    "bad source name": (lambda t: base_recipe(t, data={"crm(v2)": {"generate": {"kind": "facts", "documents": 3}}}),
                        "String should match pattern"),
    "infinite weight": (lambda t: _with_stage(t, mixture={"general": float("inf")}),
                        "stages[0].mixture.general: Input should be a finite number"),
    "source in both nova groups": (lambda t: _with_stage(t, mixture={"customer": {"domain": 50}, "curated": {"domain": 50}}),
                                   "listed under both customer and curated"),
    "training on an eval set": (lambda t: base_recipe(t, hygiene={"decontaminate_against": ["general"]}),
                                "stages[0].mixture.general: is an evaluation set"),
    "chat data in pretraining": (lambda t: base_recipe(t, data={"general": {"generate": {"kind": "stories", "documents": 3},
                                                                         "chat": {"kind": "messages"}}}),
                                 "stages[0].mixture.general: data.general holds chat records"),
    "unknown pii type": (lambda t: base_recipe(t, hygiene={"pii_types": ["email", "dna"]}),
                         "hygiene.pii_types: unknown PII type(s) ['dna']"),
    "unknown scratch key": (lambda t: base_recipe(t, base={"scratch": {"tokenizer_sources": ["general"], "colour": 1}}),
                            "base.scratch.colour: unknown key; expected one of ['arch'"),
    "unknown catalog family": (lambda t: base_recipe(t, base="catalog://nova@post"),
                               "base: no catalog family 'nova'; known: "),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipe_names_the_field(tmp_path, case):
    make, expected = BAD[case]
    path = write_recipe(tmp_path / "bad.yaml", make(tmp_path))
    message = _error(path)
    assert expected in message, message
    assert str(path) in message
    assert "Traceback" not in message


def test_error_gives_yaml_line_and_value(tmp_path):
    text = re.sub(r"seq_len: \d+", "seq_len: -5", (REPO / "recipes" / "quickstart.yaml").read_text(), count=1)
    assert "seq_len: -5" in text
    path = tmp_path / "q.yaml"
    path.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "seq_len: -5" in ln)
    message = _error(path)
    assert f"line {line}: stages[0].seq_len" in message and "given: -5" in message
    assert "greater than or equal to 8" in message


def test_every_problem_on_its_own_line(tmp_path):
    recipe = _with_stage(tmp_path, batch_size=0, precision="fp64", optim={"lr": 0})
    message = _error(write_recipe(tmp_path / "bad.yaml", recipe))
    assert len(message.splitlines()) == 3


def test_invalid_yaml_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nstages: [\n  - a: 1\n")
    assert "not valid YAML" in _error(path)


def test_overrides_apply_and_are_validated(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    recipe = load_recipe(path, ["stages[0].optim.lr=1e-4", "stages.0.max_steps=7", "tracking.alias=prod"])
    assert recipe.stages[0].optim.lr == 1e-4 and recipe.stages[0].max_steps == 7
    assert recipe.tracking.alias == "prod"
    message = _error(path, ["stages[0].optim.lr=fast"])
    assert "override 'stages[0].optim.lr=fast': stages[0].optim.lr" in message
    assert "stages[3]" in _error(path, ["stages[3].seq_len=8"])
    assert "expected dotted.key=value" in _error(path, ["stages[0].seq_len"])


def test_parse_path():
    assert parse_path("stages[1].optim.lr") == ("stages", 1, "optim", "lr")
    assert parse_path("data.general.path") == ("data", "general", "path")


def test_relative_paths_resolve_against_the_recipe(tmp_path):
    (tmp_path / "corpus.txt").write_text("hello world\n")
    recipe = base_recipe(tmp_path, data={"general": {"path": "corpus.txt"}}, output="out")
    loaded = load_recipe(write_recipe(tmp_path / "r.yaml", recipe))
    assert loaded.data["general"].path == str(tmp_path / "corpus.txt")
    assert loaded.output == str(tmp_path / "out")


@pytest.mark.parametrize("path", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_validate_and_say_how_to_run(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# forge "), f"{path.name} must start with the command that runs it"
    if "../shared" in path.read_text() and not (REPO.parent / "shared").exists():
        pytest.skip("recipe uses ../shared, absent here")
    load_recipe(path)


def test_scratch_base_is_keyed_by_its_settings_and_data():
    from forge.recipe import ScratchBase
    from forge.scratch import scratch_key

    cfg = ScratchBase(tokenizer_sources=["general"])
    assert scratch_key(cfg, ["abc"]) == scratch_key(ScratchBase(tokenizer_sources=["general"]), ["abc"])
    assert scratch_key(cfg, ["abc"]) != scratch_key(cfg.model_copy(update={"hidden_size": 128}), ["abc"])
    assert scratch_key(cfg, ["abc"]) != scratch_key(cfg, ["abd"])  # the tokenizer's data changed


def test_unknown_stage_kind_names_the_line_and_lists_the_allowed_kinds(tmp_path):
    from forge.recipe import stage_kinds

    msg = _error(write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[{"kind": "distill", "name": "x"}])))
    assert "r.yaml:line " in msg and "stages[0]: 'kind' must be one of" in msg
    assert f"'kind' must be one of {list(stage_kinds())}" in msg


def test_a_settings_class_defined_here_is_a_stage_kind_the_recipe_accepts(tmp_path):
    from typing import ClassVar, Literal

    from forge.recipe import SETTINGS, TrainSettings, stage_kinds

    class EchoStage(TrainSettings):
        kind: Literal["echo"]
        reads: ClassVar[str] = "chat"
        data: list[str]

        @property
        def sources(self) -> dict[str, float]:
            return dict.fromkeys(self.data, 1.0)

        def source_paths(self) -> dict[str, str]:
            return {name: f"data[{j}]" for j, name in enumerate(self.data)}

    try:
        assert stage_kinds()[-1] == "echo"
        echo = {"name": "e", "kind": "echo", "data": ["general"], "max_steps": 2, "seq_len": 32}
        path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=[echo]))
        # the generic checks apply: general is plain text, and an echo stage reads chat records
        assert "stages[0].data[0]: data.general holds plain text, which a echo stage cannot read" in _error(path)
        ok = base_recipe(tmp_path, stages=[echo], data={"general": {
            "generate": {"kind": "stories", "documents": 3}, "chat": {"kind": "messages"}}})
        ok["base"]["scratch"]["tokenizer_sources"] = ["general"]
        recipe = load_recipe(write_recipe(tmp_path / "ok.yaml", ok))
        assert isinstance(recipe.stages[0], EchoStage) and "kind: echo" in resolved_yaml(recipe)
        echo["steps"] = 3
        assert "stages[0].steps: unknown key" in _error(write_recipe(tmp_path / "x.yaml", base_recipe(tmp_path, stages=[echo])))
    finally:
        SETTINGS.pop("echo", None)
    assert "echo" not in stage_kinds()


# ------------------------------------------------------------------ issue 18: items 10 and 11
def test_a_5000_deep_override_is_one_line(tmp_path, capsys):
    from forge import cli

    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    assert cli.main(["validate", str(path), "a" + ".a" * 5000 + "=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("forge: error: override 'a.a.a") and "levels deep" in err and "unexpected" not in err
    assert len(err.strip().splitlines()) == 1


def test_validate_lists_the_code_a_recipe_runs(tmp_path, capsys):
    from forge import cli

    (tmp_path / "score.py").write_text("def length(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    (tmp_path / "judge.py").write_text("def figure(model, tokenizer, sources, device):\n    return 1.0\n")
    recipe = base_recipe(tmp_path)
    recipe["data"]["prompts"] = {"generate": {"kind": "facts", "documents": 50, "seed": 2}}
    recipe["stages"].append({"name": "rl", "kind": "rft", "data": ["prompts"], "prompt_field": "text",
                             "max_steps": 1, "batch_size": 2, "group": 2, "seq_len": 64,
                             "rewards": [{"source": "score.py:length"},
                                         {"source": "https://alice:hunter2@127.0.0.1:9/score"},
                                         {"source": "lambda:grader"}]})
    recipe["eval"] = {"custom": ["judge.py:figure"], "reward": {"rewards": [{"source": "json:loads"}]}}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"stages[1].rewards[0]: {tmp_path / 'score.py'}:length" in out
    assert "stages[1].rewards[1]: https://alice:***@127.0.0.1:9/score" in out and "hunter2" not in out
    assert "stages[1].rewards[2]: lambda:grader (AWS Lambda)" in out
    assert f"eval.custom[0]: {tmp_path / 'judge.py'}:figure" in out
    assert "eval.reward.rewards[0]: json:loads (module json" in out


# ------------------------------------------------------------------------ issue 34: minor items
@pytest.mark.parametrize("field, override", [
    ("stages[0].batch_size", "stages[0].batch_size=true"), ("stages[0].optim.lr", "stages[0].optim.lr=false"),
    ("stages[0].optim.betas", "stages[0].optim.betas=[true, 0.9]"),
    ("base.scratch.layers", "base.scratch.layers=true"), ("compute.chips", "compute.chips=yes")])
def test_a_boolean_is_no_number(tmp_path, field, override):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    message = _error(path, [override])
    assert f"override {override!r}: {field}: " in message and "true/false" in message, message
    loaded = load_recipe(path, ["stages[0].batch_size=3", "stages[0].optim.fused=true"])  # YAML's 3 is a number
    assert loaded.stages[0].batch_size == 3 and loaded.stages[0].optim.fused is True


def test_a_boolean_number_in_the_yaml_names_its_line(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", _with_stage(tmp_path, batch_size=True))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "batch_size" in text)
    assert f"r.yaml:line {line}: stages[0].batch_size: " in _error(path)


@pytest.mark.parametrize("key", ["stages[-1].seq_len", "stages[1].seq_len", "stages[x].seq_len"])
def test_an_override_index_out_of_range_names_the_range(tmp_path, key):
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path))
    message = _error(path, [f"{key}=64"])
    assert message.startswith(f"override '{key}=64': ") and "stages holds 1 item" in message, message
    assert "index 0..0" in message and "not a mapping" not in message


def test_validate_refuses_a_pipeline_that_does_not_exist_without_loading_torch(tmp_path):
    import subprocess
    import sys

    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, pipeline="novela"))
    probe = ("import sys; from forge.cli import main; code = main(['validate', sys.argv[1]]); "
             "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"forge: error: {path}:line ") and "pipeline: no pipeline named 'novela'" in err[0]
    assert "novella" in err[0] and "foundation" in err[0]  # the pipelines there are
