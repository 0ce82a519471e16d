"""The typed lineage: a lineage.json written before the version field still reads, and reads back
to the same JSON (plus the version); a newer version or a file that is not a lineage is refused."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.lineage import LINEAGE_VERSION, Lineage

# as forge wrote it before the lineage was typed: no version field, stage extras beside the common keys
OLD = {
    "name": "acme",
    "created": "2026-01-01T00:00:00+00:00",
    "forge_version": "0.1.0",
    "base": {"spec": {"scratch": {"arch": "llama", "hidden_size": 32, "layers": 2}}, "checkpoint": "/out/base-1"},
    "data": {
        "crm": {"location": "/data/crm.jsonl", "files": ["/data/crm.jsonl"], "format": "jsonl",
                "text_fields": ["text"], "proprietary": True, "bytes": 1234, "sha256": "ab" * 32, "tokens": 768,
                "skipped_records": 2, "cleaned": {"file": "/out/data/crm.clean.jsonl", "sha256": "cd" * 32}},
        "web": {"location": "/data/web", "files": ["/data/web/a.txt"], "format": "text", "text_fields": [],
                "proprietary": False, "bytes": 99, "sha256": "ef" * 32, "tokens": 128, "skipped_records": 0},
    },
    "stages": [
        {"name": "cpt", "kind": "pretrain", "settings": {"name": "cpt", "kind": "pretrain", "max_steps": 6},
         "input_checkpoint": "/out/base-1", "output_checkpoint": "/out/stages/cpt/merged", "steps": 6,
         "tokens_by_source": {"crm": 768}, "metrics": {"loss": 4.5, "eval_loss": float("nan"), "tokens": 768},
         "repeats": {"crm": 0}, "shares": {"crm": 1.0}, "rebalanced": [],
         "context": {"max_position": 256, "rope_theta": 10000.0},
         "merge": {"weight": 0.5, "trained_checkpoint": "/out/stages/cpt/final", "input_checkpoint": "/out/base-1",
                   "output_checkpoint": "/out/stages/cpt/merged"},
         "evaluation": {"ppl.crm": 12.5, "fact_recall.correct": 3}},
        {"name": "soup", "kind": "soup", "settings": {"name": "soup", "kind": "soup"}, "input_checkpoint": "x",
         "output_checkpoint": "y", "steps": 0, "tokens_by_source": {}, "metrics": {"ingredients": 2.0},
         "ingredients": ["/a", "/b"]},
    ],
    "metrics": {"ingredients": 2.0},
    "hygiene": {"hygiene.pii.email": 3, "hygiene.records_in": 300},
    "evaluation": {"schema": "forge.eval/1", "baseline": "start",
                   "models": [{"label": "start", "path": "/out/base-1", "metrics": {"ppl.crm": 20.0}}],
                   "deltas": {"novella": {"ppl.crm": -7.5}}, "skipped": [], "seconds": {"start": 1.5},
                   "domain": ["crm"], "general": ["web"], "primary": "ppl.crm",
                   "gates": [{"gate": "domain_ppl_max", "metric": "ppl.crm", "value": None, "limit": 15.0,
                              "kind": "max", "passed": False, "text": "domain_ppl_max: not measured"}],
                   "passed": False, "markdown": "| model | ppl.crm |\n", "alias": "version 1 is `candidate`",
                   "version": 1},
    "compute": {"cpt": {"steps": 6, "tokens": 768, "train_hours": 0.001, "target": "trn3", "planned_steps": 6,
                        "planned_tokens": 768, "planned_hours": 0.0001, "planned_flops": 1.5e12}},
}


def test_an_old_lineage_reads_with_attributes(tmp_path):
    (tmp_path / "lineage.json").write_text(json.dumps(OLD, indent=2))
    lineage = Lineage.read(tmp_path / "lineage.json")
    assert lineage.version == LINEAGE_VERSION and lineage.name == "acme"
    assert lineage.base.checkpoint == "/out/base-1" and lineage.data["crm"].cleaned.sha256 == "cd" * 32
    cpt, soup = lineage.stages
    assert cpt.merge.weight == 0.5 and cpt.extras["context"]["max_position"] == 256
    assert soup.extras == {"ingredients": ["/a", "/b"]} and soup.merge is None and soup.evaluation is None
    assert lineage.evaluation.gates[0].value is None and lineage.evaluation.version == 1
    assert lineage.evaluation.model_extra == {"seconds": {"start": 1.5}}
    assert lineage.compute["cpt"].planned_flops == 1.5e12


def test_it_writes_back_the_same_json_plus_the_version(tmp_path):
    path = Lineage.model_validate(OLD).write(tmp_path / "lineage.json")
    text = path.read_text()
    assert "NaN" in text  # non-finite metrics are kept as json writes them, not turned into null
    again = json.loads(text)
    assert again.pop("version") == LINEAGE_VERSION
    assert json.dumps(again, sort_keys=True) == json.dumps(OLD, sort_keys=True)


def test_absent_parts_stay_absent():
    fresh = {k: v for k, v in OLD.items() if k not in ("evaluation", "compute")}
    fresh["stages"] = [OLD["stages"][1]]
    fresh["data"] = {"web": OLD["data"]["web"]}
    out = Lineage.model_validate(fresh).to_dict()
    assert "evaluation" not in out and "compute" not in out and "cleaned" not in out["data"]["web"]
    assert "merge" not in out["stages"][0] and "evaluation" not in out["stages"][0]


def test_a_newer_version_or_another_file_is_refused(tmp_path):
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**OLD, "version": LINEAGE_VERSION + 1}))
    with pytest.raises(ForgeError, match="newer.json: not a forge lineage: .*newer forge"):
        Lineage.read(newer)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(ForgeError, match="other.json: not a forge lineage"):
        Lineage.read(other)
