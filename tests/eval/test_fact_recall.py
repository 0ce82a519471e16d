"""Fact recall per split (eval.fact_recall.split_field) through the chat template, sentence starts
completed as plain text (complete_splits), instruction following (eval.instruct), their gates, and
batched greedy generation equal to one at a time."""
from __future__ import annotations

import json

import pytest

from forge import cli
from forge.data.chat_render import DEFAULT_CHAT_TEMPLATE, ChatRenderer
from forge.errors import ForgeError
from forge.eval import recall
from forge.eval.gates import check_gates
from forge.eval.suite import run_suite
from forge.inputs import resolve_source
from forge.recipe import DataSource
from forge.recipe.eval import EvalBlock, FactRecall
from forge_testing import memorise, write_recipe

FACTS = [("Where is the Zimeth P5 made?", "Skuvor", "Which plant assembles the Zimeth P5?"),
         ("How much does the Badox X2 cost?", "3000 euros", "If I buy the Badox X2, how much do I pay?"),
         ("What does error code E417 mean?", "blocked intake filter", "What problem does code E417 signal?")]


def _model(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _chat(tok, question, answer):
    renderer = ChatRenderer(DEFAULT_CHAT_TEMPLATE, tok.special_tokens_map)
    return renderer.render([{"role": "user", "content": question}, {"role": "assistant", "content": answer}])


@pytest.fixture(scope="module")
def taught(tiny_checkpoint, tmp_path_factory):
    """The tiny model after memorising the training phrasings as chat turns (forge's default
    template, which SFT uses for a tokenizer without one), saved as a checkpoint."""
    model, tok = _model(tiny_checkpoint)
    memorise(model, tok, [_chat(tok, q, a) for q, a, _ in FACTS], steps=150)
    out = tmp_path_factory.mktemp("taught")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _eval_source(tmp_path):
    rows = [r for q, a, h in FACTS for r in ({"question": q, "answer": a, "split": "train"},
                                             {"question": h, "answer": a, "split": "heldout"})]
    path = tmp_path / "kb_eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_per_split_figures_through_the_chat_template(taught, tiny_checkpoint, tmp_path):
    sources = {"kb": resolve_source("kb", DataSource(path=str(_eval_source(tmp_path)), holdout=0.0), tmp_path)}
    suite = EvalBlock(domain=[], general=[], seq_len=32, separator="eos",
                      fact_recall={"source": "kb", "split_field": "split", "chat": True, "match": "exact",
                                   "max_new_tokens": 16},
                      gates={"fact_recall_min": 0.5})
    c = run_suite({"start": tiny_checkpoint, "novella": taught}, suite, sources, log=lambda *_: None)
    novella = c.metrics["novella"]
    assert novella["fact_recall.train.exact"] == 1.0 and novella["fact_recall.train.contains"] == 1.0
    assert "fact_recall.heldout.exact" in novella and "fact_recall.exact" not in novella
    assert c.metrics["start"]["fact_recall.train.exact"] == 0.0
    gates = check_gates(suite, novella)
    assert [g.metric for g in gates] == ["fact_recall.heldout.exact", "fact_recall.train.exact"]
    assert gates[1].passed
    # without the chat template the same model is asked in a form it never saw
    plain = suite.model_copy(update={"fact_recall": suite.fact_recall.model_copy(update={"chat": False})})
    assert run_suite({"n": taught}, plain, sources, log=lambda *_: None).metrics["n"]["fact_recall.train.exact"] < 1.0


@pytest.mark.slow
def test_split_filter_and_limit_per_split(taught, tmp_path):
    sources = {"kb": resolve_source("kb", DataSource(path=str(_eval_source(tmp_path)), holdout=0.0), tmp_path)}
    suite = EvalBlock(domain=[], general=[], seq_len=32, separator="eos",
                      fact_recall={"source": "kb", "split_field": "split", "split": "train", "chat": True, "limit": 2})
    from forge.eval.builtin import qa_pairs

    groups = qa_pairs(suite.fact_recall, sources)
    assert list(groups) == ["fact_recall.train"] and [q for q, _ in groups["fact_recall.train"]] == \
        [FACTS[0][0], FACTS[1][0]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "a", "split": "no good!"}) + "\n")
    sources = {"kb": resolve_source("kb", DataSource(path=str(bad), holdout=0.0), tmp_path)}
    with pytest.raises(ForgeError, match=r"bad.jsonl:line 1: eval.fact_recall.split_field 'split'"):
        qa_pairs(suite.fact_recall.model_copy(update={"split": "all"}), sources)


