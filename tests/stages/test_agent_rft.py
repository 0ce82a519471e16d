"""Multi-turn agentic RFT (forge.lm.agent): the environment protocol (reset, step, tools), the loss
mask (the policy's tokens only), the stops (done, max_turns, seq_len), and RFT steps with an env."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource, RftStage
from forge_testing import run_stage

HERE = Path(__file__).resolve().parent
ENVS = HERE / "agent_envs.py"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def stage(env="Adder", **kw) -> RftStage:
    cfg = {"name": "agent", "kind": "rft", "data": ["p"], "env": f"{ENVS}:{env}", "max_steps": 2, "seq_len": 128,
           "batch_size": 2, "group": 2, "max_new_tokens": 24, "max_turns": 4, "optim": {"lr": 2e-3}, "log_every": 1}
    return RftStage(**{**cfg, **kw})


class Scripted:
    """A stand-in policy: every row of generate() gets the next scripted turn (the rows move in step)."""

    def __init__(self, tok, turns):
        self.turns = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in turns]
        self.calls = 0

    def generate(self, input_ids, **kw):
        out = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        return torch.cat([input_ids, torch.tensor([out] * len(input_ids))], 1)


def agent(tiny_checkpoint, st):
    from transformers import AutoTokenizer

    from forge.data.formats import ChatEncoder, FormatSpec
    from forge.data.packing import pad_token_id
    from forge.lm.agent import Agent

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    return Agent(st, tok, ChatEncoder(tok, FormatSpec("prompt_completion")), pad_token_id(tok), "cpu"), tok


def task(prompt="What is 2 plus 3?"):
    return {"prompt": prompt, "messages": [{"role": "user", "content": prompt}], "answer": "5"}


def test_tool_calls_are_parsed_and_malformed_ones_answered():
    from forge.lm.agent import tool_calls

    assert tool_calls(f"thinking {CALL} and {CALL}") == [("add", {"a": 2, "b": 3})] * 2
    assert tool_calls("<tool_call>{nope}</tool_call>")[0].startswith("error: the tool call is not JSON")
    assert tool_calls('<tool_call>["add"]</tool_call>') == ['error: a tool call is {"name": NAME, "arguments": {...}}']
    assert tool_calls("no call here") == []


def test_tools_run_results_appended_and_the_loss_mask_covers_only_the_policy(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    from forge.lm.agent import trajectory_batch
    from forge.stages.rft import grpo_loss

    st = stage(seq_len=192)
    ag, tok = agent(tiny_checkpoint, st)
    trajs = ag.run(Scripted(tok, [CALL, "It is 5."]), [task(), task("Add 2 and 3, please.")], 2)
    assert len(trajs) == 4
    for t in trajs:
        assert (t.turns, t.reward, t.done) == (2, 1.0, True)
        assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
        assert t.messages[2]["content"] == "5"  # forge ran the tool
        mine = tok.decode([i for i, p in zip(t.ids, t.policy) if p])
        assert mine == f"{CALL}{tok.eos_token}It is 5.{tok.eos_token}"  # the policy's two turns, nothing else
        rest = tok.decode([i for i, p in zip(t.ids[t.prompt_len:], t.policy[t.prompt_len:]) if not p])
        assert "<tool_response>\n5\n</tool_response>" in rest and "It is 5" not in rest
    seqs, mask, cmask, width = trajectory_batch(trajs, 0, "cpu")
    assert cmask.sum().item() == sum(sum(t.policy) for t in trajs)
    assert seqs[0][mask[0].bool()].tolist() == trajs[0].ids
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    from forge.stages.rft import token_logps

    with torch.no_grad():
        old = token_logps(model, seqs, mask, width)
    b = {"ids": seqs, "mask": mask, "start": torch.tensor(width), "cmask": cmask.float(), "old": old,
         "adv": torch.tensor([1.0, -1.0, 0.5, -0.5])}
    loss = grpo_loss(st, model, b).value
    moved = old + 5.0 * (1 - cmask.float())  # the tool results' and the environment's tokens changed
    assert math.isfinite(loss.item())
    assert grpo_loss(st, model, {**b, "old": moved}).value.item() == pytest.approx(loss.item())
    assert grpo_loss(st, model, {**b, "old": old + 0.5 * cmask.float()}).value.item() != pytest.approx(loss.item())


@pytest.mark.parametrize("env, turns, reward, kw", [
    ("Chatty", 3, 1.5, {"max_turns": 3}),  # never done: max_turns ends it
    ("DoneSecond", 2, 2.0, {}),            # done on its second step
    ("Chatty", 2, 1.0, {"seq_len": 72, "max_new_tokens": 8}),  # no room for a third turn in seq_len
])
def test_trajectories_stop_at_done_max_turns_or_the_context(tiny_checkpoint, env, turns, reward, kw):
    ag, tok = agent(tiny_checkpoint, stage(env, **kw))
    trajs = ag.run(Scripted(tok, ["ok"]), [task("Go.")], 2)
    assert [(t.turns, t.reward) for t in trajs] == [(turns, reward)] * 2
    assert all(len(t.ids) <= ag.stage.seq_len for t in trajs)


def test_bad_environments_are_named(tiny_checkpoint):
    with pytest.raises(ForgeError, match=r"env '.*agent_envs.py:NoStep': the environment has no step method"):
        agent(tiny_checkpoint, stage("NoStep"))
    ag, tok = agent(tiny_checkpoint, stage("BadReward"))
    with pytest.raises(ForgeError, match=r"BadReward': step's reward must be a finite number, got nan"):
        ag.run(Scripted(tok, ["x"]), [task()], 1)
    with pytest.raises(ValueError, match="give at least one reward source"):
        RftStage(name="r", kind="rft", data=["p"], max_steps=1)


class Rows:
    def __init__(self):
        self.rows = []

    def log_metrics(self, m, step=None):
        self.rows.append((step, m))

    def __getattr__(self, name):
        return lambda *a, **k: None


def test_rft_steps_with_an_env_train_and_log_trajectory_reward(tmp_path, tiny_checkpoint):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(12)))
    sources = {"p": resolve_source("p", DataSource(path=str(path), holdout=0.3), tmp_path)}
    t = Rows()
    result = run_stage(stage(max_turns=2, eval_tasks=2), tiny_checkpoint, sources, tmp_path / "o", tracker=t)
    trained = [m for _, m in t.rows if "reward_mean" in m]
    assert len(trained) == 2 and all("reward.env.mean" in m and "completion_length" in m for m in trained)
    assert all(0.0 <= m["reward.env.mean"] <= 1.0 for m in trained)
    evals = [(s, m) for s, m in t.rows if "env.heldout.reward" in m]
    assert [s for s, _ in evals] == [0, 2]  # the start and the end
    assert "env.heldout.reward_start" in result.metrics and "env.heldout.turns" in result.metrics
    assert (result.checkpoint / "model.safetensors").is_file()


def test_kb_lookup_pays_the_value_itself():
    from forge.usercode import load_function

    env = load_function(f"{HERE.parents[1] / 'recipes/envs/kb_lookup.py'}:KbLookup", what="env")()
    (product, attribute), value = sorted(env.FACTS.items())[0]
    env.reset({"prompt": "?", "product": product, "attribute": attribute, "answer": value})
    assert env.step(f" {value.upper()}.")[1] == 1.0
    assert env.step(f"1{value}")[1] == 0.0  # "12 years" is not "2 years"
    assert env.lookup(product, attribute) == value
    assert env.step(f"{value} or 5 hours")[1] == pytest.approx(0.6)  # partial credit: the right lookup
