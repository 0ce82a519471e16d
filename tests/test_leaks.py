"""The leak check every test runs under (tests/conftest.py): a process a test left behind, even one
whose parent already exited (an orphan), is found among this pytest's descendants, named and killed."""
from __future__ import annotations

import subprocess

import psutil

from servers import descendants, end_leftovers, poll, spawn


def test_an_orphan_left_behind_is_named_and_killed():
    before = descendants()
    # a shell that starts `sleep` in a session of its own and exits: the sleep's parent is gone
    shell = spawn(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE, text=True,
                  start_new_session=True)
    orphan = int(shell.communicate(timeout=30)[0])
    assert poll(lambda: psutil.Process(orphan).ppid() != shell.pid, 30)
    left = end_leftovers(before, grace=1.0)
    assert len(left) == 1 and f"pid {orphan} " in left[0] and "sleep 300" in left[0]
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert end_leftovers(before, grace=1.0) == []


def test_nothing_left_is_nothing_reported():
    before = descendants()
    assert spawn(["true"]).wait(30) == 0
    assert end_leftovers(before, grace=1.0) == []
