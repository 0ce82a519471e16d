"""Settings of the reinforcement fine-tuning stage (kind `rft`): its reward sources (files, modules,
HTTP endpoints, Lambdas, LLM judges), its rollout mode, and the stage itself; split from settings.py,
whose post-training base (PostTrainSettings) it extends."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from forge.recipe.data import Strict
from forge.recipe.judge import JudgeOptions
from forge.recipe.reward_table import check_protocol, check_source, forms, terms
from forge.recipe.settings import Optim, PostTrainSettings, Schedule


class RewardSource(Strict):
    """A reward function: `source` names the code and how forge reaches it (its transport, by the
    source's form), `protocol` what it receives and returns (its contract); both are rows of
    forge.recipe.reward_table. A `judge:ADDRESS` source grades as its `judge:` options say
    (forge.recipe.judge)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    source: str = Field(min_length=3, description=forms())
    weight: float = 1.0
    timeout_s: float = Field(30.0, gt=0, le=3600)
    retries: int = Field(2, ge=0, le=20, description="http: attempts after the first")
    concurrency: int = Field(4, gt=0, le=256, description="http / lambda: requests in flight")
    batch_size: int = Field(64, gt=0, description="http / lambda: completions per request")
    region: str | None = Field(None, description="lambda: AWS region (default: boto3's)")
    protocol: str = Field("forge", description=terms())
    judge: JudgeOptions | None = None  # a judge: source's rubric, scoring and score scale

    @field_validator("protocol")
    @classmethod
    def _contract(cls, value: str) -> str:
        return check_protocol(value)

    @model_validator(mode="after")
    def _form(self) -> RewardSource:
        check_source(self)
        return self


class Rollout(Strict):
    """How RFT's rollouts relate to the policy: on_policy (made with the weights about to be updated), or
    off_policy_async (the next rollout generated in a background thread on a copy of the weights, synced
    at each rollout, while the current one trains; a rollout more than `max_age` policy versions old is
    dropped and made anew; the loss weights each token by the truncated importance ratio, at most `is_cap`)."""

    mode: Literal["on_policy", "off_policy_async"] = "on_policy"
    max_age: int = Field(1, ge=0, le=64, description="off_policy_async: policy versions a rollout may lag; "
                         "0 generates nothing ahead (the same results as on_policy)")
    is_cap: float = Field(2.0, ge=1.0, description="off_policy_async: the truncation of importance weights")


class RftStage(PostTrainSettings):
    """Reinforcement fine-tuning (GRPO, Shao et al. 2024): per prompt `group` sampled completions,
    rewards from the recipe's functions, group-normalised advantages, a clipped policy-ratio
    objective and an optional KL penalty toward the input checkpoint. `batch_size` counts prompts;
    the data rows give the prompt (`prompt_field`) and the reward functions' extra fields."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
    kind: Literal["rft"]
    reads: ClassVar[str] = "prompts"
    evaluates: ClassVar[tuple[str, ...]] = ("reward",)
    env: str | None = Field(None, description="multi-turn agentic RFT: an environment file.py:Class or module:Class "
                            "(reset/step, optional tools; forge.lm.agent) whose steps reward each trajectory")
    max_turns: int = Field(4, ge=1, le=64, description="env: the policy's turns in a trajectory at most")
    eval_tasks: int = Field(0, ge=0, description="env: held-out tasks (the data's held-out split) whose greedy "
                            "trajectory reward is measured at the start, every eval.every steps and the end")
    rewards: list[RewardSource] = Field(default_factory=list)
    prompt_field: str = "prompt"
    group: int = Field(4, ge=2, le=1024)
    max_new_tokens: int = Field(32, gt=0, le=32_768)
    temperature: float = Field(1.0, gt=0, le=10)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens only; 0: no cut (TRL's default, "
                       "and the distribution the loss scores)")
    clip_eps: float = Field(0.2, gt=0, lt=1)
    kl_beta: float = Field(0.0, ge=0, description="KL penalty toward the input checkpoint; 0 = none")
    updates_per_rollout: int = Field(1, ge=1, le=64, description="optimizer steps on each batch of rollouts")
    reward_norm: Literal["sum", "per_reward"] = Field("sum", description="sum: the weighted sum normalised in its group "
                                                      "(GRPO); per_reward: each reward normalised in its group, then "
                                                      "the weighted sum normalised over the batch (GDPO, Liu et al. 2026)")
    generation: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers generate with sampling; vllm: vLLM's offline engine, weights synced each rollout")
    vllm_gpu_memory: float = Field(0.3, gt=0, le=1, description="vllm: share of GPU memory its engine may take")
    batch_size: int = Field(4, gt=0, le=65_536)
    optim: Optim = Optim(lr=1e-5)
    schedule: Schedule = Schedule(kind="constant")
    rollout: Rollout = Rollout()

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, value: list[RewardSource], info: ValidationInfo) -> list[RewardSource]:
        if not value and info.data.get("env") is None:
            raise ValueError("give at least one reward source (or an env: whose steps reward the trajectory)")
        return value

    @model_validator(mode="after")
    def _env_generation(self) -> RftStage:
        if self.env is not None and self.generation != "hf":
            raise ValueError("env: multi-turn rollouts generate with generation: hf (vllm is not supported with env)")
        if self.env is not None and ":" not in self.env:
            raise ValueError(f"env {self.env!r}: expected file.py:Class or module:Class")
        if self.rollout.mode == "off_policy_async" and self.generation != "hf":
            raise ValueError("rollout: off_policy_async generates with forge's own generator (generation: hf)")
        return self

    @field_validator("generation")
    @classmethod
    def _vllm_installed(cls, value: str) -> str:
        import importlib.util

        if value == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError("generation: vllm needs the vllm package, which is not installed here "
                             "(pip install vllm, on a machine with a supported GPU), or use generation: hf")
        return value
