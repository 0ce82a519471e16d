"""Recipe schema, part one: the data a recipe names (sources, chat formats, hygiene settings),
and the strict base model every recipe section uses."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator


NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"  # names of stages and data sources (they become MLflow keys and file names)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# ---------------------------------------------------------------------------------------- data
class GeneratedText(Strict):
    """Text that forge writes itself (so the quickstart needs no downloads)."""

    kind: Literal["stories", "facts"]
    documents: int = Field(gt=0, le=1_000_000)
    seed: int = 0


class ChatFormat(Strict):
    """How structured records become conversations for SFT and preference data (forge.data.formats)."""

    kind: Literal["messages", "instruction", "prompt_completion", "preference", "hh"]
    fields: dict[str, str] = Field(default_factory=dict, description="logical name -> record field")
    roles: dict[str, str] = Field(default_factory=dict, description="extra role names, e.g. {human: user}")
    chat_template: str | None = Field(None, description="Jinja chat template; default: the tokenizer's, else forge's")
    loss_on: Literal["assistant", "all", "last_assistant"] = "assistant"
    too_long: Literal["truncate", "drop"] = "drop"

    @model_validator(mode="after")
    def _known_fields(self) -> "ChatFormat":
        from forge.data.formats import FormatSpec

        FormatSpec(self.kind, dict(self.fields), dict(self.roles))  # raises ValueError naming the bad key
        return self


class DataSource(Strict):
    """A named source: local files (a path, glob or folder), a saved `datasets` folder, a hub
    dataset (online only), or generated text."""

    path: str | None = None
    hub: str | None = Field(None, description="a Hugging Face hub dataset id, read streaming (needs network)")
    hub_split: str = "train"
    generate: GeneratedText | None = None
    format: Literal["auto", "text", "jsonl", "json", "parquet", "csv", "arrow"] = "auto"
    text_field: Annotated[Union[Annotated[str, Tag("<one>")], Annotated[list[str], Tag("<list>")]],
                          Discriminator(lambda v: "<list>" if isinstance(v, list) else "<one>")] = Field(
        "text", description="field(s) holding text; a list is joined by newlines")
    split: Literal["file", "paragraph", "line"] = Field(
        "paragraph", description="how a plain-text file is cut into documents"
    )
    chat: ChatFormat | None = Field(None, description="structured SFT / preference records instead of plain text")
    proprietary: bool = False
    hygiene: bool | None = Field(None, description="run the recipe's hygiene on this source; default: if proprietary")
    holdout: float = Field(0.05, ge=0, lt=0.5, description="fraction of documents held out for evaluation, in every stage")
    on_error: Literal["fail", "skip"] = Field("fail", description="a bad record stops the run, or is skipped and counted")
    max_errors: int = Field(100, ge=0, description="with on_error: skip, more bad records than this still fail")

    @model_validator(mode="after")
    def _one_origin(self) -> "DataSource":
        if sum(x is not None for x in (self.path, self.hub, self.generate)) != 1:
            raise ValueError("give exactly one of 'path', 'hub' or 'generate'")
        return self

    @property
    def cleaned(self) -> bool:
        return self.proprietary if self.hygiene is None else self.hygiene


class HygieneSettings(Strict):
    """Secrets/PII, deduplication and decontamination for sources with hygiene on (see forge.data.hygiene)."""

    pii: Literal["redact", "drop", "fail", "off"] = "redact"
    pii_types: list[str] | None = None
    dedup: Literal["exact", "near", "off"] = "near"
    near_threshold: float = Field(0.8, gt=0, le=1)
    decontaminate_against: list[str] = Field(default_factory=list, description="sources that are evaluation sets")
    ngram: int = Field(13, ge=0, le=64, description="n-gram length for decontamination; 0 = off")

    @field_validator("pii_types")
    @classmethod
    def _known_types(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            from forge.data.pii import check_types

            check_types(v)  # ValueError names the unknown ones and lists the known
        return v
