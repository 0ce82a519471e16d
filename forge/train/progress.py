"""Progress of long work: a bar (steps, tokens/s, loss, ETA) on a terminal; without one (CI,
`nohup`, a pipe) a plain line every `every` steps or `seconds` seconds, so batch logs show progress.
Both answer update / set_postfix / close, the interface the training loop uses. The machinery is
forge.progress (a leaf, so data preparation, evaluation, export and the UI use the same one)."""
from __future__ import annotations

from forge.progress import LogProgress, Progress, counted, is_terminal, phase, progress, say

__all__ = ["LogProgress", "Progress", "counted", "is_terminal", "phase", "progress", "say"]
