"""`eval.llm_judge`: the model answers held-out prompts (greedy, as a user turn in its chat
template) and an LLM judge (forge.lm.judges) grades every answer with the block's rubric; reports
`llm_judge.<rubric>.mean` and `.std` on the rubric's low..high scale."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.eval.recall import Prompter, greedy
from forge.lm.judges import Judge, Reach


def open_judge(block: Any, cache_dir: Path | None) -> Judge:
    """The block's judge, opened once for every model compared (its verdicts cached in `cache_dir`)."""
    return Judge(block.judge, block, cache_dir, Reach(block.timeout_s, 2, block.region))


def prompt_rows(rows: list[tuple[str, dict[str, Any]]], prompt_field: str, limit: int) -> list[dict[str, Any]]:
    """The first `limit` rows, each with a text prompt (named by file and line when it has none)."""
    out = []
    for where, row in rows[:limit]:
        if not isinstance(row.get(prompt_field), str) or not row[prompt_field].strip():
            raise ForgeError(f"{where}: eval.llm_judge.prompt_field {prompt_field!r}: no prompt text in this row")
        out.append(row)
    if not out:
        raise ForgeError("eval.llm_judge: no prompt rows to answer")
    return out


def llm_judge(model: Any, tokenizer: Any, rows: list[dict[str, Any]], judge: Judge, block: Any,
              device: Any) -> dict[str, float]:
    """Greedy answers to the rows' prompts, graded by `judge` (the rows' other fields fill the rubric)."""
    field = block.prompt_field
    prompter = Prompter(tokenizer, True)
    answers = greedy(model, tokenizer, [prompter.ids(r[field]) for r in rows], block.max_new_tokens, device)
    fields = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r) if k != field}
    scores = judge.score([r[field] for r in rows], answers, fields)
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / max(1, len(scores) - 1)) ** 0.5
    name = f"llm_judge.{judge.rubric.name}"
    return {f"{name}.mean": mean, f"{name}.std": std}
