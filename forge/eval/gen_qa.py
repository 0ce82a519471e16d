"""Generative QA (`eval.gen_qa`): greedy answers to the questions of a bring-your-own file, scored
against its references by SQuAD exact match and token F1 and by ROUGE-L (the F-measure of the
longest common token subsequence, Lin 2004), each the best over a question's references.

ROUGE-L is computed here (rouge_score is not a forge dependency and is not installed): tokens are the
SQuAD-normalised words (lower case, no punctuation or articles), so all three figures read the same
tokens; rouge_score's own tokenizer (lower case, [a-z0-9]+ runs, no article removal) can differ
slightly on text with articles or punctuation inside words.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.eval.recall import Prompter, greedy, normalize_answer


def read_jsonl(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(file:line, row) of a JSONL file's records; a line that is not a JSON object is refused by line."""
    path = Path(path)
    if not path.is_file():
        raise ForgeError(f"{path}: no such file (a JSONL file of question/answer or prompt rows)")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ForgeError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise ForgeError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
        out.append((f"{path}:{n}", row))
    return out


def qa_rows(rows: list[tuple[str, dict[str, Any]]], question_field: str, answer_field: str,
            limit: int) -> list[tuple[str, list[str]]]:
    """(question, references) of the first `limit` rows; a missing or empty field is named by line."""
    out = []
    for where, row in rows[:limit]:
        q, a = row.get(question_field), row.get(answer_field)
        refs = [a] if isinstance(a, str) else a
        if not isinstance(q, str) or not q.strip():
            raise ForgeError(f"{where}: eval.gen_qa.question_field {question_field!r}: no question text in this row")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise ForgeError(f"{where}: eval.gen_qa.answer_field {answer_field!r}: expected a reference answer "
                             "(text, or a list of texts)")
        out.append((q, refs))
    if not out:
        raise ForgeError("eval.gen_qa: no question/answer rows to score")
    return out


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's F1 over the normalised tokens (an empty pair counts as a match)."""
    p, r = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def lcs_length(a: list[str], b: list[str]) -> int:
    """The longest common subsequence's length (dynamic programming, one row kept)."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1: 2PR/(P+R) with P = LCS/|prediction|, R = LCS/|reference| (normalised tokens)."""
    p, r = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not p or not r:
        return float(p == r)
    lcs = lcs_length(p, r)
    if not lcs:
        return 0.0
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def qa_scores(predictions: list[str], references: list[list[str]]) -> dict[str, float]:
    """`gen_qa.exact_match`, `gen_qa.f1` and `gen_qa.rouge_l`: means over the questions of each
    prediction's best score over its references."""
    out = {"gen_qa.exact_match": 0.0, "gen_qa.f1": 0.0, "gen_qa.rouge_l": 0.0}
    for pred, refs in zip(predictions, references):
        out["gen_qa.exact_match"] += max(exact_match(pred, r) for r in refs)
        out["gen_qa.f1"] += max(token_f1(pred, r) for r in refs)
        out["gen_qa.rouge_l"] += max(rouge_l(pred, r) for r in refs)
    return {k: v / len(predictions) for k, v in out.items()}


def gen_qa(model: Any, tokenizer: Any, pairs: list[tuple[str, list[str]]], block: Any, device: Any,
           separator: str = "eos") -> dict[str, float]:
    """Greedy answers (as `block`, the recipe's eval.gen_qa, asks) scored by qa_scores."""
    prompter = Prompter(tokenizer, block.chat, separator)
    ids = [prompter.ids(q if block.chat else f"{q}\n") for q, _ in pairs]
    answers = greedy(model, tokenizer, ids, block.max_new_tokens, device)
    first_lines = [next((ln for ln in a.strip().splitlines() if ln.strip()), "") for a in answers]
    return qa_scores(first_lines, [refs for _, refs in pairs])
