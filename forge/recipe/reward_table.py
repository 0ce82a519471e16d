"""Reward transports and reward contracts: the ONE table of each. A reward source's `source` names
its transport by its form (a prefix such as `lambda:`; a source with no transport's prefix is
Python code) and its `protocol` names its contract. The recipe validates a source with these rows,
forge.lm.rewards builds and calls it with them, `forge validate` and `forge reward verify` describe
it from them and the recipe reference documents them; nothing else in forge compares transport or
contract names.

A `Transport` row: the prefixes its sources start with, their form and a line of help, the check a
source gets when the recipe loads, its metric label, what `forge validate` lists it as (loading
nothing), the contracts it speaks, and the "module:function" that builds it: `(spec, setup) ->
forge.lm.reward_channel.Channel`. A `Contract` row: what a reward function receives and returns, the
"module:object" that speaks it (a forge.lm.reward_channel.ContractCode: the payload it sends, how an
answer is read into scores) and `forge reward verify`'s report for it. Code is named by dotted
names, imported on demand: it lives in forge.lm, above the recipe.

Adding a transport or a contract is one row below and the module it names (tests/lm/test_toy_reward.py
adds one of each from inside a test).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from forge.recipe.address import check_address
from forge.recipe.judge import JUDGE_PREFIX, JudgeOptions
from forge.usercode import describe_code


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


def _no_check(source: str) -> None:
    return None


@dataclass(frozen=True)
class Transport:
    name: str
    prefixes: tuple[str, ...]        # a source starting with one is this transport's; (): any other source
    form: str                        # its sources' form, in messages and docs
    summary: str                     # one line for help and docs
    build: str                       # "module:function" (spec, setup) -> forge.lm.reward_channel.Channel
    label: Callable[[Any], str]      # the source's name in metric keys (reward.<label>.mean), from its spec
    describe: Callable[[str], str]   # what `forge validate` lists it as, loading nothing
    called: str                      # how a message names one of its sources
    check: Callable[[str], None] = _no_check  # at recipe load: a ValueError for a wrong source of its form
    contracts: tuple[str, ...] = ()  # the contracts it speaks; (): every one
    options: str | None = None       # a RewardSource field that only its sources take

    def built(self, spec: Any, setup: Any) -> Any:
        return _resolve(self.build)(spec, setup)


@dataclass(frozen=True)
class Contract:
    name: str
    summary: str  # what a reward function receives and returns (the `protocol` field's documentation)
    code: str     # "module:object": its forge.lm.reward_channel.ContractCode
    verify: str   # "module:function" (reward, chats, fields, completions) -> exit status of `forge reward verify`

    def spoken(self) -> Any:
        return _resolve(self.code)

    def verified(self) -> Callable[..., int]:
        return _resolve(self.verify)


# ------------------------------------------------------------------------ the built-in rows' parts
def _plain(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]+", "_", label) or "reward"


def _python_label(spec: Any) -> str:
    """The function's name; for a `lambda_handler` (a name that says nothing) the file's or module's."""
    target, _, label = spec.source.rpartition(":")
    if label == "lambda_handler":
        label = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
    return _plain(label)


def _http_label(spec: Any) -> str:
    """The endpoint's host and path, never its user info (a password) nor its query."""
    authority, slash, path = spec.source.split("://", 1)[1].split("?", 1)[0].partition("/")
    return _plain((authority.rpartition("@")[2] + slash + path).rstrip("/"))


def _lambda_label(spec: Any) -> str:
    """The function's name, from a name, name:qualifier or arn:aws:lambda:REGION:ACCOUNT:function:NAME."""
    name = spec.source.removeprefix("lambda:")
    return _plain(name.split(":")[6] if name.startswith("arn:") and name.count(":") >= 6 else name.split(":")[0])


def _judge_label(spec: Any) -> str:
    """judge_<rubric>: a built-in rubric's name or a rubric file's stem (forge.lm.judge_rubrics)."""
    return f"judge_{Path((spec.judge or JudgeOptions.model_validate({})).rubric).stem}"


