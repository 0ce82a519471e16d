"""Throwaway servers for end-to-end tests: a PostgreSQL cluster on 127.0.0.1 and `forge ui`; and how
tests start and stop child processes (`spawn`: signals at their defaults whatever pytest inherited).

Each helper skips the test with the reason when what it needs is absent (never a silent pass)."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def json_server(answer):
    """An HTTP server on 127.0.0.1 that answers each POST with `answer(body, path)` as JSON; yields its
    base URL (http://127.0.0.1:PORT)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps(answer(body, self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL is not installed (.ci/run installs Debian's postgresql: apt-get install postgresql)")
    return Path(found[-1]).parent


@contextlib.contextmanager
def postgres_cluster():
    """A fresh cluster on 127.0.0.1:<free port> with trust auth; yields its SQLAlchemy URI."""
    pytest.importorskip("psycopg", reason="psycopg[binary] (the test extra) is needed for a postgresql:// store")
    bin_dir = _pg_bin()
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="forge-pg-"))
    if os.geteuid() == 0:  # postgres refuses to run as root: run it as the package's own user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(data, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    cluster = data / "cluster"

    def pg(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)

    done = pg(str(bin_dir / "initdb"), "-D", str(cluster), "-U", "mlflow", "--auth=trust", "-E", "UTF8")
    if done.returncode:
        shutil.rmtree(data, ignore_errors=True)
        pytest.fail(f"initdb failed: {done.stderr.strip()[-500:]}")
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off"
    started = pg(str(bin_dir / "pg_ctl"), "-D", str(cluster), "-o", opts, "-l", str(data / "pg.log"), "-w", "start")
    try:
        if started.returncode:
            log = (data / "pg.log").read_text() if (data / "pg.log").exists() else ""
            pytest.fail(f"pg_ctl start failed: {started.stderr.strip()[-300:]} {log[-500:]}")
        yield f"postgresql://mlflow@127.0.0.1:{port}/postgres"
    finally:
        pg(str(bin_dir / "pg_ctl"), "-D", str(cluster), "-m", "immediate", "stop")
        shutil.rmtree(data, ignore_errors=True)


def _default_signals() -> None:
    """In a child between fork and exec: the signals a test stops it with act by default, whatever
    this pytest inherited (a background job, `nohup ... &`, ignores SIGINT; nohup ignores SIGHUP)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **kw)` with SIGINT, SIGTERM and SIGHUP at their defaults in the child
    and no standard input (a background pytest may have none)."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(cmd, preexec_fn=_default_signals, **kw)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a child and everything under it (their process groups too, but never pytest's own),
    and wait for the child: for a test's `finally`, whatever state the child is in."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    kill_groups({g for p in tree if (g := _pgid(p.pid)) is not None})
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def group_members(groups: set[int]) -> list[psutil.Process]:
    """The live (not zombie) processes of these process groups, anywhere on the machine."""
    found = []
    for p in psutil.process_iter(["status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and _pgid(p.pid) in groups:
            found.append(p)
    return found


def kill_groups(groups: set[int]) -> None:
    """SIGKILL every process of these groups (never this pytest's own group)."""
    for g in groups - {os.getpgid(0)}:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (as servers bind: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def poll(ready, timeout: float, every: float = 0.2) -> bool:
    """Whether `ready()` came true within `timeout` seconds (asked every `every` s)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


@dataclass
class UI:
    """A `forge ui` child: the process, the URL it printed, its base URL and port, the server log
    it named, and the process groups of the processes it started (the MLflow server's)."""

    proc: subprocess.Popen
    url: str
    base: str
    port: int
    log: Path
    groups: set[int]
    output: list[str] = field(default_factory=list)


@contextlib.contextmanager
def forge_ui(*args: str, env: dict | None = None):
    """`forge ui ARGS --port <free>` in a child process, yielded as a `UI` once it printed its URL
    (the server answers /health then). At the end: Ctrl+C (SIGINT) if it still runs, SIGKILL after
    60 s, and SIGKILL to every process group it had started that still has a live process."""
    port = free_port()
    proc = spawn([sys.executable, "-m", "forge.cli", "ui", *args, "--port", str(port)], cwd=ROOT, text=True,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    groups: set[int] = set()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "server log: " in line:
                break
        else:
            raise AssertionError("forge ui printed no URL:\n" + "".join(lines))
        url = next(ln.strip() for ln in lines if ln.strip().startswith("http://"))
        log = Path(line.split("server log: ", 1)[1].strip().removesuffix(")"))
        groups = {g for c in psutil.Process(proc.pid).children(recursive=True) if (g := _pgid(c.pid)) is not None}
        yield UI(proc, url, f"http://127.0.0.1:{port}", port, log, groups, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if not poll(lambda: not group_members(groups), 30):
            kill_groups(groups)


# ------------------------------------------------------------------ what a test leaves behind
def adopt_orphans() -> None:
    """Linux: this pytest becomes a child subreaper, so a process whose parent a test killed stays
    its descendant (and is found by `end_leftovers`) instead of moving to init."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descendants() -> set[int]:
    """The pids of this process's descendants (adopted orphans included)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _reap(pids) -> None:
    """Collect the exit status of those of our children that are done (adopted orphans have no Popen)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _live(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def end_leftovers(before: set[int], grace: float = 10.0) -> list[str]:
    """Descendants not in `before` still alive after `grace` seconds: SIGKILL their process groups
    (never pytest's own group: there, the process alone) and describe each (pid, group, command)."""
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _reap(p.pid for p in new)
    left = _live(new)
    if left:
        _, alive = psutil.wait_procs(left, timeout=grace)
        _reap(p.pid for p in alive)
        left = _live(alive)
    described = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            described.append(f"pid {p.pid} (group {_pgid(p.pid)}): {' '.join(p.cmdline())[:200]}")
        group = _pgid(p.pid)
        with contextlib.suppress(OSError):
            if group is not None and group != os.getpgid(0):
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(p.pid, signal.SIGKILL)
    psutil.wait_procs(left, timeout=grace)
    _reap(p.pid for p in left)
    return described
