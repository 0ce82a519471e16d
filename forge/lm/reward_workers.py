"""Python reward functions run in worker processes that forge can kill.

A `RewardWorker` is one child process (`python -c`, its own session) that loads a `file.py:function` / `module:function`
reward by its source string (forge.usercode) and calls it on request; the arguments cross its
stdin as forge's own plain lists and dicts, and the answer comes back as JSON (numpy values are
turned into Python numbers, other objects into an `Opaque` description), so forge never unpickles
what user code produced. A contract that calls a function as a Lambda handler
(`lambda_handler(event, context)`: Nova's, forge.lm.nova_reward) has it called with the event and a
local context through `call_event`, its answer kept as JSON-like values. A call has a wall-clock deadline: past it the worker is
killed (SIGKILL, its process group with it) and the next call starts a fresh one. A worker that
exits (`sys.exit`, `os._exit`), crashes or sends an oversized answer fails the call with a
`WorkerFailed` saying what happened. The worker ignores SIGINT (forge decides when it ends) and
ends itself when forge's process goes away.

`interruptible()` lets SIGINT/SIGTERM end a wait on a reward (Python or HTTP) at once: forge's own
handler runs first (the training loop's graceful stop records the request; a second signal stops
at once as usual), then the wait raises `Interrupted`.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import multiprocessing.connection as mpc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

from forge.errors import ForgeError
from forge.lm.nova_reward import LocalContext
from forge.usercode import load_function

START_TIMEOUT_S = 120.0  # importing the reward's module in a fresh worker (not part of a call's timeout_s)
MAX_ANSWER_BYTES = 256 * 2**20  # a larger answer fails the call (the worker is ended)


class WorkerFailed(Exception):
    """The call failed; the message says how (the caller prefixes the source and the batch)."""


class WorkerTimeout(WorkerFailed):
    """No answer before the deadline; the worker was killed."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while forge waited on a reward."""


class Opaque:
    """An answer (or one item of it) that is not a plain value, described by its type and repr."""

    def __init__(self, value: object):
        self.type_name, self.text = type(value).__name__, repr(value)[:80]

    def __repr__(self) -> str:
        return self.text


def _reply(send: mpc.Connection, kind: str, value: object) -> None:
    """An answer to forge, as JSON (Opaque items as {"__opaque__": [type, repr]})."""
    def encode(o: object) -> object:
        if isinstance(o, Opaque):
            return {"__opaque__": [o.type_name, o.text]}
        raise TypeError(type(o).__name__)
    send.send_bytes(json.dumps([kind, value], default=encode).encode())


def _opaque(d: dict[str, Any]) -> object:
    if set(d) == {"__opaque__"}:
        item = Opaque(None)
        item.type_name, item.text = d["__opaque__"]
        return item
    return d


def plain(value: object) -> object:
    """What a reward's answer crosses the pipe as: lists of numbers, strings, None; numpy arrays and
    scalars through tolist()/item() (numpy.bool_ becomes bool, which is not a score)."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain_item(v) for v in value]
    return _plain_item(value)


def plain_json(value: object, depth: int = 0) -> object:
    """A Nova answer as JSON-like values: dicts with text keys, lists, numbers, text, None (numpy
    through tolist()/item()); anything else an Opaque, which the contract check then names."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        value = value.tolist()
    if depth > 32:
        return Opaque(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: plain_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, depth + 1) for v in value]
    return _plain_item(value)