def _python_check(source: str) -> None:
    if not all(source.rpartition(":")[::2]):
        raise ValueError(f"source {source!r}: expected {_and([t.form for t in TRANSPORTS.values()], 'or')}")


def _judge_check(source: str) -> None:
    check_address(source.removeprefix(JUDGE_PREFIX))


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (
    Transport("python", (), "file.py:function, module:function",
              "a Python function, sync or async (in a file relative to the recipe, or an installed module), run in a "
              "worker process forge can kill", "forge.lm.reward_transports:python", _python_label, describe_code,
              "a Python function", _python_check),
    Transport("http", ("http://", "https://"), "http(s)://...",
              "an endpoint POSTed the contract's JSON, batch_size completions a request, concurrency of them in "
              "flight, retries after a failed one", "forge.lm.reward_http:endpoint", _http_label,
              lambda s: f"{s} (HTTP endpoint: receives prompts and completions)", "an endpoint"),
    Transport("lambda", ("lambda:",), "lambda:NAME",
              "an AWS Lambda function (a name or an ARN) invoked through boto3 with the contract's JSON, batch_size "
              "completions a request",
              "forge.lm.reward_transports:aws_lambda", _lambda_label, lambda s: f"{s} (AWS Lambda)", "a Lambda"),
    Transport("judge", (JUDGE_PREFIX,), "judge:ADDRESS",
              "an LLM judge (forge.lm.judges) grading each completion, or each prompt's group, with the rubric of "
              "its judge: options", "forge.lm.reward_transports:judge", _judge_label, lambda s: f"{s} (LLM judge)",
              "a judge: source", _judge_check, contracts=("forge",), options="judge"),
)}

CONTRACTS: dict[str, Contract] = {c.name: c for c in (
    Contract("forge", "(prompts, completions, **fields) -> scores", "forge.lm.reward_contracts:FORGE",
             "forge.lm.reward_command:verify_forge"),
    Contract("nova", "Amazon Nova's reward Lambda contract (forge.lm.nova_reward)", "forge.lm.reward_contracts:NOVA",
             "forge.lm.reward_command:verify_nova"),
)}


# ------------------------------------------------------------------------------ reading the table
def transport_of(source: str) -> Transport:
    """The row of the transport whose prefix `source` starts with, else the one without prefixes."""
    rows = TRANSPORTS.values()
    return next((t for t in rows if t.prefixes and source.startswith(t.prefixes)), None) \
        or next(t for t in rows if not t.prefixes)


def _and(items: list[str], word: str = "and") -> str:
    return f"{', '.join(items[:-1])} {word} {items[-1]}" if len(items) > 1 else "".join(items)


def check_source(spec: Any) -> None:
    """A reward source's checks at recipe load (a ValueError naming what is wrong): options that belong
    to another transport's sources, the form of its reference, and whether its transport speaks its protocol."""
    row = transport_of(spec.source)
    for other in TRANSPORTS.values():
        if other.options and other is not row and getattr(spec, other.options, None) is not None:
            raise ValueError(f"{other.options}: options need a {other.form} source, not {spec.source!r}")
    row.check(spec.source)
    if row.contracts and spec.protocol not in row.contracts:
        speakers = [t.called for t in TRANSPORTS.values() if not t.contracts or spec.protocol in t.contracts]
        raise ValueError(f"protocol: {spec.protocol} applies to {_and(speakers, 'or')}, not to {row.called}")


def check_protocol(name: str) -> str:
    if name not in CONTRACTS:
        raise ValueError(f"protocol {name!r}: expected {_and([repr(c) for c in CONTRACTS], 'or')}")
    return name


def forms() -> str:
    """Every transport's form and help, for the `source` field's documentation."""
    return "; ".join(f"{t.name} ({t.form}): {t.summary}" for t in TRANSPORTS.values())


def terms() -> str:
    """Every contract's name and terms, for the `protocol` field's documentation."""
    return "; ".join(f"{c.name}: {c.summary}" for c in CONTRACTS.values())


def describe_source(source: str) -> str:
    return transport_of(source).describe(source)
