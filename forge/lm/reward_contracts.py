"""The built-in reward contracts (forge.recipe.reward_table's CONTRACTS name them):

- forge: a function gets `(prompts, completions, **fields)` (a remote source the JSON
  `{"prompts", "completions", **fields}`, `batch_size` completions a request) and returns one score a
  completion, a list (a remote source's may come as `{"rewards": [...]}`);
- nova: Amazon Nova's reward Lambda contract (forge.lm.nova_reward): a function gets Nova's event (a
  list of samples, `batch_size` a request) and answers with Nova's results; `aggregate_reward_score`
  is the score and the `metrics_list` values are the figures the stage logs.
Scores are numbers (numpy's too; not booleans); a numpy array counts as the list.
"""
from __future__ import annotations

from typing import Any

from forge.lm.nova_reward import event, number_problem, read_answer
from forge.lm.reward_channel import Call, Chunk, Metrics, RewardError


class ForgeContract:
    calls = "fields"

    def payload(self, call: Call) -> tuple[list[str], list[str], dict[str, list[Any]]]:
        return call.prompts, call.completions, call.fields

    def split(self, payload: Any, n: int) -> list[Chunk]:
        prompts, completions, fields = payload
        return [{"prompts": prompts[i:i + n], "completions": completions[i:i + n],
                 **{k: v[i:i + n] for k, v in fields.items()}} for i in range(0, len(completions), n)]

    def size(self, chunk: Chunk) -> int:
        return len(chunk["completions"])

    def unwrap(self, answer: object) -> object:
        return answer["rewards"] if isinstance(answer, dict) and "rewards" in answer else answer

    def scores(self, answer: object, payload: Any, where: str) -> tuple[list[float], Metrics]:
        return check_scores(answer, len(payload[1]), where), {}


class NovaContract:
    calls = "event"

    def payload(self, call: Call) -> list[dict[str, Any]]:
        chats = call.messages or [[{"role": "user", "content": p}] for p in call.prompts]
        return event(call.completions, chats, call.fields, call.batch)

    def split(self, payload: Any, n: int) -> list[Chunk]:
        return [payload[i:i + n] for i in range(0, len(payload), n)]

    def size(self, chunk: Chunk) -> int:
        return len(chunk)

    def unwrap(self, answer: object) -> object:
        return answer

    def scores(self, answer: object, payload: Any, where: str) -> tuple[list[float], Metrics]:
        read = read_answer(answer, [s["id"] for s in payload])
        if read.problems:
            more = f" (and {len(read.problems) - 3} more; forge reward verify lists them all)" \
                if len(read.problems) > 3 else ""
            raise RewardError(f"{where}: the answer breaks Nova's reward contract: {'; '.join(read.problems[:3])}{more}")
        return [float(s) for s in read.scores if s is not None], read.metrics


FORGE = ForgeContract()
NOVA = NovaContract()


def check_scores(scores: object, n: int, where: str) -> list[float]:
    """`n` finite scores as floats: Python or numpy numbers (not booleans), in a list, a tuple or a
    1-d numpy array; a RewardError saying what is wrong otherwise."""
    if type(scores).__module__ == "numpy" and getattr(scores, "ndim", None) == 1:
        scores = list(scores)  # type: ignore[call-overload]
    if not isinstance(scores, (list, tuple)):
        kind = getattr(scores, "type_name", type(scores).__name__)  # a worker's Opaque names the type it stands for
        raise RewardError(f"{where}: expected a list of {n} scores, got {kind}")
    if len(scores) != n:
        raise RewardError(f"{where}: returned {len(scores)} scores for {n} completions")
    out: list[float] = []
    for i, s in enumerate(scores):
        problem = number_problem(s)
        if problem:
            raise RewardError(f"{where}: score {i} {problem}")
        out.append(float(s))
    return out
