"""`forge ui`: one-line refusals (no store, port in use), a real start / health / Ctrl+C stop, and the
server going with forge ui however forge ui ends (SIGKILL, SIGHUP)."""
from __future__ import annotations

import signal
import socket
import urllib.request
from pathlib import Path

import pytest

from forge import cli
from servers import forge_ui, group_members, poll, port_free


def test_missing_store_is_one_line(tmp_path, capsys):
    assert cli.main(["ui", "--output", str(tmp_path / "nowhere")]) == 2
    err = _error(capsys)
    assert err.startswith("forge: error: no MLflow store at ") and "forge run" in err


def test_port_in_use_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--output", str(tmp_path), "--port", str(port)]) == 2
    assert _error(capsys).startswith(f"forge: error: port {port} on 127.0.0.1 is in use")


def _error(capsys) -> str:
    """The refusal: one line, the last on stderr (after at most the command's first progress line)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[-1].startswith("forge: error: ") and "Traceback" not in "".join(lines), lines
    return lines[-1]


def test_needs_exactly_one_store(capsys):
    assert cli.main(["ui"]) == 2
    assert "exactly one of RECIPE, --output DIR or --tracking-uri URI" in capsys.readouterr().err


def _store(folder: Path) -> None:
    from forge.track import MlflowTracker as Tracker

    Tracker(f"sqlite:///{folder / 'mlflow.db'}", "tiny")  # a store with one experiment


@pytest.mark.slow
def test_start_health_url_and_clean_stop(tmp_path):
    _store(tmp_path)
    with forge_ui("--output", str(tmp_path)) as ui:
        assert ui.url.startswith(f"{ui.base}/#/experiments/") and ui.url.endswith("?workflowType=machine_learning")
        assert urllib.request.urlopen(f"{ui.base}/health", timeout=10).read() == b"OK"
        assert ui.groups and ui.log.is_file()
        # a viewer: MLflow's job runner and its workers are not started beside the server
        assert not [p for p in group_members(ui.groups) if "mlflow.server.jobs" in " ".join(p.cmdline())]
        ui.proc.send_signal(signal.SIGINT)  # Ctrl+C (forge_ui set SIGINT to its default in the child)
        assert ui.proc.wait(60) == 0
        assert "stopping the MLflow UI" in ui.proc.stdout.read()
        # everything it started is gone when it returns, the port is free and the log removed
        assert group_members(ui.groups) == []
        assert port_free(ui.port) and not ui.log.parent.exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{ui.base}/health", timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_server_goes_with_forge_ui(tmp_path, sig):
    """Killed (SIGKILL: nothing runs in forge ui) or hung up on (SIGHUP: a closed terminal), forge ui
    takes the MLflow server's whole process group with it, frees the port and removes its log."""
    _store(tmp_path)
    with forge_ui("--output", str(tmp_path)) as ui:
        assert ui.groups and ui.log.is_file()
        ui.proc.send_signal(sig)
        ui.proc.wait(60)
        gone = poll(lambda: not group_members(ui.groups) and port_free(ui.port) and not ui.log.parent.exists(), 120)
        assert gone, (f"left: {[p.cmdline() for p in group_members(ui.groups)]}, port free: {port_free(ui.port)}, "
                      f"log folder there: {ui.log.parent.exists()}")
