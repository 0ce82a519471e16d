"""Export formats: the ONE table of the layouts `forge export --format` writes. Every format is the
Hugging Face layout forge.export.layout writes (config.json for the runtime, safetensors shards, the
tokenizer, generation_config.json, MODEL_CARD.md, the manifest); a row says what a format adds to it:
its checks, its own files, the chat template it ships for a model that has none, what the model card
says, and, for a format `forge deploy` takes, the import-job request. The CLI reads --format's
choices and help from this table, export and deploy read the row; nothing else compares format names.

Adding a format is one row below, and a module for its checks and files where it has any (a test can
add a row from inside itself: tests/export/test_toy_format.py). Functions are dotted names, imported
on demand: this table is read while the CLI builds its parser, before torch loads.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from forge.errors import ForgeError

if TYPE_CHECKING:
    from forge.export.source import Source
    from forge.lineage import Lineage


@dataclass(frozen=True)
class Planned:
    """What the export settled before writing anything: what a format's checks and files read."""

    source: Source
    dtype: str                             # bf16 | fp16
    name: str                              # importedModelName
    job: str                               # jobName
    sizes: dict[str, int]                  # tensor -> bytes in the export dtype
    config: dict[str, Any]                 # config.json as exported
    config_changes: dict[str, Any]
    tokenizer_folder: Path                 # where the tokenizer files come from
    tokenizer: dict[str, Any]              # tokenizer_config.json as exported ({}: the checkpoint has none)
    tokenizer_changes: dict[str, Any]
    template_from: str                     # given | model | default | none

    @property
    def weight_bytes(self) -> int:
        return sum(self.sizes.values())


class Format(Protocol):
    """What export, the model card and deploy ask of a format (ExportFormat below is the usual row)."""

    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...          # one line for `forge export --help`
    @property
    def card(self) -> str: ...             # the layout MODEL_CARD.md says the export is in
    @property
    def use(self) -> tuple[str, ...]: ...  # lines the card's Use section adds (how to deploy it)
    @property
    def deploys(self) -> bool: ...         # whether `forge deploy` takes the export

    def problems(self, planned: Planned) -> list[str]: ...
    def files(self, planned: Planned) -> dict[str, str]: ...
    def chat_template(self) -> str | None: ...
    def job_request(self, names: dict[str, str], role_arn: str, s3_uri: str, lineage: Lineage | None,
                    extra_tags: dict[str, str]) -> dict[str, Any]: ...


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class ExportFormat:
    """A row of the table; its functions are dotted names, so a row costs no import until used."""

    name: str
    summary: str                      # one line for `forge export --help`
    card: str                         # the layout MODEL_CARD.md says the export is in
    checks: str | None = None         # "module:function" (Planned) -> problems, each naming what is supported
    own_files: str | None = None      # "module:function" (Planned) -> {file name: text} beside the layout
    template: str | None = None       # "module:NAME": the chat template shipped where the model has none
    # "module:function" (names, role_arn, s3_uri, lineage, extra_tags) -> the import-job request forge
    # deploy submits; None: a format deploy refuses
    request: str | None = None
    use: tuple[str, ...] = ()         # lines the card's Use section adds (how to deploy it)

    @property
    def deploys(self) -> bool:
        return self.request is not None

    def problems(self, planned: Planned) -> list[str]:
        return list(_resolve(self.checks)(planned)) if self.checks else []

    def files(self, planned: Planned) -> dict[str, str]:
        return dict(_resolve(self.own_files)(planned)) if self.own_files else {}

    def chat_template(self) -> str | None:
        return str(_resolve(self.template)) if self.template else None

    def job_request(self, names: dict[str, str], role_arn: str, s3_uri: str, lineage: Lineage | None,
                    extra_tags: dict[str, str]) -> dict[str, Any]:
        """The import-job request for an export named `names` (importedModelName, jobName), its tags
        carrying the lineage and `extra_tags`; a ForgeError where the format is not deployed."""
        if self.request is None:
            raise ForgeError(f"--role-arn/--s3-uri write an import job for forge deploy, which does not take "
                             f"--format {self.name}: use --format {' or '.join(deploying())}")
        request: dict[str, Any] = _resolve(self.request)(names, role_arn, s3_uri, lineage, extra_tags)
        return request


DEPLOY_LINE = ("- Bedrock: `forge deploy FOLDER --s3-uri s3://bucket/prefix/ --role-arn ARN` uploads it and starts "
               "a Custom Model Import job")

FORMATS: dict[str, Format] = {f.name: f for f in (
    ExportFormat("bedrock", "checked against Amazon Bedrock Custom Model Import's rules before anything is written, "
                 "for forge deploy", "Amazon Bedrock Custom Model Import",
                 checks="forge.export.bedrock:problems", template="forge.export.bedrock:DEFAULT_CHAT_TEMPLATE",
                 request="forge.export.bedrock:import_request", use=(DEPLOY_LINE,)),
    ExportFormat("hf", "for any Hugging Face runtime (transformers 4.51.3 or later), with no service's limits",
                 "Hugging Face"),
)}


def row(name: str, what: str = "--format") -> Format:
    """The table's row for a format name; a ForgeError listing the formats for any other."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ForgeError(f"{what} {name!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def deploying() -> list[str]:
    """The formats `forge deploy` takes."""
    return [f.name for f in FORMATS.values() if f.deploys]
