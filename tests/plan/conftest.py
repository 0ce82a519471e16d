"""Keep planner tests away from the user's real hardware overrides and calibration store, and
run their tiny models single-threaded (threads only add contention on a shared small machine)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HARDWARE_FILE", str(tmp_path / "user-hardware.yaml"))
    monkeypatch.setenv("FORGE_CALIBRATION_DIR", str(tmp_path / "calibration"))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
