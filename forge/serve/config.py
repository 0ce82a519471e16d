"""serve.yaml: which base models clients may train, the API keys that may call, and how models run.

    models:                          # what clients pass as base_model (a name, or the base itself)
      - name: tiny
        base: /data/checkpoints/tiny    # a Hugging Face checkpoint folder, or catalog://FAMILY@PHASE
    api_keys: [tml-...]              # accepted X-API-Key values (the SDK requires the tml- prefix)
    api_keys_env: FORGE_SERVE_KEYS   # and/or: comma-separated keys from this environment variable
    precision: fp32                  # fp32 or bf16 (mixed precision on an accelerator)
    lora_alpha: 32                   # LoRA scale numerator (the adapters' rank comes from each client)
    session_timeout_s: 300           # a session with no heartbeat for this long ends; its models are freed
    workdir: /tmp/forge-serve        # scratch for served models (default: a new temporary folder)
    checkpoint_dir: /data/serve-ckpt # save_state / save_weights_for_sampler write here (default:
                                     # workdir/checkpoints, gone with a temporary workdir)
    tracking:                        # each training client an MLflow run (default: not tracked)
      uri: sqlite:////data/mlflow.db
      experiment: forge-serve
      register: served-tiny          # each save_state a new version of this registered model (default: none)
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forge import catalog
from forge.errors import ForgeError
from forge.recipe.schema import MODEL_NAME

KEY_PREFIX = "tml-"  # the SDK refuses to send a key without it (tinker.lib._auth_token_provider)


class BaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    base: str = Field(min_length=1)
    tokenizer_id: str | None = None  # what get_info tells the SDK's get_tokenizer (default: the local folder)

    @property
    def is_catalog(self) -> bool:
        return catalog.is_ref(self.base)


class TrackingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    uri: str = Field(min_length=1)          # an MLflow tracking URI (sqlite:///FILE, http(s)://SERVER, a folder)
    experiment: str = Field("forge-serve", min_length=1)
    # `register:` (BaseModel has a `register`): the registered model each save_state's weights,
    # merged into the base, are a new version of
    model_name: str | None = Field(None, alias="register")

    @field_validator("model_name")
    @classmethod
    def _model_name(cls, name: str | None) -> str | None:
        if name is not None and not re.fullmatch(MODEL_NAME, name):
            raise ValueError(f"{name!r} is not a registered model name: expected a letter, then letters, digits, "
                             "'_', '.' or '-' (as a recipe's name)")
        return name


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[BaseSpec] = Field(min_length=1)
    api_keys: list[str] = Field(default_factory=list)
    api_keys_env: str | None = None
    precision: Literal["fp32", "bf16"] = "fp32"
    lora_alpha: float = Field(32.0, gt=0)
    session_timeout_s: float = Field(300.0, gt=0)
    workdir: Path | None = None
    checkpoint_dir: Path | None = None
    tracking: TrackingSpec | None = None

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[BaseSpec]) -> list[BaseSpec]:
        names = [m.name for m in models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"model names must be unique; repeated: {twice}")
        return models

    def keys(self) -> frozenset[str]:
        """Every accepted key: the listed ones and those of `api_keys_env` (read now)."""
        extra = os.environ.get(self.api_keys_env, "") if self.api_keys_env else ""
        return frozenset(self.api_keys) | {k.strip() for k in extra.split(",") if k.strip()}

    def find(self, base_model: str) -> BaseSpec | None:
        """The base a client names by its configured name or by its base exactly."""
        return next((m for m in self.models if base_model in (m.name, m.base)), None)


def load_config(path: str | Path) -> ServeConfig:
    """Read and check serve.yaml; every problem names the field and what was expected."""
    file = Path(path)
    try:
        raw: Any = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise ForgeError(f"{file}: no such serve config") from None
    except yaml.YAMLError as e:
        raise ForgeError(f"{file}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ForgeError(f"{file}: expected a mapping with models: and api_keys:, got {type(raw).__name__}")
    try:
        cfg = ServeConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ForgeError(f"{file}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
    check(cfg, file)
    return cfg


def check(cfg: ServeConfig, file: Path | str) -> None:
    """Refuse a config no client could use: no key, a key the SDK cannot send, a base that is not there."""
    keys = cfg.keys()
    if not keys:
        env = f" (the environment variable {cfg.api_keys_env} is empty or unset)" if cfg.api_keys_env else ""
        raise ForgeError(f"{file}: api_keys: at least one API key is required{env}; every request must carry one")
    if any(not k.startswith(KEY_PREFIX) for k in keys):
        raise ForgeError(f"{file}: api_keys: every key must start with {KEY_PREFIX!r} (the Tinker SDK sends no "
                         "other); the key values are not shown here")
    for i, m in enumerate(cfg.models):
        if m.is_catalog:
            try:
                catalog.resolve(m.base)
            except ForgeError as e:
                raise ForgeError(f"{file}: models[{i}].base: {e}") from None
        elif not (Path(m.base).expanduser() / "config.json").is_file():
            raise ForgeError(f"{file}: models[{i}].base: {m.base} is not a Hugging Face checkpoint folder "
                             "(no config.json) nor a catalog://FAMILY@PHASE reference")
