"""A reward transport and a reward contract added from inside a test, touching no other file: a
`toy://NAME` transport (a channel that scores in this process) and a `toy` contract (a function gets
a list of {prompt, completion} and answers {"scores", "figures"}), each a row of
forge.recipe.reward_table. The recipe accepts them, `forge validate` lists the source, `forge
reward verify` speaks the contract, and `forge run` trains an rft stage on both, their scores and
figures in the run's metrics like the built-in ones'."""
from __future__ import annotations

import json

import pytest

from forge import cli
from forge.lm.reward_contracts import check_scores
from forge.lm.rewards import Reward, RewardError
from forge.recipe.reward_table import CONTRACTS, TRANSPORTS, Contract, Transport
from forge.recipe.rft_settings import RewardSource
from forge_testing import base_recipe, write_recipe

TOY_SCORE = 0.75  # what the toy transport gives every completion

GRADER = '''
def grade(event, context):
    return {"scores": [0.25 for _ in event], "figures": {"chars": [len(s["completion"]) for s in event]}}


def wrong(event, context):
    return [0.25 for _ in event]
'''


class ToyChannel:
    """Scores in this process: TOY_SCORE for each completion, in requests of two (the contract's chunks)."""

    def __init__(self, spec, setup):
        self.calls = 0

    def send(self, payload, contract, where):
        self.calls += 1
        return [x for chunk in contract.split(payload, 2) for x in contract.unwrap([TOY_SCORE] * contract.size(chunk))]

    def close(self):
        return None


class ToyContract:
    """The function gets [{"prompt", "completion"}] and answers {"scores": [...], "figures": {name: [...]}}."""

    calls = "event"

    def payload(self, call):
        return [{"prompt": p, "completion": c} for p, c in zip(call.prompts, call.completions)]

    def split(self, payload, n):
        return [payload[i:i + n] for i in range(0, len(payload), n)]

    def size(self, chunk):
        return len(chunk)

    def unwrap(self, answer):
        return answer

    def scores(self, answer, payload, where):
        if not isinstance(answer, dict) or "scores" not in answer:
            raise RewardError(f"{where}: expected {{'scores': [...], 'figures': {{...}}}}, got {type(answer).__name__}")
        figures = {f"figure.{k}": [float(v) for v in vs] for k, vs in (answer.get("figures") or {}).items()}
        return check_scores(answer["scores"], len(payload), where), figures


TOY = ToyContract()


def toy_verify(reward, chats, fields, completions):
    scores = reward([c[-1]["content"] for c in chats], completions, fields, 0)
    print(f"{reward.source}: {len(scores)} samples: toy scores {scores} figures {sorted(reward.metrics)}")
    return 0


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setitem(TRANSPORTS, "toy", Transport(
        "toy", ("toy://",), "toy://NAME", "a toy scorer in the test's process", f"{__name__}:ToyChannel",
        lambda spec: "toy_" + spec.source.removeprefix("toy://"), lambda s: f"{s} (a toy scorer)", "a toy source",
        contracts=("forge",)))
    monkeypatch.setitem(CONTRACTS, "toy", Contract("toy", "[{prompt, completion}] -> {scores, figures}",
                                                   f"{__name__}:TOY", f"{__name__}:toy_verify"))
    (tmp_path / "grader.py").write_text(GRADER)
    return tmp_path / "grader.py"


def test_the_recipe_takes_the_toy_rows_and_checks_them(toy):
    assert RewardSource(source="toy://half").source == "toy://half"
    assert RewardSource(source=f"{toy}:grade", protocol="toy").protocol == "toy"
    with pytest.raises(ValueError, match=r"protocol: nova applies to .* or a Lambda, not to a toy source"):
        RewardSource(source="toy://half", protocol="nova")
    with pytest.raises(ValueError, match=r"expected file\.py:function, .* judge:ADDRESS or toy://NAME"):
        RewardSource(source="nope")
    with pytest.raises(ValueError, match=r"protocol 'other': expected 'forge', 'nova' or 'toy'"):
        RewardSource(source="toy://half", protocol="other")


