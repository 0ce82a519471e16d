"""Hygiene before training: cleaned caches, cross-source dedup, decontamination, counts not values."""
from __future__ import annotations

import json

from forge.data.hygiene import HygieneConfig
from forge.data.prepare import clean_sources
from forge.inputs import resolve_source
from forge.recipe import DataSource

SECRET = "jane.doe@acme-corp.com"


def _write(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _cleaned(cfgs):
    return [n for n, c in cfgs.items() if c.cleaned]


def _setup(tmp_path):
    crm = _write(tmp_path / "crm.jsonl", [
        f"Customer wrote from {SECRET} about the Zephyr pump failing at high pressure in the plant.",
        "The Zephyr pump is rated for forty bar and must be serviced every two years by a technician.",
        "The Zephyr pump is rated for forty bar and must be serviced every two years by a technician.",
        "Benchmark question: what is the rated pressure of the Basalt valve used in the Lyon cooling loop today?",
    ])
    wiki = _write(tmp_path / "wiki.jsonl", [
        "The Zephyr pump is rated for forty bar and must be serviced every two years by a technician.",
        "Rivers flow to the sea and carry sediment that builds deltas over many thousands of years.",
    ])
    evals = _write(tmp_path / "eval.jsonl", [
        "Benchmark question: what is the rated pressure of the Basalt valve used in the Lyon cooling loop today?"])
    cfgs = {"crm": DataSource(path=str(crm), proprietary=True), "wiki": DataSource(path=str(wiki), hygiene=True),
            "evals": DataSource(path=str(evals))}
    raw = {n: resolve_source(n, c, tmp_path) for n, c in cfgs.items()}
    return cfgs, raw, {n: s.fingerprint() for n, s in raw.items()}


def test_clean_sources_redacts_dedups_and_decontaminates(tmp_path):
    cfgs, raw, fps = _setup(tmp_path)
    settings = HygieneConfig(decontaminate_against=("evals",), ngram=8)
    cleaned, stats = clean_sources(settings, raw, _cleaned(cfgs), fps, tmp_path / "data")
    crm = [t for _, t in cleaned["crm"].records()]
    wiki = [t for _, t in cleaned["wiki"].records()]
    assert len(crm) == 2 and crm[0].startswith("Customer wrote from <EMAIL> about")
    assert wiki == ["Rivers flow to the sea and carry sediment that builds deltas over many thousands of years."]
    assert stats["hygiene.pii.email"] == 1 and stats["hygiene.contaminated"] == 1
    assert stats["hygiene.exact_dups"] == 2  # one within crm, one across into wiki
    assert cleaned["evals"] is raw["evals"]  # evaluation sets are left alone
    assert SECRET not in "".join(p.read_text() for p in (tmp_path / "data").rglob("*") if p.is_file())


def test_cleaning_is_cached_by_fingerprint_and_settings(tmp_path):
    cfgs, raw, fps = _setup(tmp_path)
    first, _ = clean_sources(HygieneConfig(), raw, _cleaned(cfgs), fps, tmp_path / "data")
    written = first["crm"].files[0].stat().st_mtime_ns
    again, _ = clean_sources(HygieneConfig(), raw, _cleaned(cfgs), fps, tmp_path / "data")
    assert again["crm"].files[0].stat().st_mtime_ns == written  # reused, not recomputed
    other, _ = clean_sources(HygieneConfig(dedup="off"), raw, _cleaned(cfgs), fps, tmp_path / "data")
    assert first["crm"].files == again["crm"].files != other["crm"].files
    assert len(list(other["crm"].records())) == 4  # the duplicate stays; the email is still redacted


def test_no_hygiene_sources_pass_through(tmp_path):
    cfgs, raw, fps = _setup(tmp_path)
    cfgs = {n: c.model_copy(update={"proprietary": False, "hygiene": False}) for n, c in cfgs.items()}
    cleaned, stats = clean_sources(HygieneConfig(), raw, _cleaned(cfgs), fps, tmp_path / "data")
    assert cleaned == raw and stats == {}
