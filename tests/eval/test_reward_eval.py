"""Mean reward evaluator: held-out prompts completed by the model, scored by the recipe's reward
functions (per source and weighted total), start vs a candidate taught to answer with the rewarded
letter; a failing reward names its source; the gate and `forge eval --json/--markdown` see it."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from forge import cli
from forge.data.formats import ChatEncoder, FormatSpec
from forge.errors import ForgeError
from forge.eval.gates import check_gates
from forge.eval.suite import resolve_suite, run_suite
from forge.inputs import resolve_source
from forge.lm.rewards import RewardError
from forge.recipe import DataSource
from forge.recipe.eval import EvalBlock
from forge_testing import write_recipe

REWARDS = """
def e_share(prompts, completions, **fields):
    return [sum(ch == "e" for ch in c) / max(1, len(c)) for c in completions]

def one(prompts, completions, answer, **fields):
    return [1.0 if a in ("x", "y") else 0.0 for a in answer]

def raises(prompts, completions, **fields):
    raise RuntimeError("grader crashed")
"""
REPLY = "e e e e e e e e e e"


def _prompts(tmp_path, n=20) -> dict:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}.", "answer": "xy"[i % 2]}) + "\n"
                            for i in range(n)))
    return {"p": resolve_source("p", DataSource(path=str(path), holdout=0.4), tmp_path)}


def _candidate(start, out, prompts: list[str], steps=80):
    """The start model taught to answer every prompt with REPLY (the rewarded letter)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(start), AutoTokenizer.from_pretrained(start)
    enc = ChatEncoder(tok, FormatSpec("prompt_completion"))
    seqs = [tok(enc.render([{"role": "user", "content": p}], add_generation_prompt=True) + REPLY,
                add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in prompts]
    width = max(map(len, seqs))
    x = torch.tensor([s + [tok.eos_token_id] * (width - len(s)) for s in seqs])
    labels = torch.tensor([s + [-100] * (width - len(s)) for s in seqs])
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(input_ids=x, attention_mask=(labels != -100).long(), labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("reward")
    (tmp / "rewards.py").write_text(REWARDS)
    sources = _prompts(tmp)
    from forge.data.mixing import in_holdout

    texts = [f"Tell me about thing {i}." for i in range(20) if not in_holdout("p", i + 1, 0.4)]  # trained on these only
    return tmp, sources, {"start": tiny_checkpoint, "candidate": _candidate(tiny_checkpoint, tmp / "cand", texts)}


def _suite(tmp, **reward) -> EvalBlock:
    block = {"domain": [], "general": [], "reward": {
        "source": "p", "max_new_tokens": 12, "rewards": [{"source": f"{tmp}/rewards.py:e_share"},
                                                         {"source": f"{tmp}/rewards.py:one", "weight": 2.0}],
        **reward}}
    return resolve_suite(EvalBlock(**block), [], {})


@pytest.mark.slow
def test_mean_reward_per_source_and_weighted_start_vs_candidate(toy):
    tmp, sources, models = toy
    c = run_suite(models, _suite(tmp), sources, log=lambda *_: None)
    start, cand = c.metrics["start"], c.metrics["candidate"]
    print(f"reward.e_share.mean: start {start['reward.e_share.mean']:.3f} -> candidate {cand['reward.e_share.mean']:.3f}")
    assert start["reward.one.mean"] == cand["reward.one.mean"] == 1.0   # a known answer: every row has x or y
    for m in (start, cand):  # the total is the weighted sum of the sources' means
        assert m["reward.mean"] == pytest.approx(m["reward.e_share.mean"] + 2.0 * m["reward.one.mean"])
    assert start["reward.e_share.mean"] < 0.2 and cand["reward.e_share.mean"] > 0.4
    assert c.deltas()["candidate"]["reward.mean"] > 0.3
    # a gate on the mean reward: the start fails it, the candidate passes
    suite = EvalBlock.model_validate({**_suite(tmp).model_dump(), "gates": {"reward_mean_min": 2.3}})
    assert [g.passed for g in check_gates(suite, start)] == [False]
    assert [g.passed for g in check_gates(suite, cand)] == [True]
    # sampled completions: the same seed gives every model the same draws (reproducible)
    sampled = _suite(tmp, temperature=1.0, samples=2)
    a = run_suite({"start": models["start"]}, sampled, sources, log=lambda *_: None).metrics["start"]
    b = run_suite({"start": models["start"]}, sampled, sources, log=lambda *_: None).metrics["start"]
    assert a == b


def test_a_failing_reward_names_its_source(toy):
    tmp, sources, models = toy
    suite = _suite(tmp, rewards=[{"source": f"{tmp}/rewards.py:raises"}])
    with pytest.raises(RewardError, match=r"eval.reward on start: reward '.*rewards.py:raises' on batch 0: "
                                          r"raised RuntimeError: grader crashed"):
        run_suite(models, suite, sources, log=lambda *_: None)
    with pytest.raises(ForgeError, match=r"reward '.*missing.py:f': no file"):
        run_suite(models, _suite(tmp, rewards=[{"source": f"{tmp}/missing.py:f"}]), sources, log=lambda *_: None)
    with pytest.raises(ForgeError, match=r"eval.reward: data.p has no train prompt rows"):
        empty = _prompts(tmp / "e", 0) if (tmp / "e").mkdir() is None else None
        run_suite(models, _suite(tmp, split="train"), empty, log=lambda *_: None)


def test_defaults_come_from_the_rft_stage_and_a_recipe_without_one_must_name_them(tmp_path):
    from forge.recipe import RftStage

    rft = RftStage(name="rl", kind="rft", data=["p"], rewards=[{"source": "m:f", "weight": 0.5}], prompt_field="q",
                   max_new_tokens=7, max_steps=1)
    suite = resolve_suite(EvalBlock(reward={}), [rft], {"p": SimpleNamespace(chat=None, proprietary=True)})
    assert (suite.reward.source, suite.reward.prompt_field, suite.reward.max_new_tokens) == ("p", "q", 7)
    assert [(r.source, r.weight) for r in suite.reward.rewards] == [("m:f", 0.5)]
    with pytest.raises(ForgeError, match=r"eval.reward.source: not given and no rft stage"):
        resolve_suite(EvalBlock(reward={}), [], {})
    with pytest.raises(ValueError, match="samples > 1 needs a temperature"):
        EvalBlock(reward={"samples": 2})
    # at load time: a recipe without an rft stage names what eval.reward lacks
    from forge.recipe import load_recipe
    from forge_testing import base_recipe

    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, eval={"reward": {"source": "general"}}))
    with pytest.raises(ForgeError, match=r"eval.reward.rewards: the recipe has no rft stage to take it from"):
        load_recipe(path)


