"""Runs stages, each from CHECKPOINT, as one rank of a torchrun launch (or alone in a test's process):
`python dist_stages.py CONFIG_JSON`, CONFIG: {"stages": [...] (a stage may name its own
"parallelism" and start "from" an earlier stage's output), "parallelism": {...} or a strategy
name, "checkpoint", "data" (qa/prefs/prompts files), "generated" (the folder of the generated text
sources), "out", "resume": bool, "crash_after": the number of pretraining batches after which every
rank fails (a crash mid-stage), or null}. Rank 0 records each stage's logged rows, tables and
result in OUT/<stage>/logged.json; the other ranks log to the null tracker, as in a pipeline run."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # forge_testing

from forge.inputs import resolve_source  # noqa: E402
from forge.kinds import KINDS  # noqa: E402
from forge.recipe import DataSource, GeneratedText, Parallelism  # noqa: E402
from forge.stages.result import StageInputs  # noqa: E402
from forge.track import null_tracker  # noqa: E402
from forge_testing import Recorder  # noqa: E402


def sources(data: Path, generated: Path) -> dict[str, Any]:
    def chat(name: str, file: str, kind: str) -> Any:
        return resolve_source(name, DataSource(path=str(data / file), holdout=0.25, chat={"kind": kind}), data)

    return {"qa": chat("qa", "qa.jsonl", "prompt_completion"), "prefs": chat("prefs", "prefs.jsonl", "preference"),
            "p": resolve_source("p", DataSource(path=str(data / "prompts.jsonl"), holdout=0.0), data),
            "general": resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=300)),
                                      generated)}


class Crash(RuntimeError):
    """A simulated crash mid-stage, on every rank at the same batch."""


def crash_after(calls: int) -> None:
    from forge.data.mixing import MixedBlocks

    real, seen = MixedBlocks.next_batch, {"n": 0}

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen["n"] += 1
        if seen["n"] > calls:
            raise Crash("simulated crash")
        return real(self, *args, **kwargs)

    MixedBlocks.next_batch = flaky  # type: ignore[method-assign]


def main(config: str) -> None:
    from forge.data.mixing import MixedBlocks

    cfg = json.loads(config)
    rank = int(os.environ.get("RANK", "0"))
    if cfg.get("crash_after") is not None:
        crash_after(cfg["crash_after"])
    real, mixes = MixedBlocks.next_batch, []

    def noted(self: Any, *args: Any, **kwargs: Any) -> Any:  # the stage's mixture, to read its `read` count
        if not mixes or mixes[-1] is not self:
            mixes.append(self)
        return real(self, *args, **kwargs)

    MixedBlocks.next_batch = noted  # type: ignore[method-assign]
    try:
        _stages(cfg, rank, mixes)
    finally:
        MixedBlocks.next_batch = real  # type: ignore[method-assign]


def _stages(cfg: dict[str, Any], rank: int, mixes: list[Any]) -> None:
    found = sources(Path(cfg["data"]), Path(cfg["generated"]))
    for stage_cfg in cfg["stages"]:
        stage_cfg = dict(stage_cfg)
        spec = stage_cfg.pop("parallelism", cfg["parallelism"])  # a stage's own, else the launch's
        parallelism = Parallelism(**spec) if isinstance(spec, dict) else spec
        start = Path(cfg["out"]) / stage_cfg.pop("from") / "final" if "from" in stage_cfg else Path(cfg["checkpoint"])
        stage = KINDS[stage_cfg["kind"]].settings(**stage_cfg)
        tracker = Recorder() if rank == 0 else null_tracker()
        out = Path(cfg["out"]) / stage.name
        inputs = StageInputs(start, found, out, tracker, cfg.get("resume", False), {}, lambda *_: None,
                             parallelism=parallelism)
        result = KINDS[stage.kind].runner()(stage, inputs)
        if mixes and stage.kind in ("pretrain", "midtrain"):  # the blocks this rank cut itself
            (out / f"read-rank{rank}.json").write_text(json.dumps({"read": mixes[-1].read}))
        if rank == 0:
            (out / "logged.json").write_text(json.dumps(
                {"rows": [{"step": step, **m} for step, m in tracker.rows],
                 "tables": [name for name, _ in tracker.tables], "result": result.metrics}, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
