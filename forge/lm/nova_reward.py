"""Amazon Nova's reward contract (`protocol: nova`): the event a reward Lambda receives and the
answer it returns, so a Lambda written for Nova runs through forge unchanged (forge.lm.rewards
sends the event to a Lambda, an HTTP endpoint or a local `file.py:lambda_handler`).

The event is a list of samples `{"id", "messages" (the prompt with the generated assistant turn
appended), "reference_answer", "metadata"}`; the answer a list `[{"id", "aggregate_reward_score",
"metrics_list": [{"name", "value", "type": "Reward" | "Metric"}]}]`. Amazon documents the
reference answer both at the top of a sample (SageMaker AI, "Implementing reward functions",
https://docs.aws.amazon.com/sagemaker/latest/dg/nova-implementing-reward-functions.html) and inside
`metadata` with the record's extra fields (Nova user guide, "Reinforcement fine-tuning (RFT) for
Amazon Nova models", https://docs.aws.amazon.com/nova/latest/nova2-userguide/nova-reinforcement-fine-tuning.html);
forge sends both, so a Lambda written from either page reads what it expects. Ids are unique per
sample ("a unique id field for tracking"): the record's own `id` (else the batch and position)
with `#k` for the k-th completion of its prompt; the record's id stays in `metadata`.
"""
from __future__ import annotations

import math
import numbers
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

METRIC_TYPES = ("Reward", "Metric")
# MLflow's limit on a metric name (forge.track.names.MAX_NAME, which forge.lm does not import): the
# tracker shortens a longer name with a hash, so `forge reward verify` warns of one
MLFLOW_NAME_LIMIT = 250


def event(completions: list[str], prompts: list[list[dict[str, Any]]], fields: dict[str, list[Any]],
          batch: int) -> list[dict[str, Any]]:
    """Nova's event for these completions (prompts[i] and fields[k][i] belong to completions[i])."""
    seen: dict[str, int] = {}
    out: list[dict[str, Any]] = []
    for i, (text, prompt) in enumerate(zip(completions, prompts)):
        row = {k: v[i] for k, v in fields.items()}
        base = str(row["id"]) if row.get("id") is not None else f"batch{batch}-{i}"
        k = seen[base] = seen.get(base, -1) + 1
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        sample: dict[str, Any] = {"id": f"{base}#{k}", "messages": messages + [{"role": "assistant", "content": text}]}
        if "reference_answer" in row:
            sample["reference_answer"] = row["reference_answer"]
        sample["metadata"] = row
        out.append(sample)
    return out


@dataclass
class Answer:
    """A Nova answer read against its event: scores in the event's order (None where unusable), the
    metrics_list values by `type.name` (one entry per sample, None where absent), what is wrong."""

    scores: list[float | None]
    metrics: dict[str, list[float | None]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number_problem(value: object, wanted: str = "a finite number") -> str | None:
    """Why `value` is not a usable score ("is 'x', not `wanted`"), None when it is a finite number;
    an integer too large for a float (10**400) is named by its size, not printed."""
    if not _number(value):
        return f"is {value!r}, not {wanted}"
    try:
        finite = math.isfinite(float(value))  # type: ignore[arg-type]
    except OverflowError:
        digits = math.floor(math.log10(abs(int(value)))) + 1  # type: ignore[call-overload]
        return f"is a {digits}-digit integer, too large for a float: not a finite number"
    return None if finite else f"is {value!r}, not a finite number"


def read_answer(answer: object, ids: list[str]) -> Answer:
    """Every contract violation of `answer` for an event with these sample ids, in words a user can
    act on: not a list, a wrong count, a result that is not an object, a missing, unknown or
    repeated id, an ids without result, a missing / non-numeric / non-finite score, a malformed
    metrics_list entry."""
    out = Answer([None] * len(ids))
    where = {sid: i for i, sid in enumerate(ids)}
    if not isinstance(answer, list):
        kind = getattr(answer, "type_name", type(answer).__name__)
        hint = " (a dict with 'body'? return the list itself, not an API Gateway response)" if isinstance(answer, dict) \
            and "body" in answer else ""
        out.problems.append(f"expected a list of {len(ids)} results (one per sample), got {kind}{hint}")
        return out
    if len(answer) != len(ids):
        out.problems.append(f"returned {len(answer)} results for {len(ids)} samples")
    first: dict[str, int] = {}
    for j, result in enumerate(answer):
        if not isinstance(result, dict):
            out.problems.append(f"result {j} is {getattr(result, 'type_name', type(result).__name__)}, "
                                "not an object with 'id' and 'aggregate_reward_score'")
            continue
        sid = result.get("id")
        if sid is None:
            out.problems.append(f"result {j} has no 'id' (echo the sample's 'id')")
            continue
        if not isinstance(sid, str) or sid not in where:
            out.problems.append(f"result {j} has id {sid!r}, which no sample of the event has")
            continue
        if sid in first:
            out.problems.append(f"id {sid!r} is answered twice (results {first[sid]} and {j})")
            continue
        first[sid] = j
        _read_result(result, j, where[sid], out)
    missing = [sid for sid in ids if sid not in first]
    if missing:
        shown = ", ".join(repr(s) for s in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        out.problems.append(f"no result for sample id(s) {shown}")
    return out


def _read_result(result: dict[str, Any], j: int, i: int, out: Answer) -> None:
    sid = result["id"]
    score: Any = result.get("aggregate_reward_score")
    if "aggregate_reward_score" not in result:
        out.problems.append(f"result {j} (id {sid!r}) has no 'aggregate_reward_score'")
    elif problem := number_problem(score, "a number"):
        out.problems.append(f"result {j} (id {sid!r}): aggregate_reward_score {problem}")
    else:
        out.scores[i] = float(score)
    entries = result.get("metrics_list", [])
    if not isinstance(entries, list):
        out.problems.append(f"result {j} (id {sid!r}): metrics_list is {type(entries).__name__}, not a list")
        return
    for k, e in enumerate(entries):
        at = f"result {j} (id {sid!r}): metrics_list[{k}]"
        if not isinstance(e, dict):
            out.problems.append(f"{at} is {type(e).__name__}, not an object with name, value and type")
        elif not isinstance(e.get("name"), str) or not e["name"]:
            out.problems.append(f"{at} has no 'name' text")
        elif e.get("type") not in METRIC_TYPES:
            out.problems.append(f"{at} ({e['name']!r}): type is {e.get('type')!r}; expected 'Reward' or 'Metric'")
        elif problem := number_problem(e.get("value")):
            out.problems.append(f"{at} ({e['name']!r}): value {problem}")
        else:
            key = f"{e['type'].lower()}.{e['name']}"  # as named: the tracker makes it a name MLflow takes
            out.metrics.setdefault(key, [None] * len(out.scores))[i] = float(e["value"])


class LocalContext:
    """What a local `lambda_handler(event, context)` gets as `context`: the attributes and the one
    method of AWS Lambda's Python context object that handlers use."""

    def __init__(self, name: str, timeout_s: float):
        self.function_name, self.function_version = name, "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{name}"
        self.memory_limit_in_mb, self.aws_request_id = 128, str(uuid.uuid4())
        self.log_group_name, self.log_stream_name = f"/aws/lambda/{name}", "forge-local"
        self._end = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._end - time.monotonic()) * 1000))