def test_forge_eval_models_json_and_markdown_with_a_reward_gate(toy, tmp_path, capsys):
    tmp, _, models = toy
    prompts = tmp / "prompts.jsonl"
    suite = {"data": {"p": {"path": str(prompts), "holdout": 0.4}},
             "eval": {"domain": [], "general": [],
                      "reward": {"source": "p", "max_new_tokens": 12, "rewards": [{"source": "rewards.py:e_share"}]},
                      "gates": {"reward_mean_min": 0.4}}}
    (tmp_path / "rewards.py").write_text(REWARDS)  # relative to the suite file
    file = write_recipe(tmp_path / "suite.yaml", suite)
    arg = f"start={models['start']},candidate={models['candidate']}"
    out, md = tmp_path / "e.json", tmp_path / "e.md"
    assert cli.main(["eval", "--models", arg, "--suite", str(file), "--json", str(out), "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    assert [m["label"] for m in data["models"]] == ["start", "candidate"]
    assert data["deltas"]["candidate"]["reward.mean"] > 0.3 and data["passed"] is True
    assert data["gates"][0]["metric"] == "reward.mean"
    assert "| reward.e_share.mean |" in md.read_text()
    assert "reward_mean_min: reward.mean" in capsys.readouterr().out
    # the start model alone fails the gate: --strict exits 1
    assert cli.main(["eval", "--models", str(models["start"]), "--suite", str(file), "--strict"]) == 1
