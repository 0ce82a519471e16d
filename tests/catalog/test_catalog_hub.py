"""A catalog phase on the Hub, against a local Hub-layout mirror built here (nothing is downloaded):
the pinned revision is the one used, a cache without it is refused in one line, the cache folder
follows HF_HUB_CACHE / HF_HOME / FORGE_HOME, and a curated Hub set streams at its pinned revision
with its record budget."""
from __future__ import annotations

import shutil

import pytest

from forge import catalog
from forge.catalog.hub import hub_cache
from forge.errors import ForgeError

LLAMA_BASE = "d04e592bb4f6aa9cfee91e2e20afa771667e1d4b"  # the revision forge/catalog/families.yaml pins


def mirror(cache, repo, revision, checkpoint, ref="main"):
    """`cache/models--ORG--NAME/{refs/REF, snapshots/REVISION/...}`: huggingface_hub's cache layout."""
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(checkpoint, root / "snapshots" / revision)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(revision)
    return root / "snapshots" / revision


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path / "forge-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)


def test_the_cache_is_the_users_hf_cache_else_forge_home(tmp_path, monkeypatch):
    assert hub_cache() == tmp_path / "forge-home" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache() == tmp_path / "cache"


def test_a_hub_phase_comes_from_the_cache_at_its_pinned_revision(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    # main points elsewhere: the pinned commit, not the branch head, is what the phase uses
    other = mirror(tmp_path / "cache", "meta-llama/Llama-3.1-8B", "f" * 40, tiny_checkpoint)
    pinned = mirror(tmp_path / "cache", "meta-llama/Llama-3.1-8B", LLAMA_BASE, tiny_checkpoint, ref="other")
    got = catalog.checkpoint("catalog://llama3.1-8b@mid-trained")
    assert got == pinned and got != other and (got / "config.json").is_file()
    # the planner reads the cached config once it is there
    assert catalog.planning_config("catalog://llama3.1-8b@mid-trained") == str(pinned)


def test_a_cache_without_the_pinned_revision_is_refused_in_one_line(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    mirror(tmp_path / "cache", "meta-llama/Llama-3.1-8B", "e" * 40, tiny_checkpoint)  # a different commit only
    with pytest.raises(ForgeError) as e:
        catalog.checkpoint("catalog://llama3.1-8b@mid-trained")
    text = str(e.value)
    assert f"hf://meta-llama/Llama-3.1-8B@{LLAMA_BASE} is not in the cache" in text and "HF_HUB_OFFLINE" in text
    assert "\n" not in text
    # not downloaded: the planner falls back to the catalog's preset for it
    assert catalog.planning_config("catalog://llama3.1-8b@mid-trained") == "llama-3.1-8b"


def test_a_branch_revision_resolves_through_its_ref(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    ph = catalog.resolve("catalog://olmo2-7b@pretrained")   # pinned to a branch name
    snap = mirror(tmp_path / "cache", ph.hub, "1" * 40, tiny_checkpoint, ref=ph.revision)
    assert catalog.checkpoint(ph.ref) == snap


def test_a_checkpoint_branch_without_a_tokenizer_gets_its_familys(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    ph = catalog.resolve("catalog://smollm3-3b@pretrained")
    snap = mirror(tmp_path / "cache", ph.hub, "2" * 40, tiny_checkpoint, ref=ph.revision)
    for p in snap.glob("tokenizer*"):
        p.unlink()
    mirror(tmp_path / "cache", ph.tokenizer_from["hub"], ph.tokenizer_from["revision"], tiny_checkpoint)
    got = catalog.checkpoint(ph.ref)
    assert got != snap and (got / "tokenizer.json").is_file() and (got / "config.json").is_file()
    assert str(got).startswith(str(tmp_path / "forge-home"))


def test_a_curated_hub_set_streams_at_its_pinned_revision_with_its_budget(monkeypatch, tmp_path):
    """The `datasets` call is replaced (no network): it gets the pinned revision and data_files,
    and the record budget stops the stream."""
    import datasets

    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    monkeypatch.delenv("HF_HUB_OFFLINE")
    seen = {}

    def fake_load(path, **kw):
        seen.update(path=path, **kw)
        return iter({"text": f"document {i} " * 20} for i in range(1000))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = DataSource(source="curated://olmo2-7b/olmo-mix", max_records=25)
    src = resolve_source("web", cfg, tmp_path)
    texts = [t for _, t in src.records()]
    want = catalog.curated("curated://olmo2-7b/olmo-mix")
    assert seen["path"] == "allenai/olmo-mix-1124" and seen["revision"] == want.revision
    assert seen["data_files"] == want.data_files and seen["streaming"] is True
    assert len(texts) == 25 and texts[0].startswith("document 0")
    assert src.location == f"hf://datasets/allenai/olmo-mix-1124@{want.revision}"
    # a token budget: about 4 characters a token, the stream stops once it is spent
    src = resolve_source("web", DataSource(source="curated://olmo2-7b/olmo-mix", max_tokens=500), tmp_path)
    spent = sum(len(t) for _, t in src.records())
    assert 2000 <= spent < 2000 + 300
    # the revision can be overridden; offline, a Hub set is refused in one line
    DataSource(source="curated://olmo2-7b/olmo-mix", revision="main")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ForgeError, match="needs network access"):
        next(iter(resolve_source("web", cfg, tmp_path).records()))
