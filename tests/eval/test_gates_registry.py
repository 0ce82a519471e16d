"""Gates, champion promotion/demotion, the comparison table and the model card (no training runs)."""
from __future__ import annotations

from forge.eval.card import model_card
from forge.eval.gates import check_gates, passed
from forge.eval.registry import Standing, decide, register
from forge.eval.report import format_table, to_markdown
from forge.eval.suite import Comparison
from forge.lineage import Lineage
from forge.recipe.eval import EvalBlock
from forge.track.notes import base_summary


def _suite(**gates):
    return EvalBlock(domain=["med"], general=["web"], gates=gates)


def test_gates_say_which_failed_and_by_how_much():
    metrics = {"retention.web": 0.25, "domain_gain.med": 0.30, "fact_recall.contains": 0.5}
    results = check_gates(_suite(retention_ppl_increase_max=0.10, domain_ppl_decrease_min=0.20,
                                 fact_recall_min=0.7, max={"retention.web": 0.5}), metrics)
    by = {r.gate: r for r in results}
    assert not by["retention_ppl_increase_max"].passed and by["domain_ppl_decrease_min"].passed
    assert "retention.web = 0.25, at most 0.1: FAIL by 0.15" in by["retention_ppl_increase_max"].text
    assert "FAIL by 0.2" in by["fact_recall_min"].text and by["max.retention.web"].passed
    assert not passed(results)
    assert passed(check_gates(_suite(domain_ppl_decrease_min=0.2), metrics))
    missing = check_gates(_suite(preference_accuracy_min=0.6), metrics)[0]
    assert not missing.passed and "not measured" in missing.text
    assert not check_gates(EvalBlock(domain=[], gates={"domain_ppl_decrease_min": 0.1}), {})[0].passed


class FakeRegistry:
    """The tracker's registry methods, in memory."""

    def __init__(self):
        self.versions, self.aliases = {}, {}

    def register_model(self, model_dir, name, alias, tags):
        version = len(self.versions) + 1
        self.versions[version] = dict(tags)
        self.aliases[alias] = version
        return version

    def alias_version(self, name, alias):
        v = self.aliases.get(alias)
        return None if v is None else (v, self.versions[v])

    def set_alias(self, name, alias, version):
        self.aliases[alias] = version

    def set_version_tags(self, name, version, tags):
        self.versions[version].update(tags)


def test_champion_promotion_demotion_and_a_failing_gate_withholding_the_alias():
    reg = FakeRegistry()
    v1, d1 = register(reg, "m", "novella", "champion", {}, Standing("ppl.med", 20.0, True))
    assert d1.promote and reg.aliases == {"candidate": 1, "champion": 1}
    # worse on the primary metric: candidate only
    v2, d2 = register(reg, "m", "novella", "champion", {}, Standing("ppl.med", 25.0, True))
    assert not d2.promote and reg.aliases == {"candidate": 2, "champion": 1}
    assert "does not beat version 1's 20" in d2.reason and reg.versions[2]["forge.champion"] == "no"
    # better but a gate failed: saved and registered, no alias
    v3, d3 = register(reg, "m", "novella", "champion", {}, Standing("ppl.med", 10.0, False))
    assert not d3.promote and reg.aliases["champion"] == 1 and reg.aliases["candidate"] == 3
    # better with gates passing: promoted, the old champion demoted to previous-champion
    v4, d4 = register(reg, "m", "novella", "champion", {}, Standing("ppl.med", 15.0, True))
    assert d4.promote and reg.aliases == {"candidate": 4, "champion": 4, "previous-champion": 1}
    assert reg.versions[4]["forge.primary_metric"] == "ppl.med" and float(reg.versions[4]["forge.primary_value"]) == 15.0
    # higher-is-better metrics compare the other way; another metric is not comparable
    assert decide("fact_recall.exact", 0.9, True, (1, {"forge.primary_metric": "fact_recall.exact",
                                                       "forge.primary_value": "0.8"})).promote
    assert not decide("ppl.web", 1.0, True, (4, reg.versions[4])).promote
    # alias: candidate keeps the old behaviour: every run takes it
    _, d = register(reg, "m", "novella", "candidate", {}, Standing("ppl.med", 99.0, False))
    assert d.promote and reg.aliases["candidate"] == 5


def test_base_summary_is_a_clean_string():
    assert base_summary("/models/stories260K") == "/models/stories260K"
    text = base_summary({"scratch": {"arch": "llama", "hidden_size": 64, "layers": 2, "heads": 4,
                                     "vocab_size": 1024, "max_position": 256, "tokenizer_sources": ["x"]}})
    assert text == "scratch llama: hidden 64, 2 layers, 4 heads, vocab 1024, context 256"
    assert "{" not in text and "'" not in text


def _comparison():
    return Comparison(["start", "novella"], {"start": "/a", "novella": "/b"},
                      {"start": {"ppl.med": 40.0, "fact_recall.exact": 0.0},
                       "novella": {"ppl.med": 20.0, "fact_recall.exact": 0.5}})


def test_table_shows_deltas_and_direction():
    table = format_table(_comparison())
    assert "20.00 (-20.00 better)" in table and "0.5000 (+0.5000 better)" in table
    md = to_markdown(_comparison())
    assert md.startswith("| metric | start | novella |") and md.count("\n") == 4
    d = _comparison().as_dict()
    assert d["schema"] == "forge.eval/1" and d["baseline"] == "start"
    assert d["deltas"] == {"novella": {"ppl.med": -20.0, "fact_recall.exact": 0.5}}


def test_model_card_sections():
    lineage = {"name": "acme", "base": {"spec": "/models/base"}, "forge_version": "0.1.0", "created": "now",
               "stages": [{"name": "cpt", "kind": "pretrain", "steps": 10, "tokens_by_source": {"med": 1000}}],
               "data": {"med": {"proprietary": True, "bytes": 123, "sha256": "ab" * 32, "tokens": 1000}},
               "hygiene": {"hygiene.pii.email": 3, "hygiene.pii.phone": 0},
               "evaluation": {"markdown": to_markdown(_comparison()), "baseline": "start", "domain": ["med"],
                              "gates": [{"text": "domain_ppl_decrease_min: ... FAIL by 0.1", "passed": False}]},
               "compute": {"cpt": {"steps": 10, "planned_steps": 10, "tokens": 1000, "planned_tokens": 1000,
                                   "train_hours": 0.01, "planned_hours": 0.02, "target": "local"}}}
    card = model_card(Lineage.model_validate(lineage))
    for section in ("## Intended use", "## Base", "## Stages", "## Data", "## Evaluation", "## Compute", "## Limitations"):
        assert section in card
    assert "hygiene.pii.email | 3" in card and "hygiene.pii.phone" not in card
    assert "| cpt | local | 10 | 10 |" in card and "not given the deployment alias" in card
