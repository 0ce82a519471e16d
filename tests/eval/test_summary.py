"""The end-of-run summary on fake results (no training): a row for every stage kind with the kind's
headline figure, start versus Novella with retention against the checkpoint the customization began
from, the gates with pass or fail, and no line of key=value pairs."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from forge.eval.finish import Evaluation, reference
from forge.eval.gates import GateResult
from forge.eval.suite import NOVELLA, START, Comparison
from forge.eval.summary import Ending, render
from forge.kinds import KINDS
from forge.recipe import Base, ScratchBase

# one fake StageResult per kind, with the figures each kind's stage really reports
RESULTS = {
    "pretrain": ({"eval_loss_start": 5.964, "eval_loss": 5.668, "tokens": 512, "train_seconds": 0.15}, 4),
    "midtrain": ({"eval_loss_start": 3.2, "eval_loss": 2.95, "tokens": 1_200_000, "train_seconds": 61.0}, 150),
    "soup": ({"ingredients": 2.0}, 0),
    "sft": ({"eval_loss_start": 2.9, "eval_loss": 1.1, "tokens": 98_304, "train_seconds": 130.0}, 200),
    "dpo": ({"eval_rewards/accuracy_start": 0.5, "eval_rewards/accuracy": 0.625, "eval_loss": 0.66,
             "tokens": 40_000}, 16),
    "rft": ({"reward_mean_start": 0.344, "reward_mean": 0.865, "tokens": 9_000}, 24),
}
HEADLINE = {"pretrain": "eval loss: 5.964 -> 5.668", "midtrain": "eval loss: 3.200 -> 2.950",
            "soup": "ingredients averaged: 2", "sft": "eval loss: 2.900 -> 1.100",
            "dpo": "preference accuracy: 50.0% -> 62.5%", "rft": "mean reward: 0.344 -> 0.865"}
KEY_VALUE = re.compile(r"[\w./]+=\S+")
# how tests/pipelines/test_quickstart.py reads the quickstart's start-versus-Novella lines
QUICKSTART_LINE = re.compile(r"^  (?P<text>.+?)  +(?P<shown>\S+ -> \S+) +\((?P<metric>[\w.]+): (?P<start>\S+) -> "
                             r"(?P<novella>\S+)\)$")


def _stages(kinds):
    stages = [SimpleNamespace(name=f"s-{k}", kind=k) for k in kinds]
    results = [SimpleNamespace(metrics=RESULTS[k][0], steps=RESULTS[k][1], checkpoint=Path(f"/r/stages/s-{k}/final"),
                               tokens_by_source={}) for k in kinds]
    return stages, results


def _evaluation(gates=(), **kw):
    metrics = {START: {"ppl.med": 40.0, "loss.med": 3.69, "ppl.web": 20.0, "retention.web": 0.0,
                       "domain_gain.med": 0.0, "fact_recall.heldout.exact": 0.1, "fact_recall.heldout.contains": 0.2},
               NOVELLA: {"ppl.med": 20.0, "loss.med": 3.0, "ppl.web": 21.0, "retention.web": 0.05,
                         "domain_gain.med": 0.5, "fact_recall.heldout.exact": 0.75, "fact_recall.heldout.contains": 0.8}}
    comparison = Comparison([START, NOVELLA], {START: "/r/stages/s-pretrain/final", NOVELLA: "/r/novella"}, metrics)
    return Evaluation(comparison, list(gates), "ppl.med", **kw)


def test_every_kind_has_a_row_with_its_headline_figure():
    assert set(RESULTS) == set(KINDS)  # a new kind needs a row here (and a headline in forge/kinds.py)
    stages, results = _stages(list(RESULTS))
    walls = {"s-pretrain": 3.2, "s-midtrain": 75.0, "s-soup": 0.4, "s-sft": None, "s-dpo": 9.9, "s-rft": 4000.0}
    lines = render(Ending("r", stages, results, walls, _evaluation(), seconds=4321.0))
    assert lines[0] == "summary: r, 6 stage(s) in 1 h 12 min"
    assert lines[1].split() == ["stage", "kind", "steps", "tokens", "time", "headline"]
    rows = {line.split()[0]: line for line in lines[2:8]}
    for kind, text in HEADLINE.items():
        row = rows[f"s-{kind}"]
        assert row.split()[1] == kind and row.endswith(text), row
    assert rows["s-midtrain"].split()[2:6] == ["150", "1.2M", "1", "min"]
    assert " 98.3k " in rows["s-sft"] and " reused " in rows["s-sft"]  # a stage reused from a run before
    assert rows["s-soup"].split()[2:5] == ["-", "-", "0.4"]            # a soup neither steps nor reads tokens
    assert " 1 h 6 min " in rows["s-rft"]
    assert not [line for line in lines if len(KEY_VALUE.findall(line)) > 1]


def test_an_env_stage_headlines_its_held_out_trajectory_reward():
    from forge.eval.summary import stage_figure

    agent = {**RESULTS["rft"][0], "env.heldout.reward_start": 0.444, "env.heldout.reward": 0.609}
    assert stage_figure(KINDS["rft"].headline, agent) == "held-out trajectory reward: 0.444 -> 0.609"
    stages, results = _stages(["rft"])
    results[0].metrics = agent
    empty = Evaluation(Comparison([START, NOVELLA], {START: "/b", NOVELLA: "/n"}, {START: {}, NOVELLA: {}}))
    lines = render(Ending("r", stages, results, evaluation=empty))  # one stage: its held-out figure is the story
    assert lines[lines.index("r: start -> Novella") + 1].endswith("(env.heldout.reward: 0.444 -> 0.609)")


def test_start_versus_novella_names_the_reference_and_keeps_the_headline_metrics():
    stages, results = _stages(["pretrain", "sft"])
    recipe = SimpleNamespace(base=Base(scratch=ScratchBase(tokenizer_sources=["web"])), stages=stages)
    start, what = reference(recipe, Path("/r/base-1"), results)
    assert start == Path("/r/stages/s-pretrain/final")  # a foundation trained from scratch: its output
    assert what == "s-pretrain's output, as the base is trained from scratch"
    lines = render(Ending("r", stages, results, evaluation=_evaluation(reference=what)))
    i = lines.index("r: start -> Novella (start: s-pretrain's output, as the base is trained from scratch)")
    body = lines[i + 1:lines.index("gates: none set (eval.gates)")]
    assert [line.split("(")[-1].split(":")[0] for line in body] == [
        "ppl.med", "ppl.web", "retention.web", "domain_gain.med", "fact_recall.heldout.exact"]  # not loss.*, .contains
    assert "  perplexity change vs start, web  +0.0% -> +5.0%" in "\n".join(body)
    assert body[-1].startswith("  fact recall, heldout") and "10.0% -> 75.0%" in body[-1]
    assert body[-1].endswith("(fact_recall.heldout.exact: 0.1 -> 0.75)")

    catalog = SimpleNamespace(base="catalog://forge-tiny@mid-trained", stages=stages)
    assert reference(catalog, Path("/home/ft/mid"), results) == (Path("/home/ft/mid"),
                                                                 "the base, catalog://forge-tiny@mid-trained")
    one = SimpleNamespace(base=recipe.base, stages=stages[:1])  # one stage from scratch: nothing to retain
    start, what = reference(one, Path("/r/base-1"), results[:1])
    assert start == Path("/r/base-1") and "random initialisation" in what
    lines = render(Ending("r", stages[:1], results[:1], evaluation=_evaluation(reference=what, scratch_only=True)))
    assert not [line for line in lines if "retention." in line or "domain_gain." in line]
    assert any(line.startswith("  retention: none (the recipe's only stage trains from scratch") for line in lines)


def test_gates_say_pass_or_fail_and_by_how_much():
    ok = GateResult("retention_ppl_increase_max", "retention.web", 0.05, 0.1, "max", True)
    bad = GateResult("fact_recall_min", "fact_recall.heldout.exact", 0.75, 0.8, "min", False)
    lines = render(Ending("r", *_stages(["pretrain"]), evaluation=_evaluation([ok, bad])))
    gates = lines[lines.index("gates: FAIL (1 of 2 failed)") + 1:]
    assert gates[:2] == ["gate retention_ppl_increase_max: retention.web = 0.05, at most 0.1: pass",
                         "gate fact_recall_min: fact_recall.heldout.exact = 0.75, at least 0.8: FAIL by 0.05"]
    lines = render(Ending("r", *_stages(["pretrain"]), evaluation=_evaluation([ok])))
    assert "gates: PASS (all 1)" in lines


def test_a_suite_that_measured_nothing_says_so_and_a_given_headline_replaces_the_choice():
    stages, results = _stages(["sft", "dpo"])
    empty = Evaluation(Comparison([START, NOVELLA], {START: "/b", NOVELLA: "/n"}, {START: {}, NOVELLA: {}}))
    lines = render(Ending("r", stages, results, evaluation=empty))
    assert any(line.startswith("r: start -> Novella: the suite measured nothing") for line in lines)
    assert lines[3].endswith("preference accuracy: 50.0% -> 62.5%")  # the stage's own held-out figure
    lines = render(Ending("r", stages[1:], results[1:], evaluation=empty))  # one stage: its figure is the story
    i = lines.index("r: start -> Novella")
    assert lines[i + 1] == ("  preference accuracy, held out (the stage's own)  50.0% -> 62.5%     "
                            "(eval_rewards/accuracy: 0.5 -> 0.625)")

    lines = render(Ending("r", stages, results, evaluation=_evaluation(),
                          headline=[("fact recall, held-out phrasings", "fact_recall.heldout.exact"),
                                    ("general perplexity (web)", "ppl.web"), ("not measured", "instruct.accuracy")],
                          where=[("novella", "/r/novella"), ("export", "/r-bedrock")]))
    i = lines.index("r: start -> Novella")
    assert lines[i + 1:i + 3] == [
        "  fact recall, held-out phrasings  10.0% -> 75.0%     (fact_recall.heldout.exact: 0.1 -> 0.75)",
        "  general perplexity (web)         20.00 -> 21.00     (ppl.web: 20 -> 21)"]
    assert lines[-2:] == ["novella: /r/novella", "export:  /r-bedrock"]
    assert [m["metric"] for m in map(QUICKSTART_LINE.match, lines[i:]) if m] == ["fact_recall.heldout.exact", "ppl.web"]
