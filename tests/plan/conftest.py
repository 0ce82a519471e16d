"""Run the planner tests' tiny models single-threaded (the root conftest keeps them away from the
user's hardware overrides and calibration store) (threads only add contention on a shared small machine)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
