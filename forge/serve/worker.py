"""The one thread that runs model calls (create, forward_backward, optim_step, saves, samples,
release), and the futures the SDK polls for their results.

Calls queue in lanes, one per client session, taken round-robin: a client that queued a hundred
calls delays another client's next call by one call, not by a hundred. Within a lane calls run in
arrival order, which keeps every call on a model in its client's order (the SDK sends a call only
after the one before it was accepted). One thread keeps the accelerator busy with one call at a
time, so no two calls ever share a model's state half-way."""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import Future
from typing import Any, Callable

from forge.errors import ForgeError
from forge.serve.wire import failed

Reply = dict[str, Any] | bytes  # JSON, or a protobuf message's bytes
Call = Callable[[], Reply]
log = logging.getLogger("forge.serve")
KEEP = 4096  # finished futures kept for a client that asks again (a retried poll)


class Worker:
    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._lanes: OrderedDict[str, deque[tuple[str, str, Call]]] = OrderedDict()  # session -> its calls
        self._futures: OrderedDict[str, Future[Reply]] = OrderedDict()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="forge-serve-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the calls already queued, then end the thread."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, label: str, call: Call, lane: str = "") -> str:
        """Queue `call` in `lane` (its client's session); its request id, whose future holds the reply
        (or a RequestFailedResponse)."""
        request_id = str(uuid.uuid4())
        with self._ready:
            self._futures[request_id] = Future()
            self._forget_old()
            self._lanes.setdefault(lane, deque()).append((request_id, label, call))
            self._ready.notify()
        return request_id

    def future(self, request_id: str) -> Future[Reply] | None:
        with self._lock:
            return self._futures.get(request_id)

    def queued(self) -> dict[str, int]:
        """Calls waiting, per lane."""
        with self._lock:
            return {lane: len(calls) for lane, calls in self._lanes.items()}

    def _forget_old(self) -> None:
        extra = len(self._futures) - self.keep
        for rid in [r for r, f in self._futures.items() if f.done()][:max(extra, 0)]:
            del self._futures[rid]

    def _next(self) -> tuple[str, str, Call] | None:
        """The first lane's first call; that lane goes to the back (round-robin). None: stopped and drained."""
        with self._ready:
            while not self._lanes:
                if self._stopping:
                    return None
                self._ready.wait()
            lane, calls = next(iter(self._lanes.items()))
            item = calls.popleft()
            del self._lanes[lane]
            if calls:
                self._lanes[lane] = calls
            return item

    def _run(self) -> None:
        while (item := self._next()) is not None:
            request_id, label, call = item
            fut = self.future(request_id)
            if fut is None or not fut.set_running_or_notify_cancel():
                continue
            start = time.monotonic()
            fut.set_result(_reply(label, call))
            log.info("%s: %.2f s", label, time.monotonic() - start)


def _reply(label: str, call: Call) -> Reply:
    """The call's reply; a user's error (bad input found while running) or forge's own as a failed future."""
    try:
        return call()
    except ForgeError as e:
        return failed(str(e), "user")
    except Exception as e:  # a bug or the device (out of memory): the server goes on serving
        log.exception("%s failed", label)
        return failed(f"{type(e).__name__}: {e}", "server")
