"""Reward functions named in a recipe, living in the customer's environment.

A source's transport (its form: a Python `file.py:function` or `module:function`, an `http(s)://`
endpoint, a `lambda:` function, a `judge:` LLM judge) and its contract (`protocol`: forge's
`(prompts, completions, **fields) -> scores`, or Amazon Nova's) are rows of
forge.recipe.reward_table; a `Reward` builds the transport's channel (forge.lm.reward_transports,
forge.lm.reward_http) and calls it with the contract's payload (forge.lm.reward_contracts).
`timeout_s` bounds the whole call, whatever the source: every chunk and every retry of an HTTP
source, the Python function however it blocks. A call that raises, exits, crashes, times out,
returns the wrong number of scores or a non-finite one raises RewardError naming the source and
the batch.
"""
from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path
from types import TracebackType
from typing import Any

from forge.lm.reward_channel import Call, Channel, ContractCode, Fields, Metrics, RewardError, RewardStopped, Setup
from forge.lm.reward_contracts import check_scores
from forge.lm.reward_workers import Interrupted, WorkerFailed, WorkerTimeout
from forge.recipe.reward_table import CONTRACTS, transport_of
from forge.recipe.rft_settings import RewardSource

__all__ = ["Reward", "RewardError", "RewardStopped", "check_scores", "unique_labels"]


class Reward:
    """One reward source of a stage: call(prompts, completions, fields, batch) -> list[float].
    Its transport is built here (a Python source's worker process starts: a bad file or module fails
    at once); `close()` (or the `with` block) ends it. `metrics` holds the last call's figures beside
    the scores (a Nova source's metrics_list values, by type.name)."""

    def __init__(self, spec: RewardSource, root: Path | None = None, lambda_client: Any = None,
                 cache_dir: Path | None = None):
        self.spec, self.source, self.weight = spec, spec.source, spec.weight
        transport = transport_of(spec.source)
        self.label = transport.label(spec)
        self.contract: ContractCode = CONTRACTS[spec.protocol].spoken()
        self.metrics: Metrics = {}
        # lambda_client: a judge's Bedrock client too
        self._channel: Channel = transport.built(spec, Setup(root, lambda_client, cache_dir))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Reward:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __call__(self, prompts: list[str], completions: list[str], fields: Fields, batch: int,
                 messages: list[list[dict[str, Any]]] | None = None) -> list[float]:
        """Scores of the completions; `messages` are their prompts as chat messages (Nova's event
        carries them; by default each prompt is one user turn)."""
        where = f"reward {self.source!r} on batch {batch}"
        payload = self.contract.payload(Call(prompts, completions, fields, batch, messages or []))
        scores, self.metrics = self.contract.scores(self.send(payload, where), payload, where)
        return scores

    def send(self, payload: Any, where: str) -> object:
        """The source's raw answer to its contract's `payload` (for Nova a list of samples, for forge
        (prompts, completions, fields)), joined over its requests. Every failure is a RewardError
        naming the source and the batch."""
        try:
            return self._channel.send(payload, self.contract, where)
        except RewardError:
            raise
        except Interrupted as e:
            raise RewardStopped(f"{where}: stopped by {e} while the reward was running (its call was abandoned; "
                                "nothing since the last checkpoint is kept)") from None
        except (TimeoutError, cf.TimeoutError, WorkerTimeout):
            raise RewardError(f"{where}: no answer within {self.spec.timeout_s:g}s (timeout_s)") from None
        except WorkerFailed as e:
            raise RewardError(f"{where}: {e}") from None
        except Exception as e:
            raise RewardError(f"{where}: raised {type(e).__name__}: {e}") from None


def unique_labels(rewards: list[Reward]) -> list[str]:
    """Each source's metric label, made unique (two sources may share a function name)."""
    out: list[str] = []
    for r in rewards:
        label, n = r.label, 2
        while label in out:
            label, n = f"{r.label}_{n}", n + 1
        out.append(label)
    return out
