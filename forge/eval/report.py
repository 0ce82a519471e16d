"""A Comparison as a side-by-side table with deltas against the first model (text and Markdown),
as JSON, and as a PNG chart of each metric across the models."""
from __future__ import annotations

import json
import math
from pathlib import Path

from forge.eval.suite import Comparison
from forge.recipe.eval import higher_is_better


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"


def _delta(metric: str, d: float | None) -> str:
    if d is None:
        return ""
    if d == 0:
        return " (=)"
    better = (d > 0) == higher_is_better(metric)
    return f" ({'+' if d > 0 else ''}{_fmt(d)} {'better' if better else 'worse'})"


def rows(c: Comparison) -> list[list[str]]:
    """Header, then one row per metric: the value under each model, deltas against the first."""
    deltas = c.deltas()
    out = [["metric", *c.models]]
    for name in c.names():
        row = [name]
        for i, label in enumerate(c.models):
            v = c.metrics[label].get(name)
            row.append(_fmt(v) + (_delta(name, deltas[label].get(name)) if i and v is not None else ""))
        out.append(row)
    return out


def format_table(c: Comparison) -> str:
    table = rows(c)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if c.skipped:
        lines.append(f"skipped (time budget): {', '.join(c.skipped)}")
    return "\n".join(lines) + "\n"


def to_markdown(c: Comparison) -> str:
    table = rows(c)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(r) + " |" for r in table[1:]]
    if c.skipped:
        lines.append(f"\nSkipped (time budget): {', '.join(c.skipped)}")
    return "\n".join(lines) + "\n"


def json_report(c: Comparison, extra: dict | None = None) -> bytes:
    """The comparison as `forge eval --json` writes it (its `schema` key tells forge it wrote the file)."""
    return (json.dumps({**c.as_dict(), **(extra or {})}, indent=2) + "\n").encode()


def markdown_report(c: Comparison) -> bytes:
    """The Markdown table as `forge eval --markdown` writes it, marked (invisibly) as forge's."""
    from forge.eval.outputs import MARKDOWN_MARK

    return (to_markdown(c) + "\n" + MARKDOWN_MARK + "\n").encode()


def plot(c: Comparison, path: str | Path) -> Path:
    """The chart (chart_png) written to `path`, whose folder exists."""
    path = Path(path)
    path.write_bytes(chart_png(c))
    return path


def chart_png(c: Comparison) -> bytes:
    """One small panel per metric, the models along the x axis in order; a PNG whose `Software`
    text names forge eval (how `forge eval --chart` knows a file it may replace)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from forge.eval.outputs import PNG_SOFTWARE

    names = c.names() or ["(no metrics)"]
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        xs = [m for m in c.models if name in c.metrics[m]]
        ax.plot(range(len(xs)), [c.metrics[m][name] for m in xs], marker="o")
        ax.set_xticks(range(len(xs)), xs, rotation=20, fontsize=7)
        ax.set_title(f"{name} ({'higher' if higher_is_better(name) else 'lower'} is better)", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)
    return buffer.getvalue()
