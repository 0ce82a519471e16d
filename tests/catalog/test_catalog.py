"""The foundation catalog: the built-in families and their cited revisions, resolve / add / remove,
every refusal (unknown family, phase, architecture, no tokenizer, a built-in phase), and the
offline family before and after it is built."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from catalog_testing import write_tiny_foundation
from forge import catalog
from forge.cli import main
from forge.errors import ForgeError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    return tmp_path / "forge-home"


def test_the_home_is_forge_home_else_dot_forge_in_the_working_directory(tmp_path, monkeypatch):
    assert catalog.forge_home() == tmp_path / "forge-home"
    monkeypatch.delenv("FORGE_HOME")
    monkeypatch.chdir(tmp_path)
    assert catalog.forge_home() == tmp_path / ".forge"


def test_built_in_families_map_their_phases_to_the_three_points():
    fams = catalog.families()
    assert {"olmo2-7b", "smollm3-3b", "llama3.1-8b", "qwen3-8b", "forge-tiny"} <= set(fams)
    for name in ("olmo2-7b", "smollm3-3b", "forge-tiny"):
        assert {"pretrained", "mid-trained", "post-trained"} <= set(fams[name].phases), name
    assert catalog.resolve("catalog://llama3.1-8b@mid-trained").hub == "meta-llama/Llama-3.1-8B"
    assert catalog.resolve("catalog://llama3.1-8b@post-trained").hub == "meta-llama/Llama-3.1-8B-Instruct"
    assert catalog.resolve("catalog://qwen3-8b@mid-trained").hub == "Qwen/Qwen3-8B-Base"
    assert catalog.resolve("catalog://qwen3-8b@post-trained").hub == "Qwen/Qwen3-8B"
    assert catalog.resolve("catalog://olmo2-7b@pretrained").revision.startswith("stage1-step")
    assert catalog.resolve("catalog://olmo2-7b@post-trained").hub == "allenai/OLMo-2-1124-7B-Instruct"
    assert catalog.resolve("catalog://smollm3-3b@sft").hub == "HuggingFaceTB/SmolLM3-3B-checkpoints"
    # Bedrock's acceptance is derived from forge/export/bedrock.yaml's architecture list
    assert catalog.resolve("catalog://llama3.1-8b@post-trained").bedrock
    assert catalog.resolve("catalog://qwen3-8b@post-trained").bedrock
    assert not catalog.resolve("catalog://olmo2-7b@mid-trained").bedrock   # Olmo2ForCausalLM is not listed


def test_every_hub_revision_and_data_mix_is_pinned_and_cited():
    for fam in catalog.families().values():
        for ph in fam.phases.values():
            if ph.hub:
                assert ph.revision and ph.cite, ph.ref
                assert ph.architecture and ph.parameters and ph.context and ph.licence, ph.ref
                assert set(ph.curated) <= set(fam.curated), ph.ref
                # a hash is 40 hex digits; anything else says it is a branch or names main
                if not re.fullmatch(r"[0-9a-f]{40}", ph.revision):
                    assert "branch" in ph.cite, ph.ref
        for c in fam.curated.values():
            assert c.purpose in catalog.PURPOSES
            if c.hub:
                assert c.revision and c.cite, c.ref
                assert (c.text_field is None) != (c.chat is None), c.ref
    olmo = catalog.families()["olmo2-7b"].curated
    assert {c.purpose for c in olmo.values()} == set(catalog.PURPOSES)
    assert olmo["dolmino-mix"].hub == "allenai/dolmino-mix-1124"


@pytest.mark.parametrize("ref, words", [
    ("catalog://nope@mid-trained", ["base", "no catalog family 'nope'", "olmo2-7b", "forge-tiny"]),
    ("catalog://olmo2-7b@annealed", ["base", "no phase 'annealed'", "pretrained (pretrained)", "mid-trained"]),
    ("catalog://olmo2-7b", ["base", "catalog://FAMILY@PHASE"]),
])
def test_unknown_family_or_phase_is_refused_with_what_exists(ref, words):
    with pytest.raises(ForgeError) as e:
        catalog.resolve(ref)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_curated_set_is_refused_with_the_sets_there_are():
    with pytest.raises(ForgeError, match=r"source: family 'olmo2-7b' has no curated set 'web'.*olmo-mix \(pretraining\)"):
        catalog.curated("curated://olmo2-7b/web")


def _copy(src, dst, drop=(), **config):
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def test_add_resolve_and_remove_a_local_checkpoint(tiny_checkpoint, home, capsys):
    assert main(["catalog", "add", "acme@post-trained", str(tiny_checkpoint)]) == 0
    assert "registered catalog://acme@post-trained [post-trained]" in capsys.readouterr().out
    ph = catalog.resolve("catalog://acme@post-trained")
    assert ph.path == tiny_checkpoint.resolve() and ph.origin == "registered"
    assert ph.architecture == "LlamaForCausalLM" and ph.context == 128 and ph.parameters > 10_000
    assert catalog.checkpoint("catalog://acme@post-trained") == tiny_checkpoint.resolve()
    saved = yaml.safe_load((home / "catalog.yaml").read_text())
    assert saved["families"]["acme"]["phases"]["post-trained"]["path"] == str(tiny_checkpoint.resolve())
    assert main(["catalog", "show", "acme"]) == 0
    assert "post-trained [post-trained]" in capsys.readouterr().out
    assert main(["catalog", "remove", "acme@post-trained"]) == 0
    with pytest.raises(ForgeError, match="no catalog family 'acme'"):
        catalog.resolve("catalog://acme@post-trained")
    assert tiny_checkpoint.is_dir()  # the folder itself stays


def test_a_novella_registers_with_where_it_came_from(tiny_checkpoint, tmp_path):
    novella = _copy(tiny_checkpoint, tmp_path / "novella")
    (novella / "lineage.json").write_text(json.dumps({"name": "acme-v1", "created": "2025-01-01T00:00:00+00:00",
                                                      "base": {"spec": "catalog://forge-tiny@mid-trained"},
                                                      "stages": [{"name": "cpt", "kind": "pretrain"}]}))
    ph = catalog.add("acme@v1", novella, point="post-trained")
    assert ph.registered_from == {"novella": "acme-v1", "created": "2025-01-01T00:00:00+00:00",
                                  "base": "catalog://forge-tiny@mid-trained", "stages": ["cpt/pretrain"]}
    assert catalog.resolve("catalog://acme@v1").record()["registered_from"]["novella"] == "acme-v1"


def _refusal(capsys, *argv) -> str:
    assert main(["catalog", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forge: error: ") and "\n" not in err, err
    return err


def test_add_refusals_name_what_is_wrong(tiny_checkpoint, tmp_path, capsys):
    foreign = _copy(tiny_checkpoint, tmp_path / "foreign", architectures=["FooForCausalLM"])
    err = _refusal(capsys, "add", "acme@post-trained", str(foreign))
    assert "architecture 'FooForCausalLM' is not one forge knows" in err and "LlamaForCausalLM" in err
    untok = _copy(tiny_checkpoint, tmp_path / "untok", drop=[p.name for p in tiny_checkpoint.glob("tokenizer*")])
    assert "no tokenizer files" in _refusal(capsys, "add", "acme@post-trained", str(untok))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _refusal(capsys, "add", "acme@post-trained", str(empty))
    assert "give --point" in _refusal(capsys, "add", "acme@v2", str(tiny_checkpoint))
    assert "built-in phase" in _refusal(capsys, "add", "olmo2-7b@mid-trained", str(tiny_checkpoint))
    assert "expected FAMILY@PHASE" in _refusal(capsys, "add", "Acme", str(tiny_checkpoint))
    assert not (tmp_path / "forge-home" / "catalog.yaml").exists()  # nothing was registered
    catalog.add("acme@post-trained", tiny_checkpoint)
    assert "already registered" in _refusal(capsys, "add", "acme@post-trained", str(tiny_checkpoint))


def test_built_in_phases_cannot_be_removed(capsys):
    assert "built-in phase and cannot be removed" in _refusal(capsys, "remove", "olmo2-7b@pretrained")
    assert "is not registered" in _refusal(capsys, "remove", "acme@v9")


def test_a_phase_added_to_a_built_in_family_stays_beside_its_phases(tiny_checkpoint):
    catalog.add("olmo2-7b@ours", tiny_checkpoint, point="post-trained")
    fam = catalog.family("olmo2-7b")
    assert fam.phases["ours"].origin == "registered" and fam.phases["mid-trained"].origin == "built-in"
    catalog.remove("olmo2-7b@ours")
    assert "ours" not in catalog.family("olmo2-7b").phases


def test_the_offline_family_before_and_after_it_is_built(tiny_checkpoint, home, capsys):
    ref = "catalog://forge-tiny@mid-trained"
    assert catalog.unbuilt(ref) == "foundation" and catalog.unbuilt("curated://forge-tiny/general") == "foundation"
    assert catalog.unbuilt("catalog://olmo2-7b@mid-trained") is None and catalog.unbuilt("/some/folder") is None
    assert catalog.build_home(ref) == home / "foundations" / "forge-tiny"
    assert catalog.resolve(ref).point == "mid-trained" and not catalog.resolve(ref).built
    with pytest.raises(ForgeError, match="not built yet"):
        catalog.checkpoint(ref)
    assert main(["catalog", "show", "forge-tiny"]) == 0
    out = capsys.readouterr().out
    assert "not built yet" in out and "first `forge run`" in out and "forge run recipes/foundation-tiny.yaml" in out
    root = write_tiny_foundation(home, tiny_checkpoint)
    assert catalog.unbuilt(ref) is None
    assert catalog.checkpoint(ref) == root / "mid-trained"
    ph = catalog.resolve(ref)
    assert ph.origin == "built" and ph.architecture == "LlamaForCausalLM" and ph.context == 128
    general = catalog.curated("curated://forge-tiny/general")
    assert general.path == root / "curated" / "general.jsonl" and general.holdout == 0.1
    assert catalog.curated("curated://forge-tiny/instructions").chat == {"kind": "messages"}
    assert main(["catalog", "list"]) == 0
    assert "forge-tiny: pretrained [pretrained], ramped-down [pretrained], mid-trained [mid-trained]" \
        in capsys.readouterr().out


def test_forge_tinys_phases_have_one_point_before_and_after_the_build(tiny_checkpoint, home, capsys):
    """families.yaml declares each forge-tiny phase's point; `forge catalog list`, the refusal of an
    unknown phase and a built home (whose foundation.json may say otherwise) all give that one."""
    declared = {"pretrained": "pretrained", "ramped-down": "pretrained", "mid-trained": "mid-trained",
                "post-trained": "post-trained"}

    def said() -> tuple[str, str]:
        assert main(["catalog", "list"]) == 0
        listed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("forge-tiny:"))
        with pytest.raises(ForgeError) as e:
            catalog.resolve("catalog://forge-tiny@annealed")
        return listed, str(e.value)

    before = said()
    root = write_tiny_foundation(home, tiny_checkpoint)
    for listed, refusal in (before, said()):
        for phase, point in declared.items():
            assert f"{phase} [{point}]" in listed and f"{phase} ({point})" in refusal, (listed, refusal)
    manifest = json.loads((root / "foundation.json").read_text())
    manifest["phases"]["ramped-down"]["point"] = "mid-trained"   # a manifest that disagrees with families.yaml
    (root / "foundation.json").write_text(json.dumps(manifest))
    listed, refusal = said()
    assert "ramped-down [pretrained]" in listed and "ramped-down (pretrained)" in refusal, (listed, refusal)
    from pipelines import foundation

    assert {p: foundation.point(p) for p in foundation.PHASES} == declared
