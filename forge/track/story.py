"""A pipeline's story on its parent run: the headline figures as metrics (`start/<metric>` and
`novella/<metric>`, so the runs table can show, sort and compare them) and the start-versus-Novella
comparison as an HTML table (`eval/comparison.html`, beside the chart and the Markdown). Written
through the Tracker protocol; no MLflow import."""
from __future__ import annotations

import html
from typing import Any, Callable

from forge.lineage import EvaluationRecord
from forge.track.protocol import Tracker
from forge.track.view import story_metrics

COMPARISON_HTML = "eval/comparison.html"

_STYLE = ("body{font:14px system-ui,sans-serif;margin:16px;color:#1f272d}table{border-collapse:collapse}"
          "th,td{padding:6px 12px;border-bottom:1px solid #d8dde2;text-align:right}th:first-child,td:first-child"
          "{text-align:left}th{background:#f2f4f6}.better{color:#1a7f37}.worse{color:#c62828}.fail{color:#c62828;"
          "font-weight:600}.pass{color:#1a7f37}caption{text-align:left;font-weight:600;padding:0 0 8px}")


def log_story(tracker: Tracker, evaluation: EvaluationRecord | None,
              higher_is_better: Callable[[str], bool]) -> None:
    """The parent run's headline metrics and the comparison table (nothing without an evaluation)."""
    if evaluation is None or not evaluation.models:
        return
    tracker.log_metrics(story_metrics(evaluation))
    tracker.log_text(comparison_html(evaluation, higher_is_better), COMPARISON_HTML)


def _fmt(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.3e}"
    return f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"


def _change(name: str, start: Any, end: Any, higher_is_better: Callable[[str], bool]) -> tuple[str, str]:
    """(change text, css class): the difference and, for a ratio-free figure, the relative one."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end)):
        return "", ""
    d = end - start
    if d == 0:
        return "=", ""
    rel = f" ({d / abs(start):+.1%})" if start and not name.startswith(("retention.", "domain_gain.")) else ""
    better = (d > 0) == higher_is_better(name)
    return f"{d:+.4g}{rel} {'better' if better else 'worse'}", "better" if better else "worse"


def comparison_html(evaluation: EvaluationRecord, higher_is_better: Callable[[str], bool]) -> str:
    """The comparison as a page: one row per metric, a column per model (baseline first, the Novella
    last), the change from the baseline to the Novella, then the gates with pass or fail."""
    models = evaluation.models
    labels = [str(m["label"]) for m in models]
    values = [dict(m.get("metrics", {})) for m in models]
    names = list(dict.fromkeys(k for v in values for k in v))
    e = html.escape
    head = "".join(f"<th>{e(label)}</th>" for label in labels)
    rows = []
    for name in names:
        cells = "".join(f"<td>{_fmt(v.get(name))}</td>" for v in values)
        text, css = _change(name, values[0].get(name), values[-1].get(name), higher_is_better)
        rows.append(f"<tr><td>{e(name)}</td>{cells}<td class=\"{css}\">{e(text)}</td></tr>")
    title = f"{e(labels[0])} versus {e(labels[-1])}" + (f" (deltas against {e(labels[0])})" if len(labels) > 1 else "")
    parts = [f"<!doctype html><html><head><meta charset=\"utf-8\"><style>{_STYLE}</style></head><body>",
             f"<table><caption>{title}</caption><tr><th>metric</th>{head}<th>change</th></tr>",
             *rows, "</table>"]
    if evaluation.skipped:
        parts.append(f"<p>Skipped (time budget): {e(', '.join(evaluation.skipped))}</p>")
    if evaluation.gates:
        verdict = "pass" if evaluation.passed else "fail"
        parts.append(f"<p>Gates: <span class=\"{verdict}\">{verdict.upper()}</span></p><ul>")
        parts += [f"<li class=\"{'pass' if g.passed else 'fail'}\">{e(g.text)}</li>" for g in evaluation.gates]
        parts.append("</ul>")
    if evaluation.alias:
        parts.append(f"<p>Registry: {e(evaluation.alias)}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
