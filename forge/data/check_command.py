"""`forge data check FILE --as KIND`: validate a JSON-lines file against a record format without
training: every bad record named by file:line and field, then Amazon Nova's own rules and minimums.

    forge data check train.jsonl --as bedrock       Bedrock conversation records (SFT)
    forge data check prompts.jsonl --as openai_rft  OpenAI-RFT prompts (RFT)
    forge data check chats.jsonl --as openai        OpenAI chat messages (tool calls too)

Other kinds: messages, instruction, prompt_completion, preference, hh (forge's own). Exit status 0
when every record is usable and Nova's minimums hold, 1 otherwise (warnings do not fail).

Records are read by the training path's own reader (forge.data.readers.read_jsonl: .jsonl.gz too,
lines split on '\n' only, the same refusals), so what this passes trains and what it names as bad
the training path refuses too. Memory stays bounded whatever the file: a line over --max-line-mb is
reported as too long without being held, and only the first --max-errors messages are kept.

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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.data.formats import FIELDS, FormatSpec, RecordError, prompt_messages, to_messages, to_preference
from forge.data.readers import read_jsonl
from forge.errors import ForgeError
from forge.progress import say

NOVA_RFT_MIN = 100  # training records (Bedrock RFT requirement)
NOVA_SFT_RECOMMENDED = 100  # samples per task (Nova's recommendation)
RESERVED = ("User:", "Bot:", "Assistant:", "System:", "<image>", "<video>", "[EOS]")
MAX_LINE_MB = 8  # a record this long is far past any Nova context (300K tokens is about 1.2 MB of text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="validate a JSON-lines file against a record format, with file:line errors")
    p.add_argument("file", help="a .jsonl or .jsonl.gz file (one JSON object a line)")
    p.add_argument("--as", dest="kind", required=True, choices=sorted(FIELDS), help="the record format")
    p.add_argument("--field", action="append", default=[], metavar="LOGICAL=NAME",
                   help="a record field under another name, e.g. messages=conversation (repeatable)")
    p.add_argument("--max-errors", type=int, default=20, metavar="N",
                   help="bad records (and warnings) to list: 0 or more, default 20; all are counted")
    p.add_argument("--max-line-mb", type=int, default=MAX_LINE_MB, metavar="MB",
                   help=f"a line longer than this is reported as too long without being read whole "
                        f"(default {MAX_LINE_MB}; Nova's records are far shorter)")


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


@dataclass
class Found:
    """Messages of one kind: the first `keep` of them and how many there were (a million bad
    lines are a count, not a million strings in memory)."""

    keep: int
    first: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(message)


def check_file(path: Path, spec: FormatSpec, keep: int = 20, max_line: int = MAX_LINE_MB << 20
               ) -> tuple[int, Found, Found]:
    """(records, errors, warnings) of a JSON-lines file read with `spec`, as training reads it."""
    records, errors, warnings = 0, Found(keep), Found(keep)
    last = 0
    for number, row in read_jsonl(path, max_line=max_line):
        where = f"{path}:line {number}"
        if number > last + 1:  # the reader passes over blank lines; Nova's reader may not
            warnings.add(f"{path}:line {last + 1}: an empty line (Nova expects one JSON object a line)")
        last = number
        records += 1
        try:
            if isinstance(row, ForgeError):
                raise row
            for warning in check_record(row, spec, where):
                warnings.add(warning)
        except ForgeError as e:
            errors.add(str(e))
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
    if args.max_errors < 0:
        raise ForgeError(f"--max-errors {args.max_errors}: expected 0 or more (0 lists none; all are counted)")
    if args.max_line_mb < 1:
        raise ForgeError(f"--max-line-mb {args.max_line_mb}: expected 1 or more")
    if not path.is_file():
        raise ForgeError(f"{path}: no such file")
    records, errors, warnings = check_file(path, spec, args.max_errors, args.max_line_mb << 20)
    short, advice = _minimums(spec, records - errors.count)
    if not records:  # training would find nothing here (or refuse the source)
        short.insert(0, f"{path}: no records (the file is empty or blank)")
    for e in errors.first:
        print(f"error: {e}")
    if errors.count > len(errors.first):
        print(f"error: ... and {errors.count - len(errors.first)} more bad records")
    for w in warnings.first + advice:
        print(f"warning: {w}")
    if warnings.count > len(warnings.first):
        print(f"warning: ... and {warnings.count - len(warnings.first)} more warnings")
    for s in short:
        print(f"error: {s}")
    verdict = "ok" if not errors.count and not short else "not usable as it is"
    print(f"{path}: {records} records as {args.kind}: {records - errors.count} ok, {errors.count} bad, "
          f"{warnings.count + len(advice)} warnings: {verdict}")
    sys.stdout.flush()
    return 0 if verdict == "ok" else 1