def test_a_toy_transport_and_a_toy_contract_score(toy):
    with Reward(RewardSource(source="toy://half")) as reward:
        assert reward.label == "toy_half"
        assert reward(["p"] * 3, ["a", "b", "c"], {}, 1) == [TOY_SCORE] * 3 and reward.metrics == {}
    with Reward(RewardSource(source=f"{toy}:grade", protocol="toy", timeout_s=30)) as reward:  # the python transport
        assert reward(["p", "q"], ["ab", "abcd"], {}, 1) == [0.25, 0.25]
        assert reward.metrics == {"figure.chars": [2.0, 4.0]}
    with Reward(RewardSource(source=f"{toy}:wrong", protocol="toy", timeout_s=30)) as reward:
        with pytest.raises(RewardError, match=r"on batch 3: expected \{'scores'"):
            reward(["p"], ["x"], {}, 3)


def test_reward_verify_speaks_the_toy_contract(toy, tmp_path, capsys):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": "ok"}) + "\n" for i in range(2)))
    assert cli.main(["reward", "verify", f"{toy}:grade", "--protocol", "toy", "--data", str(data)]) == 0
    assert "2 samples: toy scores [0.25, 0.25] figures ['figure.chars']" in capsys.readouterr().out
    assert cli.main(["reward", "verify", "toy://half", "--protocol", "toy", "--data", str(data)]) == 2
    assert "a toy source speaks only the forge protocol, not toy: pass --protocol forge" in capsys.readouterr().err


def _recipe(tmp_path, toy):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(4)))
    stage = {"name": "rl", "kind": "rft", "data": ["p"], "max_steps": 2, "batch_size": 2, "group": 2, "seq_len": 64,
             "max_new_tokens": 4, "log_every": 1,
             "rewards": [{"source": "toy://half"}, {"source": f"{toy}:grade", "protocol": "toy", "weight": 0.5,
                                                    "timeout_s": 30}]}
    recipe = base_recipe(tmp_path, stages=[stage], tracking={"register_model": False},
                         eval={"domain": [], "general": []})
    recipe["data"]["p"] = {"path": str(tmp_path / "p.jsonl"), "holdout": 0.0}
    return write_recipe(tmp_path / "r.yaml", recipe)


def test_validate_lists_the_toy_source(toy, tmp_path, capsys):
    assert cli.main(["validate", str(_recipe(tmp_path, toy))]) == 0
    out = capsys.readouterr().out
    assert "stages[0].rewards[0]: toy://half (a toy scorer)" in out
    assert f"stages[0].rewards[1]: {toy}:grade (Python file)" in out


@pytest.mark.slow
def test_forge_run_trains_on_the_toy_rows(toy, tmp_path):
    assert cli.main(["run", str(_recipe(tmp_path, toy))]) == 0
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    [record] = lineage["stages"]
    metrics = record["metrics"]
    assert metrics["reward.toy_half.mean"] == pytest.approx(TOY_SCORE)  # the toy transport's score, by its label
    assert metrics["reward.grade.mean"] == pytest.approx(0.25)  # the toy contract's
    assert metrics["reward.grade.figure.chars"] >= 0  # and its figures, logged as Nova's metrics are
    assert metrics["reward_mean"] == pytest.approx(TOY_SCORE + 0.5 * 0.25)


def test_every_built_in_row_names_code_that_exists():
    import importlib

    for row in TRANSPORTS.values():
        module, _, name = row.build.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), row.name
    for contract in CONTRACTS.values():
        code = contract.spoken()
        assert all(callable(getattr(code, m)) for m in ("payload", "split", "size", "unwrap", "scores")), contract.name
        assert code.calls in ("fields", "event") and callable(contract.verified()), contract.name
