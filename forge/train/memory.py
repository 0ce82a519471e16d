"""Peak memory of a training stage, for predicted-vs-measured logging."""
from __future__ import annotations

import resource
import sys

import torch

from forge.train.accel import peak_memory_bytes, reset_peak_memory


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the high-water mark elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return _max_rss_bytes()


def _max_rss_bytes() -> int:
    """The process's peak RSS since start, or since the last reset (Linux VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so a stage's peak is not an earlier stage's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """The process's resident high-water mark (since start or the last `reset_peak_rss`), in MiB."""
    return round(_max_rss_bytes() / 2**20, 1)


def reset_peak_rss() -> None:
    """Start a new high-water mark, so a phase's peak is its own (Linux; elsewhere a no-op)."""
    _reset_peak_rss()


class PeakMemory:
    """On an accelerator: torch's allocator peak. On CPU: growth of the process's peak RSS over the stage
    (an upper bound on what training allocated; libraries loaded before the stage do not count)."""

    def __init__(self, device: torch.device):
        self.on_device = reset_peak_memory(device)
        if not self.on_device:
            _reset_peak_rss()
        self.device, self.start = device, _rss_bytes()

    def peak_bytes(self) -> int:
        if self.on_device:
            return peak_memory_bytes(self.device)
        return max(0, _max_rss_bytes() - self.start)
