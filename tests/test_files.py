"""forge.files.atomic_dir: a folder is replaced whole, and a crash at any point of the replacement
leaves the old folder or the new one at its path, never none."""
from __future__ import annotations

import pytest

from forge import files


def _fill(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "w.txt").write_text(text)


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path):
    path = tmp_path / "ckpt"
    _fill(path, "old")
    with files.atomic_dir(path) as tmp:
        assert (path / "w.txt").read_text() == "old"  # readers see the old one while the new is written
        (tmp / "w.txt").write_text("new")
    assert (path / "w.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_error_while_writing_keeps_the_old_folder(tmp_path):
    path = tmp_path / "ckpt"
    _fill(path, "old")
    with pytest.raises(RuntimeError), files.atomic_dir(path) as tmp:
        (tmp / "w.txt").write_text("half")
        raise RuntimeError("disk gone")
    assert (path / "w.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_crash_right_after_the_swap_leaves_the_new_folder_in_place(tmp_path, monkeypatch):
    """The moment a two-rename replacement would leave no folder at the path: the swap is one step,
    so the path holds the new folder and only the temporary one (the old contents) is left over,
    which the next write of that path clears."""
    path = tmp_path / "ckpt"
    _fill(path, "old")

    swap = files._exchange

    def swapped_then_killed(*args):
        swap(*args)
        raise SystemExit("killed after the swap")

    monkeypatch.setattr(files, "_exchange", swapped_then_killed)
    with pytest.raises(SystemExit), files.atomic_dir(path) as tmp:
        (tmp / "w.txt").write_text("new")
    monkeypatch.undo()
    assert (path / "w.txt").read_text() == "new"
    with files.atomic_dir(path) as tmp:
        (tmp / "w.txt").write_text("newer")
    assert (path / "w.txt").read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
