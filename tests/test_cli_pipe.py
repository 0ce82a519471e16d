"""A reader that stops early (`forge catalog show X | head`) is not an error: forge exits 0 and
prints nothing about a broken pipe."""
from __future__ import annotations

import io
import sys

from forge.cli import main


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["catalog", "list"]) == 0
    assert "pipe" not in capsys.readouterr().err.lower()
