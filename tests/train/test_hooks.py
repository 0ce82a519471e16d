"""The loop's hooks, each driven alone on a `Run` of stand-ins (no model, no loop): the divergence
guard's log, resume points and evaluation."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from forge.recipe import Guard
from forge.train.hooks import Checkpoints, Evaluation, GuardLog, Run
from forge.train.step import Divergence, DivergenceGuard, StepResult
from forge_testing import Recorder


class Session(SimpleNamespace):
    """What the hooks read of a session: its steps, resume point, name; resume points are counted."""

    def __init__(self, total_steps: int = 6, resume_from: Path | None = None):
        super().__init__(total_steps=total_steps, resume_from=resume_from, is_main=True,
                         settings=SimpleNamespace(name="t"), saved=[])

    def save_resumable(self, state) -> Path:
        self.saved.append(state.step)
        return Path(f"checkpoints/step-{state.step:07d}")


class Ranks:
    def __init__(self):
        self.flushed: list[bool] = []

    def flush(self, state, meter, stats=True):
        self.flushed.append(stats)
        return {}


def _run(guard: DivergenceGuard | None = None, **session) -> Run:
    state = SimpleNamespace(step=0, metrics={})
    return Run(Session(**session), Recorder(), state, guard or DivergenceGuard(Guard(), "stage t"), Ranks())


def _named(records):
    return [f"{source} line {n}" for source, n in records]


def test_checkpoints_are_written_at_their_cadence_and_at_a_stop_never_at_the_last_step():
    run, hook = _run(), Checkpoints(every=2)
    assert [step for step in range(1, 7) if hook.reads(run, step)] == [2, 4]  # the last step's is the final output
    for step in range(1, 7):
        run.state.step = step
        run.halt = step == 3  # a stop asked during step 3: a resume point there too
        hook.post_step(run, step)
    assert run.session.saved == [2, 3, 4]
    assert run.ranks.flushed == [False] * 3  # the tokens so far go into each, the statistics are not read
    assert run.guard.last_good_checkpoint == Path("checkpoints/step-0000004")  # the guard names the newest
    run.halt = True
    hook.post_step(run, 6)  # a stop at the last step: the stage's own output follows
    assert run.session.saved == [2, 3, 4]


def test_checkpoints_tag_a_resumed_run_with_its_resume_point():
    fresh, hook = _run(), Checkpoints(every=0)
    hook.start(fresh)
    assert fresh.tracker.calls == [] and fresh.guard.last_good_checkpoint is None
    resumed = _run(resume_from=Path("out/checkpoints/step-0000004"))
    resumed.resumed = True
    hook.start(resumed)
    assert resumed.tracker.calls == [("set_tags", ({"resumed_from": "out/checkpoints/step-0000004"},))]
    assert resumed.guard.last_good_checkpoint == Path("out/checkpoints/step-0000004")
    assert not any(hook.reads(resumed, step) for step in range(1, 7))  # every: 0: only the end


def test_the_guard_log_records_a_skipped_step_and_its_records(capsys):
    guard = DivergenceGuard(Guard(action="skip", max_skips=3), "stage t", _named)
    run = _run(guard)
    guard.batch = [("qa", 7), ("qa", 9)]
    guard.trip(5, "loss became nan")  # a skip: noted, not raised
    out = StepResult(torch.tensor(float("nan")), None, 1e-3, torch.tensor(8), skipped="loss became nan")
    GuardLog().after_update(run, 5, out)
    assert "skipped the batch" in capsys.readouterr().err  # said on the main process
    (tag, (tags,)), (text, (body, name)) = run.tracker.calls
    assert tag == "set_tags" and tags == {"guard.step-5": guard.note}
    assert text == "log_text" and name == "guard/step-5.txt" and body.splitlines()[-2:] == ["qa line 7", "qa line 9"]
    GuardLog().after_update(run, 6, StepResult(torch.tensor(1.0), None, 1e-3, torch.tensor(8)))
    assert len(run.tracker.calls) == 2  # a good step logs nothing


def test_the_guard_log_records_the_step_a_stop_names():
    guard = DivergenceGuard(Guard(action="stop"), "stage t", _named)
    run = _run(guard)
    guard.batch = [("web", 3)]
    with pytest.raises(Divergence) as stopped:
        guard.trip(4, "gradient norm became inf")
    hook = GuardLog()
    hook.on_error(run, RuntimeError("not the guard's"))
    assert run.tracker.calls == []
    hook.on_error(run, stopped.value)
    (_, (tags,)), (_, (body, name)) = run.tracker.calls
    assert tags == {"guard.step-4": str(stopped.value)} and name == "guard/step-4.txt"
    assert body.startswith(str(stopped.value)) and "web line 3" in body


class Held:
    """A task's evaluation: the step it was asked at, as a figure."""

    def __init__(self, evaluates: bool = True):
        self.evaluates, self.asked = evaluates, []

    def evaluate(self, step: int) -> dict[str, float]:
        self.asked.append(step)
        return {"eval_loss": float(step)}


def test_evaluation_of_the_start_at_its_cadence_and_of_the_trained_model():
    run, task = _run(), Held()
    hook = Evaluation(task, every=4)
    hook.start(run)
    assert run.state.metrics == {"eval_loss_start": 0.0}
    for step in range(1, 7):
        hook.post_step(run, step)
    metrics: dict[str, float] = {}
    hook.end(run, metrics)
    assert task.asked == [0, 4, 6] and metrics == {"eval_loss": 6.0}
    assert run.tracker.rows == [(0, {"eval_loss": 0.0}), (4, {"eval_loss": 4.0}), (6, {"eval_loss": 6.0})]

    resumed, none = _run(), Held(evaluates=False)
    resumed.resumed = True
    Evaluation(task, every=4).start(resumed)  # a resumed run measured its start before
    Evaluation(none, every=4).end(resumed, metrics)  # a kind without held-out data is never asked
    assert task.asked == [0, 4, 6] and none.asked == [] and resumed.tracker.rows == []
