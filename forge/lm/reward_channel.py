"""What the rows of forge.recipe.reward_table name: a transport builds a `Channel` (it carries a
contract's payload to one source and brings back the raw answer), a contract is a `ContractCode`
(the payload a call sends and how an answer becomes scores). forge.lm.rewards joins the two; the
errors they raise, one call's inputs and the chunked calls of the remote transports live here.
"""
from __future__ import annotations

import concurrent.futures as cf
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from forge.errors import ForgeError
from forge.lm.reward_workers import interruptible

Fields = dict[str, list[Any]]  # the prompt rows' other columns, one list per column
Chunk = Any  # one request's payload: a part of a contract's payload
Metrics = dict[str, list[float | None]]  # a contract's figures beside the score, by name, one entry per completion


class RewardError(ForgeError):
    """A reward source failed; the message names the source and the batch."""


class RewardStopped(RewardError):
    """SIGINT/SIGTERM arrived while a reward ran: the call was abandoned (its worker ended)."""

    stopped_on_request = True  # forge.track ends the runs KILLED, not FAILED


@dataclass(frozen=True)
class Call:
    """One call's inputs: completions[i] answers prompts[i] (its chat messages: messages[i]), with
    fields[k][i] from the prompt's row; `batch` names the call in errors and sample ids."""

    prompts: list[str]
    completions: list[str]
    fields: Fields
    batch: int
    messages: list[list[dict[str, Any]]]


@dataclass(frozen=True)
class Setup:
    """What a transport is built with beside its spec: a Python file's folder, a boto3 client to use
    (tests pass a stubbed one: a Lambda's, or a judge's Bedrock client) and a judge's verdict cache."""

    root: Path | None = None
    client: Any = None
    cache_dir: Path | None = None


class ContractCode(Protocol):
    """A contract: what a reward function receives and returns. `calls` is how a Python function is
    called with the payload (forge.lm.reward_workers): "fields", fn(prompts, completions, **fields)
    with the payload (prompts, completions, fields), or "event", fn(event, context) as a Lambda handler."""

    calls: str

    def payload(self, call: Call) -> Any:
        """What the source receives for one call."""

    def split(self, payload: Any, n: int) -> list[Chunk]:
        """The payload in requests of at most n completions (the remote transports')."""

    def size(self, chunk: Chunk) -> int:
        """The completions one request carries (its answer must hold as many)."""

    def unwrap(self, answer: object) -> object:
        """One request's answer, ready to be joined to the others'."""

    def scores(self, answer: object, payload: Any, where: str) -> tuple[list[float], Metrics]:
        """The scores in the answer and the contract's other figures; a RewardError naming `where` and
        what is wrong otherwise."""


class Channel(Protocol):
    """A transport built for one source: `send` returns the source's raw answer to a contract's
    payload (raising what it must: forge.lm.rewards names the source and the batch in every failure),
    `close` ends what it holds (a worker process, a cache)."""

    def send(self, payload: Any, contract: ContractCode, where: str) -> object: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------- the remote transports' calls
class Deadline:
    """One call's wall-clock deadline. The sockets of its requests are registered; at the deadline
    (a timer) or on abort() they are shut down, which ends any read blocked on them."""

    def __init__(self, seconds: float):
        self.end, self.aborted = time.monotonic() + seconds, False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self.abort)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return self.end - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.add(sock)
            if not self.aborted:
                return
        shut(sock)

    def abort(self) -> None:
        self._timer.cancel()
        with self._lock:
            self.aborted, socks = True, list(self._socks)
        for sock in socks:
            shut(sock)


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@dataclass(frozen=True)
class Chunked:
    """A payload sent as requests: the contract's chunks, at most `concurrency` in flight."""

    contract: ContractCode
    chunks: list[Chunk]
    concurrency: int


def map_chunks(call: Callable[[Chunk], object], sent: Chunked, deadline: Deadline) -> object:
    """Each chunk's answer, unwrapped and joined; TimeoutError when they are not all in by the deadline
    (the connections still open are then shut, so no thread outlives the call for long). An answer
    that is not a list of the chunk's size is returned as it is, for the contract to name."""
    pool = cf.ThreadPoolExecutor(sent.concurrency, thread_name_prefix="forge-reward")
    futures = [pool.submit(call, chunk) for chunk in sent.chunks]
    try:
        with interruptible():
            done, pending = cf.wait(futures, timeout=max(0.0, deadline.left()))
        if pending:
            raise TimeoutError
        parts = [sent.contract.unwrap(f.result()) for f in futures]
    finally:
        deadline.abort()
        pool.shutdown(wait=False, cancel_futures=True)
    out: list[object] = []
    for chunk, part in zip(sent.chunks, parts):
        if not isinstance(part, list) or len(part) != sent.contract.size(chunk):
            return part if not isinstance(part, list) else out + part
        out += part
    return out
