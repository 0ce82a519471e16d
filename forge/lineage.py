"""The Novella's lineage, typed and versioned: where it came from (base, data sources, each stage's
settings, checkpoints, tokens and metrics), how it was evaluated and what it cost, read and
written as `lineage.json` (files from before the version field still read). Its JSON form passes
`forge.scrub`: no secret or personal data from paths, settings or errors is written."""
from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

import forge
from forge.errors import ForgeError
from forge.files import atomic_dir
from forge.scrub import scrub_dict

LINEAGE_VERSION = 1  # 0: the untyped dict forge wrote before it had a version field (same shape)


def _without_absent(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The serialised record without the optional keys that are None (absent, not null, in the JSON)."""
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data


class _Record(BaseModel):
    """A lineage record: unknown keys are an error, and optional parts that are absent stay absent
    in the JSON (rather than written as null)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    omitted_when_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        return _without_absent(handler(self), self.omitted_when_none)


class CatalogBaseRecord(_Record):
    """A `catalog://FAMILY@PHASE` base as the catalog resolved it (forge.catalog.CatalogPhase.record)."""

    omitted_when_none = ("registered_from",)
    ref: str
    family: str
    phase: str
    point: str                   # pretrained | mid-trained | post-trained
    location: str                # hf://REPO@REVISION, or the registered / built folder
    revision: str = ""
    registered_from: dict[str, Any] | None = None  # a registered Novella's own lineage, in brief


class BaseRecord(_Record):
    omitted_when_none = ("catalog",)
    spec: str | dict[str, Any]   # the recipe's base: a path or catalog reference, or {"scratch": {...}}
    checkpoint: str = ""         # the folder the first stage started from
    catalog: CatalogBaseRecord | None = None  # a catalog reference: what it resolved to


class CleanedRecord(_Record):
    file: str
    sha256: str


class DataRecord(_Record):
    """A data source as read and as trained on: never its content, only where, how big, its hash."""

    omitted_when_none = ("cleaned", "augment")
    location: str = ""
    files: list[str] = []
    format: str = ""
    text_fields: list[str] = []
    proprietary: bool = False
    bytes: int = 0
    sha256: str = ""
    tokens: int = 0              # tokens trained on, over all stages
    skipped_records: int = 0
    cleaned: CleanedRecord | None = None  # the hygiene cache the stages read instead, when cleaned
    augment: dict[str, Any] | None = None  # model-written augmentation: its generator and counts kept/dropped


class MergeRecord(_Record):
    weight: float
    trained_checkpoint: str
    input_checkpoint: str
    output_checkpoint: str


class StageRecord(_Record):
    """One stage as it ran. What a kind adds of its own (pretrain's shares and context, soup's
    ingredients, dpo's reference, ...) is `extras`, written beside the common keys in the JSON."""

    omitted_when_none = ("merge", "evaluation")
    name: str
    kind: str
    settings: dict[str, Any] = {}
    input_checkpoint: str = ""
    output_checkpoint: str = ""
    steps: int = 0
    tokens_by_source: dict[str, int] = {}
    metrics: dict[str, Any] = {}
    merge: MergeRecord | None = None
    evaluation: dict[str, Any] | None = None  # eval.after_each_stage: the suite on this stage's output
    extras: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _gather_extras(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "extras" in data:
            return data
        known = {k: v for k, v in data.items() if k in cls.model_fields}
        return {**known, "extras": {k: v for k, v in data.items() if k not in cls.model_fields}}

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        data = _without_absent(handler(self), self.omitted_when_none)
        extras = data.pop("extras", {})
        return {**data, **extras}


class ComputeRecord(_Record):
    """A training stage's compute: measured here, and planned on the recipe's target when planned."""

    omitted_when_none = ("target", "planned_steps", "planned_tokens", "planned_hours", "planned_flops")
    steps: int
    tokens: int
    train_hours: float
    target: str | None = None
    planned_steps: int | None = None
    planned_tokens: int | None = None
    planned_hours: float | None = None
    planned_flops: float | None = None


class GateRecord(_Record):
    """One gate on the Novella (forge.eval.gates.GateResult.as_dict)."""

    gate: str = ""
    metric: str = ""
    value: float | None = None   # None: the suite did not measure it (a failure)
    limit: float = 0.0
    kind: str = ""               # "min" or "max"
    passed: bool
    text: str


class EvaluationRecord(_Record):
    """The suite's comparison (forge.eval.suite.Comparison.as_dict: baseline, models, deltas, ...),
    the gates, and where the registry put the Novella."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)  # the comparison's own keys may grow
    omitted_when_none = ("alias", "version")
    comparison_schema: str = Field("", alias="schema")
    baseline: str = ""
    models: list[dict[str, Any]] = []
    deltas: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    domain: list[str] = []
    general: list[str] = []
    primary: str = ""
    gates: list[GateRecord] = []
    passed: bool = True
    markdown: str = ""
    alias: str | None = None           # registered: which alias the version took, and why
    version: int | None = None         # registered: the model version


class Lineage(_Record):
    """The Novella's record (`lineage.json`)."""

    omitted_when_none = ("evaluation", "compute")
    version: int = LINEAGE_VERSION
    name: str
    created: str = ""
    forge_version: str = ""
    base: BaseRecord
    data: dict[str, DataRecord] = {}
    stages: list[StageRecord] = []
    metrics: dict[str, Any] = {}        # the last stage's final metrics
    hygiene: dict[str, int] = {}
    evaluation: EvaluationRecord | None = None
    compute: dict[str, ComputeRecord] | None = None

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """Older files to this version (0 -> 1 only added the field); newer ones are refused."""
        if not isinstance(data, dict):
            return data
        version = data.get("version", 0)
        if not isinstance(version, int) or version > LINEAGE_VERSION:
            raise ValueError(f"lineage version {version!r}: this forge reads versions up to {LINEAGE_VERSION} "
                             "(written by a newer forge?)")
        return {**data, "version": LINEAGE_VERSION}

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form, as `lineage.json` holds it (non-finite floats kept, as json writes them;
        every string scrubbed by forge.scrub)."""
        return scrub_dict(self.model_dump(by_alias=True))

    def write(self, path: Path) -> Path:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))
        return Path(path)

    @classmethod
    def read(cls, path: Path) -> Lineage:
        """A `lineage.json`, of this version or an older one; a ForgeError naming the file if it is not one."""
        try:
            return cls.model_validate(json.loads(Path(path).read_text()))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ForgeError(f"{path}: not a forge lineage: {where + ': ' if where else ''}{first['msg']}"
                             + (f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else "")) from None
        except ValueError as e:  # not JSON
            raise ForgeError(f"{path}: not a forge lineage: {e}") from None


class ReadSource(Protocol):
    """What a source record is made from (forge.data.sources.Source has these)."""

    location: str
    files: list[Path]
    format: str
    text_fields: list[str] | tuple[str, ...]
    proprietary: bool

    @property
    def size_bytes(self) -> int: ...

    def fingerprint(self) -> str: ...


def source_record(src: ReadSource, fingerprint: str, used: ReadSource) -> DataRecord:
    """A data source as read (`src`) and as trained on (`used`: the hygiene cache, if cleaned)."""
    cleaned = CleanedRecord(file=str(used.files[0]), sha256=used.fingerprint()) if used is not src else None
    return DataRecord(location=src.location, files=[str(p) for p in src.files], format=src.format,
                      text_fields=list(src.text_fields), proprietary=src.proprietary, bytes=src.size_bytes,
                      sha256=fingerprint, cleaned=cleaned)


def base_spec(base: Any) -> str | dict[str, Any]:
    """The recipe's `base:` as lineage records it: the path or `catalog://FAMILY@PHASE` reference
    as written (what it resolved to goes in BaseRecord.catalog), or {"scratch": settings}."""
    return base if isinstance(base, str) else {"scratch": base.scratch.model_dump()}


def new_lineage(name: str, base: str | dict[str, Any], base_checkpoint: Path,
                catalog: dict[str, Any] | None = None) -> Lineage:
    """A Novella's lineage before its stages run (`base`: from base_spec; `catalog`: a catalog
    base's record, forge.catalog.CatalogPhase.record())."""
    record = BaseRecord(spec=base, checkpoint=str(base_checkpoint),
                        catalog=CatalogBaseRecord(**catalog) if catalog else None)
    return Lineage(name=name, created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   forge_version=forge.__version__, base=record)


def write_novella(checkpoint: Path, out: Path, lineage: Lineage) -> Path:
    """The Novella folder: the final checkpoint's weights, tokenizer and config, plus lineage.json."""
    with atomic_dir(out) as tmp:
        for item in Path(checkpoint).iterdir():
            if item.name not in ("forge_state.json", "training_state.pt", "manifest.json"):  # run state, not the model
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        lineage.write(tmp / "lineage.json")
    return out
