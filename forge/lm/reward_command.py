"""`forge reward verify SOURCE --data FILE [--n 8]`: call a reward source on sample rows before any
training and report every breach of its contract in words a user can act on (Nova's SDK offers the
same check as `verify_reward_function()`).

    forge reward verify rewards/grader.py:lambda_handler --data prompts.jsonl
    forge reward verify lambda:my-grader --data prompts.jsonl --n 16 --region us-east-1
    forge reward verify https://grader.example.com/score --data prompts.jsonl
    forge reward verify rewards/exact.py:exact_answer --protocol forge --data rows.jsonl

With `--protocol nova` (the default) the source gets Nova's event and must answer with one
`{id, aggregate_reward_score, metrics_list}` per sample (forge.lm.nova_reward); every missing,
unknown or repeated id, wrong count, non-numeric or non-finite score, malformed metrics_list entry,
failure and timeout is listed (the first SHOWN of them, and how many more), and a metric name
MLflow would only take shortened is warned of. The data is OpenAI-RFT records (their messages are the prompts) or
rows with a `--prompt-field`; each sample's completion is `--completion`, else the row's reference
answer as text (so a correct grader should score it high).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from forge.errors import ForgeError
from forge.lm.nova_reward import MLFLOW_NAME_LIMIT, Answer, event, read_answer
from forge.lm.rewards import Reward, RewardError
from forge.progress import say
from forge.recipe.reward_table import CONTRACTS, TRANSPORTS, transport_of
from forge.recipe.rft_settings import RewardSource
from forge.scrub import scrub

SHOWN = 20  # sample lines and violations printed; the rest are counted (an answer may hold a million)


def _out(line: str) -> None:
    """One line of the report, scrubbed: a reward's error, a URL's password or a sample may hold secrets."""
    print(scrub(line))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="reward_command", required=True, metavar="ACTION")
    p = sub.add_parser("verify", help="call a reward source on sample rows and report every contract violation")
    p.add_argument("source", help=", ".join(t.form for t in TRANSPORTS.values()))
    p.add_argument("--data", required=True, help="a .jsonl file: OpenAI-RFT records, or rows with --prompt-field")
    p.add_argument("--n", type=int, default=8, help="sample rows to send (default 8)")
    p.add_argument("--protocol", choices=tuple(CONTRACTS), default="nova", help="the contract (default nova)")
    p.add_argument("--prompt-field", default="prompt", help="rows without 'messages': the field holding the prompt")
    p.add_argument("--completion", help="the completion every sample carries (default: its reference answer)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole call (Nova allows a Lambda 15 min)")
    p.add_argument("--region", help="lambda: the AWS region (default: boto3's)")


def _rows(path: Path, n: int) -> list[tuple[str, dict[str, Any]]]:
    if not path.is_file():
        raise ForgeError(f"--data {path}: no such file")
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ForgeError(f"{path}:line {number}: not valid JSON ({e.msg}); forge data check lists every "
                                 "bad record") from None
            if not isinstance(row, dict):
                raise ForgeError(f"{path}:line {number}: expected a JSON object, got {type(row).__name__}")
            out.append((f"{path}:line {number}", row))
            if len(out) == n:
                break
    if not out:
        raise ForgeError(f"--data {path}: no records")
    return out


def _reference_text(fields: dict[str, Any]) -> str:
    ref = fields.get("reference_answer", fields.get("answer", ""))
    if isinstance(ref, dict):
        for key in ("answer", "solution", "explanation"):
            if isinstance(ref.get(key), str):
                return str(ref[key])
    return ref if isinstance(ref, str) else json.dumps(ref, ensure_ascii=False)


def _prompts(args: argparse.Namespace) -> tuple[list[list[dict[str, Any]]], dict[str, list[Any]], list[str]]:
    from forge.data.formats import FormatSpec, prompt_messages

    chats, rows = [], []
    for where, row in _rows(Path(args.data), args.n):
        spec = FormatSpec("openai_rft") if "messages" in row else None
        messages, fields = prompt_messages(row, spec, args.prompt_field, where)
        chats.append(messages)
        rows.append(fields)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    completions = [args.completion if args.completion is not None else _reference_text(r) for r in rows]
    return chats, {k: [r.get(k) for r in rows] for k in keys}, completions


def run(args: argparse.Namespace) -> int:
    say(scrub(f"forge reward verify {args.source}: calling it ({args.protocol} protocol) on {args.n} sample rows "
              f"of {args.data}"))
    transport = transport_of(args.source)
    if transport.contracts and args.protocol not in transport.contracts:
        speaks = transport.contracts[0]
        raise ForgeError(f"{args.source!r}: {transport.called} speaks only the {speaks} protocol, not {args.protocol}: "
                         f"pass --protocol {speaks}")
    try:
        spec = RewardSource(source=args.source, protocol=args.protocol, timeout_s=args.timeout, retries=0,
                            region=args.region, concurrency=4, batch_size=64)
    except ValueError as e:  # pydantic's ValidationError: its messages, on one line
        errors = e.errors() if hasattr(e, "errors") else [{"msg": str(e)}]
        why = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in errors)
        raise ForgeError(f"{args.source!r}: {why}") from None
    chats, fields, completions = _prompts(args)
    with Reward(spec, Path.cwd()) as reward:
        code: int = CONTRACTS[args.protocol].verified()(reward, chats, fields, completions)
    return code


def verify_nova(reward: Reward, chats: list[list[dict[str, Any]]], fields: dict[str, list[Any]],
                completions: list[str]) -> int:
    """Nova's event sent once; every sample's score and figures, and every breach of the answer."""
    source = reward.source
    samples = event(completions, chats, fields, 0)
    try:
        raw = reward.send(samples, f"reward {source!r}")
    except RewardError as e:
        _out(f"violation: {e}")
        _out(f"{source}: the call failed; nothing to read")
        return 1
    answer = read_answer(raw, [s["id"] for s in samples])
    for i, (sample, score) in enumerate(zip(samples[:SHOWN], answer.scores)):
        figures = ", ".join(f"{k}={v[i]:g}" for k, v in answer.metrics.items() if v[i] is not None)
        _out(f"  {sample['id']}: score {'-' if score is None else f'{score:g}'}" + (f" ({figures})" if figures else ""))
    if len(samples) > SHOWN:
        _out(f"  ... and {len(samples) - SHOWN} more samples")
    for problem in answer.problems[:SHOWN]:
        _out(f"violation: {problem}")
    if len(answer.problems) > SHOWN:
        _out(f"... and {len(answer.problems) - SHOWN} more violation(s)")
    _warn_long_names(answer, reward.label)
    verdict = "follows Nova's reward contract" if not answer.problems else f"{len(answer.problems)} violation(s)"
    _out(f"{source}: {len(samples)} samples: {verdict}")
    sys.stdout.flush()
    return 0 if not answer.problems else 1


def _warn_long_names(answer: Answer, label: str) -> None:
    """A metrics_list name whose stage metric (reward.<label>.<type>.<name>) is past MLflow's limit:
    the tracker logs it shortened with a hash (forge.track.names.mlflow_key)."""
    for key in answer.metrics:
        name = f"reward.{label}.{key}"
        if len(name) > MLFLOW_NAME_LIMIT:
            _out(f"warning: the metric {name[:60]}... ({len(name)} characters) is past MLflow's {MLFLOW_NAME_LIMIT}: "
                 "a stage logs it shortened with a hash, its full name in the run's names.json; a shorter "
                 "metrics_list name keeps it readable")


def verify_forge(reward: Reward, chats: list[list[dict[str, Any]]], fields: dict[str, list[Any]],
                 completions: list[str]) -> int:
    """One call with forge's contract; every sample's score, or the failure."""
    prompts = [c[-1]["content"] for c in chats]
    try:
        scores = reward(prompts, completions, fields, 0)
    except RewardError as e:
        _out(f"violation: {e}")
        return 1
    for i, s in enumerate(scores[:SHOWN]):
        _out(f"  sample {i}: score {s:g}")
    if len(scores) > SHOWN:
        _out(f"  ... and {len(scores) - SHOWN} more samples")
    _out(f"{reward.source}: {len(scores)} samples: follows forge's reward contract")
    return 0
