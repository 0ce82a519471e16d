"""Which MLflow runs belong to an output folder (`tracking.json`: the parent's id and each stage's),
so that a resumed run continues them, and the pipeline's parent run as a context manager."""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from forge.rundir import RunLayout
from forge.track.protocol import Tracker


@dataclass
class RunIds:
    """Which MLflow runs belong to this output folder, so a resume continues them."""

    path: Path
    parent: str | None = None
    stages: dict[str, str] = field(default_factory=dict)
    reopened: bool = False  # the parent run was reopened (not a new one)

    @classmethod
    def load(cls, out: Path) -> RunIds:
        path = RunLayout(Path(out)).tracking  # {"parent": id, "stages": {name: id}}
        data = json.loads(path.read_text()) if path.is_file() else {}
        return cls(path, data.get("parent"), dict(data.get("stages", {})))

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"parent": self.parent, "stages": self.stages}, indent=2))
        tmp.replace(self.path)

    def reopenable(self, tracker: Tracker) -> str | None:
        """The parent run to continue, or None for a new one. A run still RUNNING belongs to a
        process that was killed without a clean stop: it and its stages' runs are marked FAILED."""
        status = tracker.run_status(self.parent) if self.parent else None
        if status == "RUNNING":
            for run_id in [self.parent, *self.stages.values()]:
                if run_id and tracker.run_status(run_id) == "RUNNING":
                    tracker.end_stale(run_id, "the process was killed (no clean stop); marked when the run resumed")
            return None
        self.reopened = status is not None
        return self.parent if self.reopened else None

    def discard(self, tracker: Tracker) -> None:
        """A fresh run in this folder: the runs an earlier, killed process left RUNNING are marked
        FAILED, and the ids of the earlier runs are forgotten."""
        for run_id in [self.parent, *self.stages.values()]:
            if run_id and tracker.run_status(run_id) == "RUNNING":
                tracker.end_stale(run_id, "the process was killed (no clean stop); marked when a new run started")
        self.parent, self.stages = None, {}


@dataclass
class ParentRun:
    """The pipeline's open parent run: its id (None when not tracked), the folder's run ids, and
    whether it was started now (a new run logs its recipe and params; a reopened one has them)."""

    run_id: str | None
    runs: RunIds
    new: bool


@contextlib.contextmanager
def parent_run(tracker: Tracker, out: Path, name: str, tags: dict[str, str], resume: bool = False,
               main: bool = True) -> Iterator[ParentRun]:
    """Open the pipeline's parent run for the output folder `out`: with `resume`, the folder's
    earlier run when it can be continued, else a new one (tagged with the run it follows, if any).
    `main`: this process writes `tracking.json` (rank 0). The run ends FAILED if the body raises."""
    runs = RunIds.load(out)
    if resume:
        previous = runs.reopenable(tracker)
    else:
        runs.discard(tracker)
        previous = None
    with tracker.run(name, tags=tags, run_id=previous) as run_id:
        new = bool(run_id) and run_id != previous
        if new:
            if runs.parent:  # a resume that could not continue the killed run: say which one it follows
                tracker.set_tags({"forge.resumed_from_run": runs.parent})
            runs.parent, runs.stages = run_id, {}
            if main:
                runs.save()
        yield ParentRun(run_id, runs, new)
