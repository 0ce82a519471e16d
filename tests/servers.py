"""Throwaway servers for end-to-end tests: a PostgreSQL cluster on 127.0.0.1 and `forge ui`.

Each helper skips the test with the reason when what it needs is absent (never a silent pass)."""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


@contextlib.contextmanager
def forge_ui(*args: str):
    """`forge ui ARGS --port <free>` in a child process; yields (process, printed URL, base URL).
    Stops it with Ctrl+C (SIGINT) at the end."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "ui", *args, "--port", str(port)], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip().startswith("http://"):
                break
        else:
            raise AssertionError("forge ui printed no URL:\n" + "".join(lines))
        yield proc, line.strip(), f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
