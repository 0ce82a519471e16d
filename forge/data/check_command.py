"""`forge data check FILE --as KIND`: validate a JSON-lines file against a record format without
training: every bad record named by file:line and field, then Amazon Nova's own rules and minimums.

    forge data check train.jsonl --as bedrock       Bedrock conversation records (SFT)
    forge data check prompts.jsonl --as openai_rft  OpenAI-RFT prompts (RFT)
    forge data check chats.jsonl --as openai        OpenAI chat messages (tool calls too)

Other kinds: messages, instruction, prompt_completion, preference, hh (forge's own). Exit status 0
when every record is usable and Nova's minimums hold, 1 otherwise (warnings do not fail).

Nova's rules checked, as Amazon documents them:
- RFT: at least 100 training records, each with `messages` and a `reference_answer`, text only
  ("Prepare data for Amazon Nova models", https://docs.aws.amazon.com/bedrock/latest/userguide/rft-prepare-data.html).
- SFT (Bedrock conversation): the first turn is the user's and the last the assistant's; at least
  100 samples per task recommended (a warning); prompts starting with a reserved keyword (`User:`,
  `Bot:`, `Assistant:`, `System:`, `<image>`, `<video>`, `[EOS]`) warned of ("Preparing data for
  fine-tuning Understanding models",
  https://docs.aws.amazon.com/nova/latest/userguide/fine-tune-prepare-data-understanding.html).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from forge.data.formats import FIELDS, FormatSpec, RecordError, prompt_messages, to_messages, to_preference
from forge.errors import ForgeError
from forge.progress import say

NOVA_RFT_MIN = 100  # training records (Bedrock RFT requirement)
NOVA_SFT_RECOMMENDED = 100  # samples per task (Nova's recommendation)
RESERVED = ("User:", "Bot:", "Assistant:", "System:", "<image>", "<video>", "[EOS]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="validate a JSON-lines file against a record format, with file:line errors")
    p.add_argument("file", help="a .jsonl file (one JSON object a line)")
    p.add_argument("--as", dest="kind", required=True, choices=sorted(FIELDS), help="the record format")
    p.add_argument("--field", action="append", default=[], metavar="LOGICAL=NAME",
                   help="a record field under another name, e.g. messages=conversation (repeatable)")
    p.add_argument("--max-errors", type=int, default=20, help="bad records to list (all are counted)")


def _spec(kind: str, pairs: list[str]) -> FormatSpec:
    fields = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise ForgeError(f"--field {pair!r}: expected LOGICAL=NAME, e.g. messages=conversation")
        fields[name] = value
    try:
        return FormatSpec(kind, fields)  # type: ignore[arg-type]
    except ValueError as e:
        raise ForgeError(f"--field: {e}") from None


def check_record(row: Any, spec: FormatSpec, where: str) -> list[str]:
    """The record's conversation read by its format (a RecordError when it cannot be), then Nova's
    rules for it: a list of warnings."""
    if spec.kind == "openai_rft":
        messages, fields = prompt_messages(row, spec, "prompt", where)
        if fields.get("reference_answer") is None:
            raise RecordError(where, "missing: Nova's RFT records carry a reference_answer for the reward "
                              "function (any JSON value)", "reference_answer")
        return []
    if spec.kind in ("preference", "hh"):
        to_preference(row, spec, where)
        return []
    messages = to_messages(row, spec, where)
    if spec.kind != "bedrock":
        return []
    turns = [m for m in messages if m["role"] != "system"]
    if turns[0]["role"] != "user":
        raise RecordError(where, "Nova: the first turn must be the user's", "messages[0].role")
    if turns[-1]["role"] != "assistant":
        raise RecordError(where, "Nova: the last turn must be the assistant's (the reply trained on)",
                          f"messages[{len(row[spec.field_name('messages')]) - 1}].role")
    return [f"{where}: a {m['role']} prompt starts with {word!r}, one of Nova's reserved keywords {list(RESERVED)}"
            for m in messages if m["role"] in ("system", "user") for word in RESERVED
            if m["content"].lstrip().startswith(word)]


def check_file(path: Path, spec: FormatSpec) -> tuple[int, list[str], list[str]]:
    """(records, errors, warnings) of a JSON-lines file read with `spec`."""
    records, errors, warnings = 0, [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            where = f"{path}:line {number}"
            if not line.strip():
                warnings.append(f"{where}: an empty line (Nova expects one JSON object a line)")
                continue
            records += 1
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
                continue
            try:
                warnings += check_record(row, spec, where)
            except ForgeError as e:
                errors.append(str(e))
    return records, errors, warnings


def _minimums(spec: FormatSpec, good: int) -> tuple[list[str], list[str]]:
    if spec.kind == "openai_rft" and good < NOVA_RFT_MIN:
        return [f"{good} usable records; Nova's reinforcement fine-tuning needs at least {NOVA_RFT_MIN} training "
                "records (https://docs.aws.amazon.com/bedrock/latest/userguide/rft-prepare-data.html)"], []
    if spec.kind == "bedrock" and good < NOVA_SFT_RECOMMENDED:
        return [], [f"{good} usable records; Nova recommends at least {NOVA_SFT_RECOMMENDED} samples for each task "
                    "the model should learn"]
    return [], []


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    say(f"forge data check {path} as {args.kind}: reading every record")
    spec = _spec(args.kind, args.field)
    if not path.is_file():
        raise ForgeError(f"{path}: no such file")
    records, errors, warnings = check_file(path, spec)
    short, advice = _minimums(spec, records - len(errors))
    for e in errors[:args.max_errors]:
        print(f"error: {e}")
    if len(errors) > args.max_errors:
        print(f"error: ... and {len(errors) - args.max_errors} more bad records")
    for w in warnings[:args.max_errors] + advice:
        print(f"warning: {w}")
    for s in short:
        print(f"error: {s}")
    verdict = "ok" if not errors and not short else "not usable as it is"
    print(f"{path}: {records} records as {args.kind}: {records - len(errors)} ok, {len(errors)} bad, "
          f"{len(warnings) + len(advice)} warnings: {verdict}")
    sys.stdout.flush()
    return 0 if verdict == "ok" else 1
