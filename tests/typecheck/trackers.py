"""Checked by mypy, never run: the trackers forge uses are each assignable to forge.track's Tracker
protocol (the MLflow one, the disabled one other ranks get, and the tests' Recorder)."""
from __future__ import annotations

from forge.track import MlflowTracker, StageTracker, Tracker, null_tracker
from forge_testing import Recorder


def trackers(recorder: Recorder, mlflow_tracker: MlflowTracker) -> list[Tracker]:
    return [recorder, mlflow_tracker, null_tracker()]


def stage_trackers(recorder: Recorder, tracker: Tracker) -> list[StageTracker]:
    return [recorder, tracker]
