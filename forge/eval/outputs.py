"""Where `forge eval --json/--markdown/--chart` may write, and how: a new file in a folder that
exists, or a report forge eval wrote before (known by its content), or any file with --overwrite;
never a folder, a symbolic link, a run folder, a Novella or anything inside them, or the models
being compared. Each report is written whole to a temporary file beside it and renamed over it,
so an interrupted write leaves the old file as it was."""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from forge.errors import ForgeError
from forge.rundir import LOCK, RUN

NOVELLA_MARK = "lineage.json"  # every Novella holds its lineage (forge.eval.finish writes it)
MARKDOWN_MARK = "<!-- written by forge eval -->"  # invisible when the Markdown is rendered
PNG_SOFTWARE = "forge eval"  # the chart's PNG `Software` text chunk


def _is_json_report(head: bytes) -> bool:
    from forge.eval.suite import SCHEMA

    try:
        data = json.loads(head)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def _is_markdown_report(head: bytes) -> bool:
    return MARKDOWN_MARK.encode() in head


def _is_png_report(head: bytes) -> bool:
    return head.startswith(b"\x89PNG") and b"Software\x00" + PNG_SOFTWARE.encode() in head


# what each option writes, and how forge recognises a file it wrote there before
KINDS: dict[str, Callable[[bytes], bool]] = {"--json": _is_json_report, "--markdown": _is_markdown_report,
                                             "--chart": _is_png_report}
MAX_REPORT = 16 << 20  # forge's reports are far smaller; a bigger file is not one of them


def check_reports(wanted: dict[str, str | None], models: Iterable[Path], overwrite: bool) -> dict[str, Path]:
    """{option: path} for each report asked for, each checked by `check_report`; one file named by
    two options is refused (the second would replace the first)."""
    found: dict[str, Path] = {}
    for flag, given in wanted.items():
        if not given:
            continue
        path = check_report(flag, given, models, overwrite)
        twice = next((f for f, p in found.items() if p == path), None)
        if twice:
            raise ForgeError(f"{flag} {given}: the same file as {twice}; give each report its own file")
        found[flag] = path
    return found


def check_report(flag: str, given: str, models: Iterable[Path] = (), overwrite: bool = False) -> Path:
    """The path to write `flag`'s report to (its folder resolved), or a ForgeError naming why not."""
    say = f"{flag} {given}"
    path = Path(given)
    if path.is_symlink():
        raise ForgeError(f"{say}: a symbolic link (to {os.readlink(path)}); name the file itself")
    folder = path.parent.resolve()
    above = next(p for p in (folder, *folder.parents) if p.exists())
    if not above.is_dir():
        raise ForgeError(f"{say}: {above} is a file, not a folder")
    if above != folder:
        missing = next(p for p in (folder, *folder.parents) if p.parent == above)
        raise ForgeError(f"{say}: the folder {missing} does not exist; create it first")
    real = folder / path.name
    for inside in (real, *real.parents):  # the innermost one is named: a Novella inside a run folder
        for marks, what in (((NOVELLA_MARK,), "the Novella"), ((RUN, LOCK), "the forge run folder")):
            if any(_exists(inside / m) for m in marks):
                raise ForgeError(f"{say}: inside {what} {inside}; write reports to a folder outside it")
    for model in models:
        model = Path(model).resolve()
        if real == model or real.is_relative_to(model):
            raise ForgeError(f"{say}: inside the model folder {model} being evaluated; write reports elsewhere")
    if not real.exists():
        return real
    if real.is_dir():
        raise ForgeError(f"{say}: a folder, not a file; name a file for the report")
    if not stat.S_ISREG(real.stat().st_mode):
        raise ForgeError(f"{say}: not a regular file; name a file for the report")
    if not overwrite and not _written_by_forge(flag, real):
        raise ForgeError(f"{say}: a file forge eval did not write; name a new file, or add --overwrite to replace it")
    return real


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # unreadable: not a marker forge can see
        return False


def _written_by_forge(flag: str, path: Path) -> bool:
    if path.stat().st_size > MAX_REPORT:
        return False
    return KINDS[flag](path.read_bytes())


def write_report(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: written to a temporary file in the same folder, then
    renamed over `path` (a rename within a folder is atomic); the temporary file never stays."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        try:
            _write_all(fd, data)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it owner-only; a report is as shareable as any file
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
