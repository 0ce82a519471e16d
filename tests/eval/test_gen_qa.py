"""eval.gen_qa (exact match, token F1, ROUGE-L on a bring-your-own file, values checked by hand) and
eval.llm_judge (a tiny model's answers graded by a judge served on 127.0.0.1) through the suite."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.eval.gen_qa import lcs_length, qa_rows, qa_scores, read_jsonl, rouge_l, token_f1
from forge.eval.suite import run_suite
from forge.recipe import EvalBlock
from judge_server import judge_server


def test_scores_match_hand_computed_values():
    preds = ["The Eiffel Tower", "Paris France", "mat sat cat", "blue"]
    refs = [["Eiffel Tower"], ["Paris"], ["cat sat mat"], ["red", "Blue."]]
    # EM: 1 (articles and case go), 0, 0, 1 (the second reference)
    # F1: 1; p=1/2 r=1 -> 2/3; bag of words equal -> 1; 1
    # ROUGE-L: 1; LCS 1 -> 2/3; LCS("mat sat cat", "cat sat mat") = 1 -> P=R=1/3; 1
    got = qa_scores(preds, refs)
    assert got["gen_qa.exact_match"] == pytest.approx(0.5)
    assert got["gen_qa.f1"] == pytest.approx((1 + 2 / 3 + 1 + 1) / 4)
    assert got["gen_qa.rouge_l"] == pytest.approx((1 + 2 / 3 + 1 / 3 + 1) / 4)
    assert lcs_length("a b c d e".split(), "a c e x".split()) == 3
    # "the cat sat on the mat" -> cat sat on mat; "cat on mat" -> LCS 3: P=1, R=3/4
    assert rouge_l("cat on the mat", "the cat sat on the mat") == pytest.approx(2 * 0.75 / 1.75)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


def test_rows_are_refused_by_line(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text('{"question": "Q1", "answer": "A"}\n\n{"question": "Q2", "answer": 3}\n')
    rows = read_jsonl(f)
    assert [w.rsplit(":", 1)[1] for w, _ in rows] == ["1", "3"]
    with pytest.raises(ForgeError, match=r"qa.jsonl:3: eval.gen_qa.answer_field 'answer': expected a reference"):
        qa_rows(rows, "question", "answer", 10)
    f.write_text("[1, 2]\n")
    with pytest.raises(ForgeError, match="qa.jsonl:1: expected a JSON object"):
        read_jsonl(f)


def test_gen_qa_and_llm_judge_in_the_suite(tmp_path, tiny_checkpoint):
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": f"What is {i}?", "answer": [f"{i}", f"number {i}"],
                                      "prompt": f"Say {i}."}) + "\n" for i in range(5)))
    with judge_server() as srv:
        suite = EvalBlock(domain=[], general=[], gen_qa={"source": str(qa), "limit": 4, "max_new_tokens": 6},
                          llm_judge={"judge": srv["url"], "source": str(qa), "limit": 3, "max_new_tokens": 6})
        m = run_suite({"start": tiny_checkpoint}, suite, {}, log=lambda *_: None).metrics["start"]
        assert len(srv["requests"]) == 3  # one verdict per answer
    assert {"gen_qa.exact_match", "gen_qa.f1", "gen_qa.rouge_l"} <= set(m)
    assert all(0.0 <= m[k] <= 1.0 for k in ("gen_qa.exact_match", "gen_qa.f1", "gen_qa.rouge_l"))
    # the rule judge gives 1 + (times the answer says "good"); a random tiny model never does
    assert m["llm_judge.instruction_following.mean"] == 1.0 and m["llm_judge.instruction_following.std"] == 0.0