@pytest.mark.slow
def test_instruction_following_on_held_out_chat_records(taught, tmp_path):
    path = tmp_path / "instructions.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}], "split": s}
            for (q, a, _), s in zip(FACTS, ["heldout", "heldout", "train"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sources = {"ins": resolve_source("ins", DataSource(path=str(path), chat={"kind": "messages"}), tmp_path)}
    suite = EvalBlock(domain=[], general=[], seq_len=32, separator="eos",
                      instruct={"source": "ins", "split_field": "split", "max_new_tokens": 16},
                      gates={"min": {"instruct.accuracy": 1.0}})
    m = run_suite({"n": taught}, suite, sources, log=lambda *_: None).metrics["n"]
    assert m == {"instruct.accuracy": 1.0, "instruct.contains": 1.0}
    assert check_gates(suite, m)[0].passed


@pytest.mark.slow
def test_batched_generation_equals_one_prompt_at_a_time(taught):
    model, tok = _model(taught)
    p = recall.Prompter(tok, chat=True)
    prompts = [p.ids(q) for q, _, _ in FACTS] + [p.ids(h) for _, _, h in FACTS]
    together = recall.greedy(model, tok, prompts, 16, "cpu", batch_size=8)
    assert together == [recall.greedy(model, tok, [x], 16, "cpu")[0] for x in prompts]
    assert together[:3] == [a for _, a, _ in FACTS]


def test_recipe_fields_are_checked(tmp_path, capsys):
    from forge_testing import base_recipe

    recipe = base_recipe(tmp_path)
    recipe["eval"] = {"fact_recall": {"source": "general", "split_feld": "split"}}
    assert cli.main(["validate", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 2
    assert "eval.fact_recall.split_feld" in capsys.readouterr().err
    recipe["eval"] = {"instruct": {"source": "nowhere", "chat": True}}
    assert cli.main(["validate", str(write_recipe(tmp_path / "r.yaml", recipe))]) == 2
    assert "eval: unknown data source 'nowhere'" in capsys.readouterr().err


def test_a_completion_is_exact_when_it_begins_with_the_answer():
    texts = [" 6600 grams.", "6600", " 66000 grams", " about 6600 grams", "6600 grams\nThe Zimeth P5 costs"]
    assert recall.completion_scores(texts, ["6600 grams"] * 5) == (2 / 5, 3 / 5)
    assert recall.completion_scores(["anything"], [""]) == (0.0, 0.0)


def test_a_complete_split_is_asked_as_plain_text_and_scored_on_its_start(tiny_checkpoint, tmp_path, monkeypatch):
    """The stated split's sentence starts go in plain, after the separator and with no newline; the
    doconly split's questions still go through the chat template; each split gets its figures."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from forge.eval import builtin
    from forge.eval.table import Context, Model

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    rows = [{"question": "Where is the Zimeth P5 made?", "answer": "Skuvor", "split": "doconly"},
            {"question": "The Zimeth P5 is made in", "answer": "Skuvor", "split": "stated"},
            {"question": "The Zimeth P5 weighs", "answer": "6600 grams", "split": "stated"}]
    path = tmp_path / "kb_eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sources = {"kb": resolve_source("kb", DataSource(path=str(path), holdout=0.0), tmp_path)}
    suite = EvalBlock(domain=[], general=[], seq_len=32, separator="eos",
                      fact_recall={"source": "kb", "split_field": "split", "chat": True, "complete_splits": ["stated"]})
    plain = recall.separator_ids(tok, "eos")
    canned = {tuple(recall.Prompter(tok, True).ids(rows[0]["question"])): "Skuvor",
              tuple(plain + tok(rows[1]["question"], add_special_tokens=False)["input_ids"]): " Skuvor. The Zimeth P5 weighs",
              tuple(plain + tok(rows[2]["question"], add_special_tokens=False)["input_ids"]): " about 6600 grams."}
    monkeypatch.setattr(recall, "greedy", lambda model, tokenizer, prompts, *a, **k: [canned[tuple(p)] for p in prompts])
    ctx = Context(suite, sources, None, "cpu", None, None)
    ctx = replace(ctx, prepared=builtin.prepare_fact_recall(suite.fact_recall, ctx))
    got = builtin.fact_recall(Model("n", tmp_path, None, tok), suite.fact_recall, ctx)
    assert got == {"fact_recall.doconly.exact": 1.0, "fact_recall.doconly.contains": 1.0,
                   "fact_recall.stated.exact": 0.5, "fact_recall.stated.contains": 1.0}
    misspelt = suite.fact_recall.model_copy(update={"complete_splits": ["stat"]})
    with pytest.raises(ForgeError, match=r"complete_splits: \['stat'\] not among .* \['doconly', 'stated'\]"):
        builtin.prepare_fact_recall(misspelt, ctx)


def test_complete_splits_are_split_names_of_a_split_field():
    from pydantic import ValidationError

    assert FactRecall(source="kb", split_field="split", complete_splits=["stated", "doc-only_2"]).complete_splits
    with pytest.raises(ValidationError, match="complete_splits.0"):
        FactRecall(source="kb", split_field="split", complete_splits=["no good!"])
    with pytest.raises(ValidationError, match="set split_field"):
        FactRecall(source="kb", complete_splits=["stated"])
