"""Progress bars for long work: steps, tokens/s, loss and ETA on a terminal; silent otherwise."""
from __future__ import annotations

import sys

from tqdm.auto import tqdm


def is_terminal() -> bool:
    return sys.stderr.isatty()


def progress(total: int, desc: str, enabled: bool = True):
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, disable=not (enabled and is_terminal()))
