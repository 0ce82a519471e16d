"""`forge ui`: one-line refusals (no store, port in use), and a real start / health / Ctrl+C stop."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from forge import cli

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_missing_store_is_one_line(tmp_path, capsys):
    assert cli.main(["ui", "--output", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forge: error: no MLflow store at ") and "\n" not in err and "forge run" in err


def test_port_in_use_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--output", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"forge: error: port {port} on 127.0.0.1 is in use") and "\n" not in err


def test_needs_exactly_one_store(capsys):
    assert cli.main(["ui"]) == 2
    assert "exactly one of RECIPE, --output DIR or --tracking-uri URI" in capsys.readouterr().err


def start_ui(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`forge ui ARGS` in a child process; returns it and the URL it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "forge.cli", "ui", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip().startswith("http://"):
            return proc, line.strip()
    raise AssertionError("forge ui printed no URL:\n" + "".join(lines))


def stop_ui(proc: subprocess.Popen) -> list[psutil.Process]:
    """Ctrl+C; returns the processes it had started that are still alive (none, if clean)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "forge ui started no server"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert "stopping the MLflow UI" in proc.stdout.read()
    gone, alive = psutil.wait_procs(children, timeout=10)
    return alive


@pytest.mark.slow
def test_start_health_url_and_clean_stop(tmp_path):
    from forge.track import MlflowTracker as Tracker

    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "tiny")  # a store with one experiment
    port = free_port()
    proc, url = start_ui(["--output", str(tmp_path), "--port", str(port)])
    try:
        assert url.startswith(f"http://127.0.0.1:{port}/#/experiments/") and url.endswith("?workflowType=machine_learning")
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read() == b"OK"
    finally:
        alive = stop_ui(proc)
    assert alive == []
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
