"""Data preparation beyond one core: the recipe's `prepare:` settings, the engine that runs a phase's
tasks in worker processes (spawned, so safe beside torch and threads), and how a source is cut into
shards. What the phases produce does not depend on where the shards are cut, so neither on the number
of workers (tests/data/test_parallel_prep.py).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context, resource_tracker
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import ConfigDict

from forge.data import ray_engine
from forge.data.hygiene import ConfigError
from forge.data.objstore import is_remote
from forge.data.sources import Source
from forge.progress import QUIET_S, progress, say

SHARD_BYTES = 32 << 20  # a shard of a JSONL file: ~30k records, its signatures ~15 MB in a worker
BATCH_CHARS = 8 << 20   # a shard of records the parent reads (formats that cannot be split by bytes)


@dataclass(frozen=True)
class RayConfig:
    """`prepare: {engine: ray, ray: {address}}`: the cluster to run on."""

    __pydantic_config__ = ConfigDict(extra="forbid")
    address: str = "auto"  # auto (RAY_ADDRESS or the cluster this node belongs to), ray://HOST:PORT or HOST:PORT

    def __post_init__(self) -> None:
        if not ray_engine.valid_address(self.address):
            raise ConfigError(f"prepare.ray.address: expected auto, ray://HOST:PORT or HOST:PORT (got {self.address!r})")


@dataclass(frozen=True)
class PrepareConfig:
    """The recipe's top-level `prepare:` section: how data preparation (reading, PII/secret redaction,
    dedup, tokenization) runs. Not under `data:`, whose keys are the names of sources."""

    __pydantic_config__ = ConfigDict(extra="forbid")
    workers: int | None = None  # worker processes; None: the cores this process may use
    engine: Literal["local", "ray"] = "local"  # ray: the shard tasks as Ray tasks on a cluster (forge.data.ray_engine)
    ray: RayConfig | None = None  # engine: ray only (default: address auto)
    cache: str | None = None  # s3://bucket/prefix (or gs://, az://): the cleaned cache shared by every node

    def __post_init__(self) -> None:
        if self.engine == "ray":
            ray_engine.check_installed()
            if self.ray is None:
                object.__setattr__(self, "ray", RayConfig())
        elif self.ray is not None:
            raise ConfigError("prepare.ray: only with prepare.engine: ray (got engine: local)")
        if self.workers is not None and not 1 <= self.workers <= 4096:
            raise ConfigError(f"prepare.workers: must be between 1 and 4096 (got {self.workers!r})")
        if self.cache is not None and not is_remote(self.cache):
            raise ConfigError(f"prepare.cache: must be an object-store prefix such as s3://bucket/prefix "
                              f"(got {self.cache!r}); the local cache is always OUTPUT/data")

    @property
    def processes(self) -> int:
        return self.workers or available_cores()


_ENGINE = PrepareConfig()  # how this process prepares data: the recipe's `prepare:` (use_engine)


def use_engine(prepare: PrepareConfig) -> None:
    """Prepare data in this process as `prepare` says (its engine), until told otherwise: every Engine
    made without its own settings, the token caches' too, runs its tasks there."""
    global _ENGINE
    _ENGINE = prepare


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _quiet_worker() -> None:
    # one thread a worker: the workers are the parallelism (a Rust tokenizer would start its own pool)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While workers start: a spawned process would otherwise run the caller's script again (its
    `__main__` by path) before taking a task, which every task here, a function of forge, never needs."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class Engine:
    """Runs `fn` over tasks in `workers` spawned processes (in this one when 1), results in task
    order; each phase says what it does and, while it runs, how far it is, at what rate and when it
    should end. A context manager: the processes start on first use and end with the block. Spawned,
    not forked (safe beside torch's and the tokenizers' threads); if they cannot start or die, the
    phase runs here instead, and says so. With `prepare.engine: ray` the tasks run as Ray tasks on
    the cluster instead (forge.data.ray_engine), the same functions, results in the same order."""

    def __init__(self, workers: int, prepare: PrepareConfig | None = None):
        self.workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._tracker_started = False
        ray = (prepare or _ENGINE).ray
        self._ray = ray_engine.RayTasks(ray.address) if ray is not None else None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ray is not None:
            self._ray.close()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            if self._tracker_started:  # the semaphore tracker spawning started: leave none behind
                resource_tracker._resource_tracker._stop()

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any], desc: str, total: int,
            count: Callable[[Any], int] | None = None) -> Iterator[Any]:
        """`fn(task)` for each task, in order (here when `total`, the tasks expected, is 1); at most 2
        tasks a worker in flight (memory stays bounded when tasks carry records). `count(result)`: the
        records a result stands for (the rate shown)."""
        bar = progress(total, desc, unit="shard", seconds=10.0, every=max(1, -(-total // 10)), after=QUIET_S)
        bar.update(0)
        started, records = time.monotonic(), 0

        def done(result: Any) -> Any:
            nonlocal records
            if count is not None:
                records += count(result)
                bar.set_postfix(**{"records/s": f"{records / max(1e-9, time.monotonic() - started):,.0f}"})
            bar.update(1)
            return result

        try:
            if total <= 1 or (self.workers == 1 and self._ray is None):  # one task: no process to start for it
                for task in tasks:
                    yield done(fn(task))
                return
            if self._ray is not None:
                for result in self._ray.map(fn, tasks):
                    yield done(result)
                return
            queue: list[tuple[Any, Future]] = []
            for task in tasks:
                queue.append((task, self._submit(fn, task)))
                if len(queue) >= 2 * self.workers:
                    yield done(self._result(fn, *queue.pop(0)))
            while queue:
                yield done(self._result(fn, *queue.pop(0)))
        finally:
            bar.close()

    def _submit(self, fn: Callable[[Any], Any], task: Any) -> Future | None:
        if self._pool is None and self.workers > 1:
            self._tracker_started = resource_tracker._resource_tracker._fd is None
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=_quiet_worker)
        if self._pool is None:
            return None
        try:
            with _main_hidden():  # a worker starts inside submit; it needs forge's modules only
                return self._pool.submit(fn, task)
        except BrokenProcessPool:
            return None

    def _result(self, fn: Callable[[Any], Any], task: Any, future: Future | None) -> Any:
        if future is not None:
            try:
                return future.result()
            except BrokenProcessPool:
                pass
        if self.workers > 1:
            say("data: the worker processes could not start or died; preparing in this process")
            self.workers = 1
            self.__exit__()
        return fn(task)


# ------------------------------------------------------------------------------------- shards
@dataclass(frozen=True)
class Shard:
    """Part of a source: the lines starting in bytes [start, end) of one JSONL file, read by the
    worker itself, or records the parent read (`records`, already numbered)."""

    source: Source
    index: int  # its position among the source's shards
    path: Path | None = None
    start: int = 0
    end: int = 0
    first_line: int = 1
    records: tuple[tuple[int, str], ...] | None = None

    def items(self) -> Iterator[tuple[Path | str, int, Any]]:
        """(path, line, item) for a byte range: the worker converts each to text itself."""
        assert self.path is not None
        for line, item in self.source.range_items(self.path, self.start, self.end, self.first_line):
            yield self.path, line, item


def file_shards(source: Source, workers: int = 1) -> list[Shard]:
    """A splittable source's byte-range shards, cut at line starts: at most SHARD_BYTES each, and
    for a small file at least 4 a worker (of 1 MB or more), so that every worker has work."""
    shards: list[Shard] = []
    for path in source.files:
        size = path.stat().st_size
        n = shard_count(size, workers)
        cuts = [0]
        with open(path, "rb") as f:
            for k in range(1, n):
                f.seek(k * size // n)
                f.readline()
                if cuts[-1] < f.tell() < size:
                    cuts.append(f.tell())
        cuts.append(size)
        lines = _line_numbers(path, cuts[:-1])
        shards += [Shard(source, len(shards) + i, path, a, b, line)
                   for i, (a, b, line) in enumerate(zip(cuts, cuts[1:], lines))]
    return shards


def shard_count(size: int, workers: int) -> int:
    """How many byte-range shards a file of `size` bytes is cut into (see file_shards)."""
    return max(1, math.ceil(size / SHARD_BYTES), min(4 * workers, size >> 20))


def _line_numbers(path: Path, offsets: list[int]) -> list[int]:
    """The line number at each byte offset (each a line start), from one pass counting newlines."""
    out, n, pos = [], 0, 0
    with open(path, "rb") as f:
        for off in offsets:
            while pos < off:
                chunk = f.read(min(1 << 24, off - pos))
                n, pos = n + chunk.count(b"\n"), pos + len(chunk)
            out.append(n + 1)
    return out


def record_shards(source: Source) -> Iterator[Shard]:
    """Shards of records read here (a format that cannot be split by bytes, or a budgeted source):
    BATCH_CHARS of text each, in order."""
    batch: list[tuple[int, str]] = []
    chars, index = 0, 0
    for number, text in source.records():
        batch.append((number, text))
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield Shard(source, index, records=tuple(batch))
            batch, chars, index = [], 0, index + 1
    if batch or index == 0:
        yield Shard(source, index, records=tuple(batch))


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: its own, unlike ru_maxrss, which a spawned
    process inherits from the one that forked it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
