"""Data preparation on a Ray cluster (`prepare: {engine: ray}`): a phase's shard tasks run as Ray tasks
calling the same per-shard functions the local worker processes call, their results taken in task
order, so the output is the local path's byte for byte. Ray is an optional extra, imported only here.
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from typing import Any, Callable, Iterable, Iterator

from forge.data.hygiene import ConfigError
from forge.errors import ForgeError

INSTALL = "pip install 'forge[ray]'"
_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}")


def valid_address(address: str) -> bool:
    """auto, ray://HOST:PORT (Ray Client) or HOST:PORT (the head's GCS)."""
    return address == "auto" or _ADDRESS.fullmatch(address) is not None


def installed() -> bool:
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def check_installed() -> None:
    if not installed():
        raise ConfigError(f"prepare.engine: ray needs Ray, which is not installed here: {INSTALL}")


def _run(fn: Callable[[Any], Any], task: Any) -> Any:
    """One shard task on a cluster node: one thread, as in a local worker (the workers are the parallelism)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return fn(task)


def _check_reachable(address: str, seconds: float = 5.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) that nothing answers on is a one-line error now: ray.init would
    retry it for minutes. `auto` is left to Ray (it reads RAY_ADDRESS or the local cluster's files)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except OSError as e:
        raise ForgeError(f"prepare.ray.address: nothing answers at {address!r} ({e.strerror or e}); "
                         "start the cluster (ray start --head) or fix the address") from None


class RayTasks:
    """Runs `fn` over tasks as Ray tasks (one CPU each) on the cluster at `address`, connecting on
    first use; at most 2 tasks a cluster CPU in flight, results in task order. The tasks read and
    write the paths they name, so every node must see the data and the run folder (a shared
    filesystem, as a training cluster has) and have forge installed."""

    def __init__(self, address: str):
        self.address = address
        self._ray: Any = None
        self._remote: Any = None
        self._connected = False

    def _connect(self) -> Any:
        if self._ray is None:
            try:
                import ray
            except Exception as e:  # a broken install fails in its own way: a dependency missing or too new
                if not installed():
                    raise ForgeError(f"prepare.engine: ray needs Ray, which is not installed here: {INSTALL}") from None
                first = (str(e).strip().splitlines() or [""])[0][:200]
                raise ForgeError(f"prepare.engine: ray: Ray is installed but importing it failed "
                                 f"({type(e).__name__}: {first}); reinstall it ({INSTALL}) or use engine: local"
                                 ) from None
            if not ray.is_initialized():
                _check_reachable(self.address)
                try:
                    ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ForgeError(f"prepare.ray.address: cannot reach a Ray cluster at {self.address!r} "
                                     f"({first})") from None
                self._connected = True
            self._ray, self._remote = ray, ray.remote(num_cpus=1)(_run)
        return self._ray

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        ray = self._connect()
        limit = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        queue: list[Any] = []
        try:
            for task in tasks:
                queue.append(self._remote.remote(fn, task))
                if len(queue) >= limit:
                    yield self._get(queue.pop(0))
            while queue:
                yield self._get(queue.pop(0))
        finally:
            for ref in queue:  # a failed or abandoned phase: its other tasks need not run on
                ray.cancel(ref)

    def _get(self, ref: Any) -> Any:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as e:  # the task's own error, as the local pool raises it
            cause = getattr(e, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def close(self) -> None:
        if self._connected:
            self._ray.shutdown()
            self._connected = False
        self._ray = self._remote = None