def _plain_item(v: object) -> object:
    if type(v).__module__ == "numpy" and hasattr(v, "item"):
        try:
            v = v.item()
        except ValueError:  # an array inside the list
            return Opaque(v)
    return v if v is None or isinstance(v, (bool, int, float, str)) else Opaque(v)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """In the main thread: SIGINT/SIGTERM run the handler they had, then raise `Interrupted`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handle(signum: int, frame: FrameType | None) -> None:
        before = previous.get(signum)
        if before == signal.SIG_IGN:
            return
        if callable(before):
            before(signum, frame)  # may raise (a second signal's stop at once, KeyboardInterrupt)
        elif signum == signal.SIGTERM:  # the default action: end the process (through Python, so runs end)
            raise SystemExit(128 + signum)
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class RewardWorker:
    """One worker process for one Python reward source; started at once (a bad source fails here)."""

    def __init__(self, source: str, root: str | None):
        self.source, self.root = source, root
        self._proc: subprocess.Popen[bytes] | None = None
        self._conns: tuple[mpc.Connection, mpc.Connection] | None = None  # (to the worker, from it)
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self.start()

    def start(self) -> None:
        # its own session: a terminal's Ctrl-C does not reach it, and killing its group ends its children
        proc = subprocess.Popen([sys.executable, "-c", "from forge.lm.reward_workers import main; main()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        conns = (mpc.Connection(os.dup(proc.stdin.fileno()), readable=False),
                 mpc.Connection(os.dup(proc.stdout.fileno()), writable=False))
        proc.stdin.close()
        proc.stdout.close()
        self._proc, self._conns = proc, conns
        self._finalizer = weakref.finalize(self, _kill, proc, conns)  # a forgotten worker is ended too
        try:
            conns[0].send((self.source, self.root, list(sys.path), os.getpid()))
            kind, value = self._receive(time.monotonic() + START_TIMEOUT_S)
        except WorkerTimeout:
            raise ForgeError(f"reward {self.source!r}: loading it took longer than {START_TIMEOUT_S:g}s") from None
        except (WorkerFailed, OSError) as e:
            self.close()
            raise ForgeError(f"reward {self.source!r}: loading it failed: {e}") from None
        except BaseException:
            self.close()
            raise
        if kind != "ready":
            self.close()
            raise ForgeError(str(value))

    def call(self, prompts: list[str], completions: list[str], fields: dict[str, list[Any]],
             timeout_s: float) -> object:
        """The function's answer (plain values); WorkerFailed / WorkerTimeout / Interrupted otherwise."""
        return self._request((prompts, completions, fields), timeout_s)

    def _request(self, request: tuple[Any, ...], timeout_s: float) -> object:
        deadline = time.monotonic() + timeout_s
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self.start()
        assert self._conns is not None
        try:
            self._conns[0].send(request)
            kind, value = self._receive(deadline)
        except OSError:  # the pipe broke: the worker is gone
            death = self._death()
            self.close()
            raise WorkerFailed(death) from None
        except BaseException:  # the deadline, a signal, a dead worker: the worker goes
            self.close()
            raise
        if kind == "exit":
            self.close()
            raise WorkerFailed(str(value))
        if kind == "raised":
            raise WorkerFailed(f"raised {value}")
        if kind == "unsendable":
            raise WorkerFailed(f"its answer cannot be sent back as JSON: {value}")
        return value

    def call_event(self, event: list[dict[str, Any]], timeout_s: float) -> object:
        """A Lambda-style handler's answer to `event` (JSON-like values); as `call` otherwise."""
        return self._request(("event", event, timeout_s), timeout_s)

    def _receive(self, deadline: float) -> tuple[str, object]:
        assert self._conns is not None and self._proc is not None
        conn, proc = self._conns[1], self._proc
        with interruptible():
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    raise WorkerTimeout("no answer in time")
                if conn.poll(min(left, 1.0)):
                    try:
                        data = conn.recv_bytes(MAX_ANSWER_BYTES)
                    except EOFError:
                        raise WorkerFailed(self._death()) from None
                    except OSError:
                        self.close()
                        raise WorkerFailed(f"its answer is over {MAX_ANSWER_BYTES // 2**20} MiB") from None
                    kind, value = json.loads(data, object_hook=_opaque)
                    return str(kind), value
                if proc.poll() is not None:
                    raise WorkerFailed(self._death())

    def _death(self) -> str:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(5)
        if code is None:
            return "its worker process stopped answering"
        if code < 0:
            return f"its worker process died of {signal.Signals(-code).name} (a crash, or killed)"
        return f"its worker process exited with status {code} (sys.exit or os._exit in the reward?)"

    def close(self) -> None:
        """End the worker (SIGKILL, with its process group); the next call starts a new one."""
        if self._finalizer is not None:
            self._finalizer()  # runs _kill once


def _kill(proc: subprocess.Popen[bytes], conns: tuple[mpc.Connection, mpc.Connection]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own group: its children go too
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    for conn in conns:
        conn.close()


# ----------------------------------------------------------------------------- in the worker
def main() -> None:
    """The worker process: the protocol runs over its stdin/stdout, which the reward cannot touch
    (its prints go to stderr); load the function, then answer (prompts, completions, fields)."""
    recv = mpc.Connection(os.dup(0), writable=False)
    send = mpc.Connection(os.dup(1), readable=False)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # forge decides when the worker ends
    source, root, path, parent = recv.recv()
    sys.path[:] = path
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    serve(recv, send, source, root)


def serve(recv: mpc.Connection, send: mpc.Connection, source: str, root: str | None) -> None:
    try:
        fn = load_function(source, None if root is None else Path(root), "reward")
    except ForgeError as e:
        _reply(send, "error", str(e))
        return
    _reply(send, "ready", None)
    while True:
        try:
            request = recv.recv()
        except (EOFError, OSError):
            return
        handler = request[0] == "event"
        try:
            if handler:  # a Lambda handler's signature: lambda_handler(event, context)
                answer = fn(request[1], LocalContext(source.rpartition(":")[2], request[2]))
            else:
                prompts, completions, fields = request
                answer = fn(prompts, completions, **fields)
            if inspect.isawaitable(answer):
                answer = asyncio.run(_awaited(answer))
            reply: tuple[str, object] = ("ok", plain_json(answer) if handler else plain(answer))
        except SystemExit as e:
            _reply(send, "exit", f"the reward called sys.exit({e.code!r})")
            return
        except Exception as e:
            reply = ("raised", f"{type(e).__name__}: {e}")
        try:
            _reply(send, *reply)
        except ValueError as e:  # JSON cannot write it: an integer of over 4300 digits (sys.int_info)
            _reply(send, "unsendable", str(e).split(";")[0][:200])


async def _awaited(answer: Any) -> object:
    return await answer


def _orphan_watch(parent: int) -> None:
    """End the worker when forge's process is gone (killed without a chance to end it)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)
