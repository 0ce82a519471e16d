"""The forge-tiny foundation (pipelines/foundation.py) on a tiny budget: recipes/foundation-tiny.yaml
with overrides (a tiny model, a few steps, a small harvest) builds four phase checkpoints that load
and generate, foundation.json lists them and the curated sets, and no held-out record of any set
is among the records any stage trained on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge.data.mixing import in_holdout
from forge.errors import ForgeError
from forge.gen import harvest

pytestmark = pytest.mark.slow  # builds forge-tiny's family (a module fixture) and checks it

TINY = ["base.scratch.hidden_size=32", "base.scratch.layers=2", "base.scratch.heads=2", "base.scratch.kv_heads=1",
        "base.scratch.vocab_size=400", "data.general.generate.documents=1500", "data.skills.generate.documents=400",
        "data.instructions.generate.documents=400", "data.preferences.generate.documents=200"]
for _i in range(4):
    TINY += [f"stages[{_i}].max_tokens=512", f"stages[{_i}].seq_len=64", f"stages[{_i}].batch_size=4",
             f"stages[{_i}].log_every=1"]
TINY += ["stages[0].schedule.warmup_steps=1", "stages[2].schedule.warmup_steps=1", "stages[3].schedule.warmup_steps=1",
         "stages[4].max_steps=2", "stages[4].seq_len=128", "stages[4].batch_size=2", "stages[4].schedule.warmup_steps=0",
         "stages[0].eval.every=0"]
POINTS = {"pretrained": "pretrained", "ramped-down": "pretrained", "mid-trained": "mid-trained",
          "post-trained": "post-trained"}  # forge/catalog/families.yaml's


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The family built once into a temp FORGE_HOME (40 source files a root harvested)."""
    from pipelines import foundation

    mp = pytest.MonkeyPatch()
    mp.setattr(harvest, "MAX_FILES_PER_ROOT", 40)
    harvest._harvest.cache_clear()
    home = tmp_path_factory.mktemp("forge-home") / "foundations" / "forge-tiny"
    lines: list[str] = []
    try:
        foundation.build(home, lines.append, overrides=TINY)
    finally:
        mp.undo()
        harvest._harvest.cache_clear()
    return home, lines


