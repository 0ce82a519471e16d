"""The registry of stage settings classes: StageSettings, the base each stage kind's settings
derive from, registers every subclass that declares `kind: Literal["NAME"]` under NAME, and
AnyStage, the type of a recipe's `stages[i]`, validates an item with the class of its kind."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import Field
from pydantic_core import PydanticCustomError, core_schema

from forge.recipe.data import NAME, Strict

DATA_SHAPES = ("text", "chat", "preference", "prompts")  # what a stage kind's data records hold
SETTINGS: dict[str, type[StageSettings]] = {}  # kind -> settings class, filled as classes are defined


def kind_name(cls: type) -> str | None:
    """The kind a settings class declares (`kind: Literal["sft"]`), or None for a shared base."""
    field = getattr(cls, "model_fields", {}).get("kind")
    args = get_args(field.annotation) if field is not None and get_origin(field.annotation) is Literal else ()
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


class StageSettings(Strict):
    """What the recipe asks of every stage kind's settings: a name, the data sources it reads and
    where they sit in the stage (for error paths), and two facts the validators and the kinds table
    read from the class: `reads`, the shape of its data records (one of DATA_SHAPES), and
    `evaluates`, what the evaluation suite measures for it ("perplexity", "preference", "reward").
    A subclass that declares `kind: Literal["NAME"]` is registered under NAME in SETTINGS, which is
    what `stages[i]` of a recipe accepts."""

    reads: ClassVar[str] = "text"
    evaluates: ClassVar[tuple[str, ...]] = ()
    name: str = Field(pattern=NAME)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        kind = kind_name(cls)
        if kind is None:
            return
        if cls.reads not in DATA_SHAPES:
            raise TypeError(f"{cls.__name__}.reads is {cls.reads!r}; expected one of {DATA_SHAPES}")
        SETTINGS[kind] = cls

    @property
    def sources(self) -> dict[str, float]:
        """The data sources this stage reads, with their weights."""
        return {}

    def source_paths(self) -> dict[str, str]:
        """Each source's dotted path inside the stage (`data[0]`, `mixture.customer.web`)."""
        return {}


def stage_kinds() -> tuple[str, ...]:
    """The kinds a recipe's `stages[i]` accepts, in the order their settings were defined."""
    return tuple(SETTINGS)


class AnyStage:
    """The type of a recipe's `stages[i]`: the settings class registered under the item's `kind`,
    looked up when a recipe is validated (so a kind defined after this module, in a test or a
    plugin, is accepted); an unknown kind is an error listing the allowed ones."""

    @staticmethod
    def members() -> list[type]:
        return list(SETTINGS.values())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        def validate(value: Any) -> StageSettings:
            kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
            settings = SETTINGS.get(kind) if isinstance(kind, str) else None
            if settings is None:
                raise PydanticCustomError("stage_kind", "'kind' must be one of {kinds}", {"kinds": list(SETTINGS)})
            return settings.model_validate(value)

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v, info: v.model_dump(mode=info.mode, exclude_defaults=info.exclude_defaults,
                                             exclude_none=info.exclude_none, by_alias=info.by_alias),
                info_arg=True))


BLOCKS: dict[str, type[EvaluatorSettings]] = {}  # eval: key -> settings class, filled as classes are defined


class EvaluatorSettings(Strict):
    """An evaluator's settings block under `eval:` (forge.eval.table runs it). A subclass that
    declares `block: ClassVar[str] = "NAME"` is registered under NAME in BLOCKS; `eval:` accepts
    every registered block, its own fields (the built-in ones) and any other (a test's, a plugin's)."""

    block: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        name = cls.__dict__.get("block")
        if name:
            if not name.isidentifier():
                raise TypeError(f"{cls.__name__}.block is {name!r}; expected a key name (letters, digits, _)")
            BLOCKS[name] = cls

    def sources(self) -> list[str]:
        """The data sources it reads (checked against the recipe's `data:`): its `source`, if any."""
        source = getattr(self, "source", None)
        return [source] if isinstance(source, str) else []
