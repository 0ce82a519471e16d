"""Recipe schema: the data a recipe names (sources, generated text), and the strict base
model every recipe section uses. A source's `chat:` section is forge.data.formats.FormatSpec and
the recipe's `hygiene:` section is forge.data.hygiene.HygieneConfig: one type each, validated here."""
from __future__ import annotations

import dataclasses
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from forge.data.formats import FormatSpec
from forge.recipe.address import check_address

NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"  # names of stages and data sources (they become MLflow keys and file names)


class Strict(BaseModel):
    """Unknown keys are errors, and a number field takes no true/false (pydantic alone would read
    `batch_size: true` as 1); a number written as text ("3") still reads as its number."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        where = _boolean_number(field.annotation, value) if field is not None else None
        if where == "":
            raise ValueError("expected a number, not true/false")
        if where is not None:
            raise ValueError(f"{info.field_name}{where} is true/false; expected a number")
        return value


def _boolean_number(annotation: Any, value: Any) -> str | None:
    """Where in `value` a bool stands for a number that `annotation` wants ('' for `value` itself,
    else a [index] or .key path); None if nowhere. Models check their own fields; dataclasses (the
    data package's config types) are looked into here."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _boolean_number(args[0], value)
    if origin in (Union, types.UnionType):
        if isinstance(value, bool) and bool in args:
            return None
        found = [_boolean_number(a, value) for a in args if a is not type(None)]
        return next((w for w in found if w is not None), None) if all(w is not None for w in found) else None
    if isinstance(value, bool):
        return "" if annotation in (int, float) else None
    if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)):
        item = (lambda i: args[i] if i < len(args) and args[-1] is not Ellipsis else args[0]) if args else None
        for i, v in enumerate(value):
            where = _boolean_number(item(i), v) if item else None
            if where is not None:
                return f"[{i}]{where}"
    elif origin is dict and isinstance(value, dict) and args:
        for k, v in value.items():
            where = _boolean_number(args[1], v)
            if where is not None:
                return f".{k}{where}"
    elif dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        try:
            types_of = get_type_hints(annotation)
        except (NameError, TypeError):  # a hint that does not resolve: pydantic itself reports it
            return None
        for k, v in value.items():
            where = _boolean_number(types_of[k], v) if k in types_of else None
            if where is not None:
                return f".{k}{where}"
    return None


# ---------------------------------------------------------------------------------------- data
class GeneratedText(Strict):
    """Text that forge writes itself (so the quickstart needs no downloads)."""

    kind: Literal["stories", "facts", "kb_docs", "kb_faq", "kb_chat", "kb_qa", "kb_eval", "harvest_general",
                  "harvest_highquality", "harvest_long", "harvest_skills", "harvest_instructions", "harvest_preferences"] = Field(
        description="kb_*: forge.gen.kb's knowledge base (documents, SFT chat records, eval questions); "
                    "harvest_*: forge-tiny's curated sets (forge.gen.curated)")
    documents: int = Field(gt=0, le=1_000_000)
    seed: int = 0


class Rewrite(Strict):
    """Model-written augmentation, EntiGraph-style (Yang et al. 2024, "Synthetic continued
    pretraining", arXiv:2409.07431): a chat model writes paraphrases of each training document and
    question-answer pairs about it. A pair is kept only if its answer is found in the document, a
    paraphrase only if each of its numbers and capitalised names is; the recipe's PII/secret
    redaction runs on what is kept; the output is cached by source, settings and generator
    (forge.data.rewrite, forge.lm.rewrite)."""

    model: str = Field(min_length=3, description="the generator: a model folder, catalog://FAMILY@PHASE, an "
                       "OpenAI-compatible http(s):// endpoint or bedrock:MODEL_ID")
    paraphrases: int = Field(2, ge=0, le=16, description="paraphrases asked of each training document (one call each)")
    questions: int = Field(3, ge=0, le=32, description="question-answer pairs asked of each training document "
                           "(one call)")
    seed: int = Field(0, ge=0, description="chooses each paraphrase's style; decoding is greedy, so the same seed "
                      "gives the same output")
    max_new_tokens: int = Field(256, gt=0, le=4096, description="the length of each answer of the generator")
    served_model: str | None = Field(None, min_length=1, description="endpoint: the `model` field of the chat "
                                     "request (default: the endpoint's first listed model)")
    api_key_env: str | None = Field(None, min_length=1, description="endpoint: the environment variable holding "
                                    "its API key (the key itself is never recorded)")
    region: str | None = Field(None, description="bedrock: AWS region (default: boto3's)")
    timeout_s: float = Field(120.0, gt=0, le=3600, description="endpoint / bedrock: one request")

    @field_validator("model")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_address(value, "generator")

    @model_validator(mode="after")
    def _asks_something(self) -> Rewrite:
        if self.paraphrases == 0 and self.questions == 0:
            raise ValueError("paraphrases and questions are both 0: nothing to generate")
        return self


class Augment(Strict):
    """Renderings of a text source's documents that make their facts answerable later (Allen-Zhu and
    Li, "Physics of Language Models: Part 3.1", arXiv:2309.14316: a fact seen in one fixed form is
    stored but hard to extract; several renderings with the sentences permuted make it extractable).
    Applied after hygiene, so deduplication never sees the copies as duplicates; a held-out document
    is never copied (forge.data.augment)."""

    renderings: int = Field(1, ge=1, le=64, description="times each training document is written; every copy "
                            "after the first has its sentences in another order")
    seed: int = Field(0, ge=0, description="the permutations' seed")
    rewrite: Rewrite | None = Field(None, description="paraphrases and question-answer pairs written by a chat "
                                    "model, each checked against its document")


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
    text_field: Annotated[Annotated[str, Tag("<one>")] | Annotated[list[str], Tag("<list>")],
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
    augment: Augment | None = Field(None, description="more renderings of each document, and model-written "
                                    "paraphrases and question-answer pairs (text sources)")
    cloze: str | None = Field(None, pattern=NAME, description="fill-in-the-blank questions (chat records) made from the "
                               "sentences of another source's training documents: one per number or name each "
                               "states (forge.data.cloze)")

    @model_validator(mode="after")
    def _one_origin(self) -> DataSource:
        if sum(x is not None for x in (self.path, self.hub, self.generate, self.source, self.cloze)) != 1:
            raise ValueError("give exactly one of 'path', 'hub', 'generate', 'source' or 'cloze'")
        if self.cloze is not None:
            reading = sorted(self.model_fields_set - {"cloze", "proprietary", "holdout"})
            if reading:
                raise ValueError(f"cloze: its questions come from data.{self.cloze}'s cleaned documents, so "
                                 f"{reading} would not apply; give them on data.{self.cloze}")
            self.chat = FormatSpec("messages")
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

    @model_validator(mode="after")
    def _augment_text(self) -> DataSource:
        if self.augment is not None and self.chat is not None:
            raise ValueError("augment: renders plain-text documents; this source holds chat records")
        return self

    @property
    def cleaned(self) -> bool:
        return self.proprietary if self.hygiene is None else self.hygiene