def test_four_phases_load_and_generate(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    home, lines = built
    manifest = json.loads((home / "foundation.json").read_text())
    assert manifest["family"] == "forge-tiny" and manifest["recipe"] == "recipe.resolved.yaml"
    assert (home / manifest["recipe"]).is_file() and manifest["built"]
    assert manifest["harvest"]["files"]["stdlib"] == 40 and len(manifest["harvest"]["sha256"]) == 64
    assert {p: v["point"] for p, v in manifest["phases"].items()} == POINTS
    assert manifest["phases"]["pretrained"]["curated"] == ["general", "skills"]
    assert manifest["phases"]["mid-trained"]["curated"] == ["general", "skills", "highquality", "long"]
    assert set(manifest["phases"]["post-trained"]["curated"]) == {"general", "highquality", "long", "skills",
                                                                 "instructions", "preferences"}
    weights = set()
    for phase, entry in manifest["phases"].items():
        folder = home / entry["path"]
        assert not (folder / "training_state.pt").exists()  # the model, not the trainer's state
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        ids = tok("Return the number of", return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        assert out.shape[1] > ids.shape[1], phase
        weights.add(float(torch.cat([p.detach().flatten() for p in model.parameters()]).abs().sum()))
    assert len(weights) == 4  # every phase trained on from the one before
    mid = json.loads((home / "mid-trained" / "config.json").read_text())
    assert mid["max_position_embeddings"] == 512 and mid["rope_theta" if "rope_theta" in mid else "rope_parameters"]
    post = AutoTokenizer.from_pretrained(home / "post-trained")
    assert post.chat_template
    assert "<|assistant|>" in post.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                       add_generation_prompt=True)
    assert any("published" in line for line in lines) and any("built in" in line for line in lines)


def _rows(home: Path, name: str, holdout: float) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (home / "curated" / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    train = [r for n, r in enumerate(rows, start=1) if not in_holdout(name, n, holdout)]
    held = [r for n, r in enumerate(rows, start=1) if in_holdout(name, n, holdout)]
    return train, held


def test_curated_sets_and_held_out_records_never_trained(built):
    home, _ = built
    manifest = json.loads((home / "foundation.json").read_text())
    purposes = {n: c["purpose"] for n, c in manifest["curated"].items()}
    assert purposes == {"general": "pretraining", "highquality": "pretraining", "long": "mid-training",
                        "skills": "mid-training", "instructions": "sft", "preferences": "preference"}
    assert manifest["curated"]["instructions"]["chat"] == {"kind": "messages"}
    assert manifest["curated"]["general"]["text_field"] == "text" and manifest["curated"]["general"]["chat"] is None
    sets = {n: _rows(home, n, c["holdout"]) for n, c in manifest["curated"].items()}
    assert all(held and train for train, held in sets.values())
    # text: a held-out record of any text set is in no training record of any text set (long ones included)
    trained_text = [r["text"] for n in ("general", "highquality", "long", "skills") for r in sets[n][0]]
    for n in ("general", "highquality", "long"):
        for r in sets[n][1]:
            body = r["text"].split("\n", 1)[-1][:200]
            assert not any(body in t for t in trained_text), (n, body[:60])
    # instructions, preferences and skills (the tasks as text): a held-out prompt is never a trained one
    def prompt(r: dict) -> str:
        if "messages" in r:
            return r["messages"][0]["content"]
        return r["prompt"] if "prompt" in r else r["text"].removeprefix("<|user|>\n").partition("</s>")[0]
    chats = ("instructions", "preferences", "skills")
    trained_prompts = {prompt(r) for n in chats for r in sets[n][0]}
    held_prompts = {prompt(r) for n in chats for r in sets[n][1] if r.get("task") != "echo"}
    assert held_prompts and not held_prompts & trained_prompts


def test_built_family_is_reused(built):
    from pipelines import foundation

    home, _ = built
    stamp = (home / "foundation.json").stat().st_mtime_ns
    foundation.build(home, lambda msg: pytest.fail(f"rebuilt: {msg}"))
    assert (home / "foundation.json").stat().st_mtime_ns == stamp


def test_recipe_must_name_sets_after_their_kind():
    from forge.recipe import load_recipe
    from pipelines import foundation

    recipe = load_recipe(foundation.RECIPE)
    data = dict(recipe.data)
    data["replay"] = data.pop("general")
    with pytest.raises(ForgeError, match=r"data\.replay\.generate\.kind: harvest_general must be the source named 'general'"):
        foundation.check_recipe(recipe.model_copy(update={"data": data}))
    data = {**recipe.data, "long": recipe.data["long"].model_copy(update={"holdout": 0.1})}
    with pytest.raises(ForgeError, match=r"data\.long\.holdout"):
        foundation.check_recipe(recipe.model_copy(update={"data": data}))
    stages = [s for s in recipe.stages if s.name != "ramp-down"]
    with pytest.raises(ForgeError, match=r"stages: the foundation needs stages named \['ramp-down'\]"):
        foundation.check_recipe(recipe.model_copy(update={"stages": stages}))


def test_only_the_family_recipe_as_it_is_installs_in_the_catalog(tmp_path):
    from forge.recipe import load_recipe
    from pipelines import foundation

    assert foundation._is_family_recipe(load_recipe(foundation.RECIPE, [f"output={tmp_path}"]))
    assert not foundation._is_family_recipe(load_recipe(foundation.RECIPE, ["stages[0].max_tokens=512"]))


def test_a_second_builder_waits_for_the_first_and_reuses_its_family(tmp_path):
    """While another process holds the build lock, build() waits; when that process has put a
    family in place, build() finds it and builds nothing."""
    import subprocess
    import sys

    from pipelines import foundation

    home = tmp_path / "foundations" / "forge-tiny"
    home.parent.mkdir(parents=True)
    holder = (f"import sys, time; from pathlib import Path; from pipelines.foundation import _lock\n"
              f"home = Path({str(home)!r})\n"
              f"with _lock(home.parent / '.forge-tiny.lock', print):\n"
              f"    print('held', flush=True); time.sleep(1.5); home.mkdir()\n"
              f"    (home / 'foundation.json').write_text('{{}}')\n")
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True,
                            cwd=Path(foundation.__file__).parents[1])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        lines: list[str] = []
        foundation.build(home, lines.append)
    finally:
        proc.wait(timeout=30)
    assert len(lines) == 1 and "another process is building forge-tiny; waiting" in lines[0]
    assert (home / "foundation.json").read_text() == "{}" and not (home.parent / ".forge-tiny.build").exists()


def _digests(home: Path) -> dict[str, str]:
    import hashlib

    return {str(f.relative_to(home)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(home.rglob("*")) if f.is_file() and f.name not in ("foundation.json", "recipe.resolved.yaml")}


def test_the_build_is_bitwise_repeatable_and_records_its_corpus(built, tmp_path):
    """A second build with the same recipe writes the same bytes: every phase's weights and
    tokenizer, every curated set; foundation.json's corpus sha256 is the sets' own."""
    from pipelines import foundation

    home, _ = built
    manifest = json.loads((home / "foundation.json").read_text())
    files = {n: home / c["path"] for n, c in manifest["curated"].items()}
    assert manifest["corpus"] == foundation.corpus_record(files) and len(manifest["corpus"]["sha256"]) == 64
    assert set(manifest["corpus"]["sets"]) == set(manifest["curated"])
    again = tmp_path / "foundations" / "forge-tiny"
    mp = pytest.MonkeyPatch()
    mp.setattr(harvest, "MAX_FILES_PER_ROOT", 40)
    harvest._harvest.cache_clear()
    try:
        foundation.build(again, lambda _: None, overrides=TINY)
    finally:
        mp.undo()
        harvest._harvest.cache_clear()
    first, second = _digests(home), _digests(again)
    assert any(k.endswith("model.safetensors") for k in first) and first == second
    assert json.loads((again / "foundation.json").read_text())["corpus"] == manifest["corpus"]


def test_catalog_shows_the_corpus_and_refuses_a_changed_set(built, tmp_path, monkeypatch, capsys):
    import shutil

    from forge.cli import main

    home, _ = built
    copy = tmp_path / "home" / "foundations" / "forge-tiny"
    shutil.copytree(home, copy)
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "home"))
    sha = json.loads((copy / "foundation.json").read_text())["corpus"]["sha256"]
    assert main(["catalog", "show", "forge-tiny"]) == 0
    out = capsys.readouterr().out
    assert f"corpus sha256: {sha}" in out
    with open(copy / "curated" / "general.jsonl", "a") as f:
        f.write('{"text": "A record added after the build."}\n')
    assert main(["catalog", "show", "forge-tiny"]) != 0
    err = capsys.readouterr().err
    assert "general.jsonl: its sha256 is" in err and "corpus changed since it was built" in err
