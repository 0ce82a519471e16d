"""The SDK's JSON requests (tinker.types.*Request, as `model_dump(exclude_none=True)` sends them),
read leniently: a newer SDK may add fields, which are ignored, while a missing or mistyped field is
refused (422, naming it). Responses are plain dicts shaped as the SDK's response types."""
from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from forge.errors import ForgeError


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSession(Lenient):
    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""
    project_id: str | None = None
    display_name: str | None = None


class SessionRef(Lenient):
    session_id: str


class LoraRequest(Lenient):
    rank: int = Field(gt=0, le=4096)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerChoice(Lenient):
    type: str = "adamw"


class CreateModel(Lenient):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraRequest | None = None
    optimizer_config: OptimizerChoice = Field(default_factory=OptimizerChoice)


class ModelRef(Lenient):
    model_id: str


class AdamParams(Lenient):
    """tinker.types.AdamParams, with its defaults."""

    learning_rate: float = Field(1e-4, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)
    type: str | None = None  # set by non-Adam families (DimuonParams), which are refused


class OptimStep(Lenient):
    # the SDK writes AdamParams under adam_params and other families under optimizer_params
    optim_params: AdamParams = Field(validation_alias=AliasChoices("optim_params", "adam_params", "optimizer_params"))
    model_id: str
    seq_id: int | None = None


class RetrieveFuture(Lenient):
    request_id: str
    allow_metadata_only: bool = False


class SaveWeights(Lenient):
    """tinker.types.SaveWeightsRequest (save_state) and SaveWeightsForSamplerRequest: `path` is the
    checkpoint's name; a sampler save without one asks for a sampling session instead."""

    model_id: str
    path: str | None = None
    seq_id: int | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None
    ttl_seconds: int | None = Field(None, ge=1, le=10 * 365 * 86400)  # None: never expires; at most 10 years
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"


class LoadWeights(Lenient):
    """tinker.types.LoadWeightsRequest: onto a model (model_id), or a new model of a session
    (session_id, model_seq_id) whose LoRA settings come from the checkpoint."""

    path: str
    optimizer: bool = False
    model_id: str | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: dict[str, Any] | None = None
    optimizer_config: OptimizerChoice | None = None
    weights_access_token: str | None = None


class CreateSamplingSession(Lenient):
    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None


class Chunk(Lenient):
    type: str = "encoded_text"
    tokens: list[int] = Field(default_factory=list)


class ModelInput(Lenient):
    chunks: list[Chunk]


class SamplingParams(Lenient):
    """tinker.types.SamplingParams, with its defaults."""

    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0, le=1)


class Sample(Lenient):
    """tinker.types.SampleRequest; of its options, prompt_logprobs (and prompt_logprobs_last_n) are served."""

    sampling_session_id: str | None = None
    seq_id: int | None = None
    num_samples: int = Field(1, ge=1, le=1024)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    prompt_logprobs_last_n: int | None = Field(None, ge=1)
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0
    record_stability_info: bool | None = None


class TinkerPath(Lenient):
    tinker_path: str


def future(request_id: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """tinker.types.UntypedAPIFuture: what every asynchronous call answers at once (a sample's also
    names its sequences: sample_sequence_ids)."""
    return {"request_id": request_id, **({"model_id": model_id} if model_id else {}), **extra}


def failed(error: str, category: str) -> dict[str, Any]:
    """tinker.types.RequestFailedResponse: a future that ended in an error ("user" or "server")."""
    return {"error": error, "category": category}


def try_again(request_id: str) -> dict[str, Any]:
    """tinker.types.TryAgainResponse: still running; the SDK polls again at once (after our long poll)."""
    return {"type": "try_again", "request_id": request_id, "queue_state": "active"}


class Refused(ForgeError):
    """A request refused before it runs: `status` is the HTTP status (400 bad input, 403 another
    API key's session or checkpoint, 404 unknown id, 410 an ended session; never 408, 409, 429 or
    5xx, which the SDK retries), the message says which field and what was expected."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
