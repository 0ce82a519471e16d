"""Recipe schema: the data a recipe names (sources, generated text), and the strict base
model every recipe section uses. A source's `chat:` section is forge.data.formats.FormatSpec and
the recipe's `hygiene:` section is forge.data.hygiene.HygieneConfig: one type each, validated here."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from forge.data.formats import FormatSpec


NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"  # names of stages and data sources (they become MLflow keys and file names)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# ---------------------------------------------------------------------------------------- data
class GeneratedText(Strict):
    """Text that forge writes itself (so the quickstart needs no downloads)."""

    kind: Literal["stories", "facts", "kb_docs", "kb_faq", "kb_chat", "kb_qa", "kb_eval", "harvest_general", "harvest_highquality",
                  "harvest_long", "harvest_skills", "harvest_instructions", "harvest_preferences"] = Field(
        description="kb_*: forge.data.kb's knowledge base (documents, SFT chat records, eval questions); "
                    "harvest_*: forge-tiny's curated sets (forge.data.curated)")
    documents: int = Field(gt=0, le=1_000_000)
    seed: int = 0


class DataSource(Strict):
    """A named source: local files (a path, glob or folder), a saved `datasets` folder, a hub
    dataset (online only), generated text, or a catalog family's curated set (`source:
    curated://FAMILY/NAME`, whose text field, chat format and holdout come from the catalog)."""

    path: str | None = None
    hub: str | None = Field(None, description="a Hugging Face hub dataset id, read streaming (needs network)")
    hub_split: str = "train"
    generate: GeneratedText | None = None
    source: str | None = Field(None, pattern=r"^curated://", description="a catalog family's curated set to replay: "
                               "curated://FAMILY/NAME (forge catalog show FAMILY lists them)")
    revision: str | None = Field(None, min_length=1, description="a hub set's revision instead of the pinned one")
    max_tokens: int | None = Field(None, gt=0, description="read at most about this many tokens (~4 characters "
                                   "each) of the source: the budget of a remote set")
    max_records: int | None = Field(None, gt=0, description="read at most this many records of the source")
    format: Literal["auto", "text", "jsonl", "json", "parquet", "csv", "arrow"] = "auto"
    text_field: Annotated[Union[Annotated[str, Tag("<one>")], Annotated[list[str], Tag("<list>")]],
                          Discriminator(lambda v: "<list>" if isinstance(v, list) else "<one>")] = Field(
        "text", description="field(s) holding text; a list is joined by newlines")
    split: Literal["file", "paragraph", "line"] = Field(
        "paragraph", description="how a plain-text file is cut into documents"
    )
    chat: FormatSpec | None = Field(None, description="structured SFT / preference records instead of plain text")
    proprietary: bool = False
    hygiene: bool | None = Field(None, description="run the recipe's hygiene on this source; default: if proprietary")
    holdout: float = Field(0.05, ge=0, lt=0.5, description="fraction of documents held out for evaluation, in every stage")
    on_error: Literal["fail", "skip"] = Field("fail", description="a bad record stops the run, or is skipped and counted")
    max_errors: int = Field(100, ge=0, description="with on_error: skip, more bad records than this still fail")

    @model_validator(mode="after")
    def _one_origin(self) -> "DataSource":
        if sum(x is not None for x in (self.path, self.hub, self.generate, self.source)) != 1:
            raise ValueError("give exactly one of 'path', 'hub', 'generate' or 'source'")
        if self.source is not None:
            self._from_catalog()
        elif self.revision is not None and self.hub is None:
            raise ValueError("revision: applies to hub datasets (hub: or a curated hub set)")
        return self

    def _from_catalog(self) -> None:
        """The curated set's own reading settings, where the recipe does not give them."""
        from forge.catalog import curated
        from forge.errors import ForgeError

        try:
            found = curated(self.source or "")
        except ForgeError as e:
            raise ValueError(str(e)) from None
        if self.revision is not None and found.hub is None:
            raise ValueError(f"revision: {found.ref} is a local set (built with its family); only hub sets have revisions")
        if "text_field" not in self.model_fields_set and found.text_field:
            self.text_field = found.text_field
        if self.chat is None and found.chat:
            self.chat = FormatSpec(**found.chat)
        if "holdout" not in self.model_fields_set and found.holdout is not None:
            self.holdout = found.holdout

    @property
    def cleaned(self) -> bool:
        return self.proprietary if self.hygiene is None else self.hygiene
