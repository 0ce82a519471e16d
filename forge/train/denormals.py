"""Denormal floats flushed to zero (FTZ/DAZ) in every CPU thread torch computes on, for a block.

A trained model's attention puts tiny probabilities (exp of large negative scores) below float32's
normal range (1.2e-38); x86 cores take a slow path for each such number. On stories260K the CPU flash
attention backward spent half its time there: an SFT step ran 1.4x faster with them flushed
(bench/bench_sft.py), and the trajectory moved by less than the reference test's 1e-6.

`torch.set_flush_denormal` sets the flag of the calling thread only, and OpenMP's worker threads
copy it only when they are created. So the flag is also set inside one OpenMP parallel region over
torch's thread count (libgomp's `GOMP_parallel`, which libgomp, Intel's libiomp5 and LLVM's libomp
all export), where each thread sets its own and notes what it had, to put back on exit.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

_OPENMP_NAMES = ("libgomp", "libiomp5", "libomp")
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def flushing() -> bool:
    """Whether the calling thread flushes denormals: a denormal times one comes out as zero."""
    return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0


@contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[None]:
    """Flush denormals in the calling thread and torch's OpenMP threads inside the block (a no-op
    where `enabled` is false); each thread gets back its own setting after."""
    if not enabled:
        yield
        return
    before = _on_every_thread(True)
    try:
        yield
    finally:
        _on_every_thread(before)


def _on_every_thread(setting: bool | dict[int, bool]) -> dict[int, bool]:
    """Set the flag on every thread (one value, or each thread's own from an earlier call, by
    native thread id); return what each had."""
    had: dict[int, bool] = {}  # each thread writes its own key, holding the GIL (ctypes takes it)

    def apply(_: int | None) -> None:  # the region's data pointer (none is passed)
        me = threading.get_native_id()
        had[me] = flushing()
        want = setting if isinstance(setting, bool) else setting.get(me, False)
        torch.set_flush_denormal(want)

    parallel = _gomp_parallel()
    if parallel is None or torch.get_num_threads() == 1:
        apply(None)
    else:
        callback = _CALLBACK(apply)  # kept alive until the region ends
        parallel(callback, None, torch.get_num_threads(), 0)
    return had


@functools.cache  # the runtime torch loaded stays loaded
def _gomp_parallel() -> Callable[[object, None, int, int], None] | None:
    """The OpenMP runtime's GOMP_parallel(fn, data, threads, flags) in this process (torch's own
    where several are loaded), or None (not Linux, or torch built without OpenMP)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    loaded = {line.split()[-1] for line in maps.read_text().splitlines() if len(line.split()) >= 6}
    runtimes = sorted((p for p in loaded if Path(p).name.startswith(_OPENMP_NAMES)),
                      key=lambda p: not p.startswith(str(Path(torch.__file__).parent)))
    for path in runtimes:
        try:
            fn = ctypes.CDLL(path).GOMP_parallel
        except (OSError, AttributeError):
            continue
        fn.argtypes = [_CALLBACK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        fn.restype = None
        return fn
    return None
