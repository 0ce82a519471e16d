"""The run's log file, OUTPUT/forge.log: every line `forge run` prints while the pipeline runs, and
the long figures it leaves off the terminal (each stage's metrics as key=value, the full comparison
table, each gate), so the terminal can end with a short summary (forge.eval.summary) and nothing
is lost. A fresh run starts the file again; a resumed one appends to it."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Callable

LOG_FILE = "forge.log"


def log_path(out: str | Path) -> Path:
    return Path(out) / LOG_FILE


def append(out: str | Path, text: str) -> None:
    """Add `text` (one or more lines) to the run's log; a folder that cannot be written keeps no log
    (the terminal and MLflow still have the run)."""
    try:
        with log_path(out).open("a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")
    except OSError:
        pass


def begin(out: str | Path, first: str, resume: bool) -> None:
    """Start the log (a fresh run) or mark where a resumed run picks it up."""
    path = log_path(out)
    if not resume:
        path.unlink(missing_ok=True)
    when = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    append(out, f"{'--- resumed ' if resume else ''}{first} ({when})")


def echo(out: str | Path, show: Callable[[str], None] = print) -> Callable[[str], None]:
    """A pipeline's `log`: each line shown (printed) and kept in the run's log."""
    def log(line: str) -> None:
        show(line)
        append(out, line)
    return log
