"""Runs post-training stages (sft, dpo, rft), each from CHECKPOINT, in this process as a rank of a
torchrun launch: `python post_training_worker.py STAGES_JSON CHECKPOINT DATA_DIR OUT`. Rank 0
records what each stage logs (metrics, sample tables) to OUT/<stage>/logged.json; the other ranks
get the null tracker, as in a pipeline run."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # forge_testing

from forge.inputs import resolve_source  # noqa: E402
from forge.kinds import KINDS  # noqa: E402
from forge.recipe import DataSource  # noqa: E402
from forge.track import null_tracker  # noqa: E402
from forge_testing import Recorder, run_stage  # noqa: E402


def sources(data: Path) -> dict:
    """The test's data: Q&A pairs (sft), preference pairs (dpo), prompts (rft)."""
    def chat(name, file, kind, holdout=0.25):
        return resolve_source(name, DataSource(path=str(data / file), holdout=holdout, chat={"kind": kind}), data)

    return {"qa": chat("qa", "qa.jsonl", "prompt_completion"), "prefs": chat("prefs", "prefs.jsonl", "preference"),
            "p": resolve_source("p", DataSource(path=str(data / "prompts.jsonl"), holdout=0.0), data)}


def main(stages_json: str, checkpoint: str, data_dir: str, out: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    for cfg in json.loads(stages_json):
        stage = KINDS[cfg["kind"]].settings(**cfg)
        tracker = Recorder() if rank == 0 else null_tracker()
        result = run_stage(stage, checkpoint, sources(Path(data_dir)), Path(out) / stage.name, tracker=tracker)
        if rank == 0:
            (Path(out) / stage.name / "logged.json").write_text(json.dumps(
                {"metrics": [{"step": step, **m} for step, m in tracker.rows],
                 "tables": [name for name, _ in tracker.tables], "result": result.metrics}))


if __name__ == "__main__":
    main(*sys.argv[1:])
