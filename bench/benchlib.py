"""What the benchmarks share: a scratch base model on generated stories, the machine line printed
with each result (cores, load average, torch threads, date), and the side-by-side ratio table every
benchmark ends with, in Markdown, so that a row can go into bench/RESULTS.md as printed.

    | <title> | <unit> | <ratio heading> |
    |---|---|---|
    | contender | 12,345 | 0.98 |
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


def machine_line() -> str:
    """Where and when the figures were measured; the load average says how much others competed."""
    import torch

    from forge.plan.measure import cpu_model

    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"machine: {cpu_model()}, {platform.machine()} {cores} cores, torch {torch.__version__} ({torch.get_num_threads()} "
            f"threads), load average {load}, {time.strftime('%Y-%m-%d %H:%M')}")


def ratio_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table: `columns` name the title column's neighbours, each row is (name, values...);
    floats print with 3 significant decimals below 10, thousands separators above."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join([title, *columns]) + " |", "|" + "---|" * (len(columns) + 1)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(ratio_table(title, columns, rows), flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def runs(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """Every run's figure, for the table's last column (the machine is noisy: all are shown)."""
    return ", ".join(fmt.format(v) for v in values)


def scratch_base(tmp: Path, hidden: int, layers: int, seq_len: int, documents: int = 5000):
    """(the base folder, the generated 'general' stories source): a Llama of `layers` x `hidden`
    with a 2,048-token BPE tokenizer trained on the stories, random weights (forge.scratch)."""
    from forge.inputs import resolve_source
    from forge.recipe import DataSource, GeneratedText, ScratchBase
    from forge.scratch import build_scratch_base

    src = resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=documents)), tmp)
    base = build_scratch_base(ScratchBase(hidden_size=hidden, layers=layers, heads=4, vocab_size=2048,
                                          max_position=max(seq_len, 128), tokenizer_sources=["general"]),
                              [src], tmp / "base")
    return base, src


def quiet_libraries() -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
