"""What a built forge-tiny family knows, phase by phase (pipelines/foundation.py writes it to
`measured.json` beside foundation.json): perplexity on the held-out split of each curated text set,
and accuracy on held-out instruction prompts by task (greedy decoding; exact match, and after the
SQuAD normalisation forge.eval.recall uses).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from forge.data.mixing import in_holdout
from forge.data.sources import Source
from forge.eval.recall import Prompter, greedy, normalize_answer
from forge.lm.perplexity import source_blocks, source_losses

TEXT_SETS = ("general", "highquality", "long")


def heldout_instructions(home: Path, per_task: int) -> dict[str, list[tuple[str, str]]]:
    """Up to `per_task` held-out (prompt, answer) pairs of each task of the family's instructions."""
    manifest = json.loads((home / "foundation.json").read_text())
    entry = manifest["curated"]["instructions"]
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    with open(home / entry["path"], encoding="utf-8") as f:
        for n, line in enumerate((x for x in f if x.strip()), start=1):
            if in_holdout("instructions", n, entry["holdout"]):
                row = json.loads(line)
                if len(out[row["task"]]) < per_task:
                    out[row["task"]].append((row["messages"][0]["content"], row["messages"][1]["content"]))
    return dict(out)


def measure(home: Path, per_task: int = 40, max_blocks: int = 32, log: Callable[[str], None] = print
            ) -> dict[str, Any]:
    """{phase: {"ppl": {set: value}, "instructions": {task: {"exact": share, "normalized": share}},
    "instructions_mean": {...}}} for every phase of the family at `home`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads((home / "foundation.json").read_text())
    sources = {n: Source(n, (home / c["path"],), "jsonl", ("text",), "paragraph", False, holdout=c["holdout"])
               for n, c in manifest["curated"].items() if n in TEXT_SETS}
    tasks = heldout_instructions(home, per_task)
    result: dict[str, Any] = {}
    for phase, entry in manifest["phases"].items():
        folder = home / entry["path"]
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder)
        blocks = source_blocks(sources, list(sources), tok, 256, "eos", max_blocks)
        ppl = {n: round(v.ppl, 3) for n, v in source_losses(model, blocks, 8, "cpu").items()}
        prompter = Prompter(tok, chat=True)
        scores = {}
        for task, pairs in sorted(tasks.items()):
            said = greedy(model, tok, [prompter.ids(p) for p, _ in pairs], 32, "cpu")
            exact = sum(s.strip() == a for s, (_, a) in zip(said, pairs)) / len(pairs)
            norm = sum(normalize_answer(s) == normalize_answer(a) for s, (_, a) in zip(said, pairs)) / len(pairs)
            scores[task] = {"exact": round(exact, 3), "normalized": round(norm, 3), "n": len(pairs)}
        mean = {k: round(sum(s[k] for s in scores.values()) / max(1, len(scores)), 3) for k in ("exact", "normalized")}
        result[phase] = {"ppl": ppl, "instructions": scores, "instructions_mean": mean}
        log(f"  {phase:<13} held-out ppl " + ", ".join(f"{n} {v:.2f}" for n, v in ppl.items())
            + f"; held-out instructions exact {mean['exact']:.0%} (normalized {mean['normalized']:.0%})")
    return result
