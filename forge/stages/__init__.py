"""Stage files: one per kind, each holding `run(stage, inputs: StageInputs) -> StageResult`
(forge/stages/result.py), plus runner.py (per-stage bookkeeping). A stage takes a checkpoint, data
and settings and returns a checkpoint and metrics; it never knows its neighbours. Which file runs
which kind is a row of the kinds table, forge/kinds.py."""
