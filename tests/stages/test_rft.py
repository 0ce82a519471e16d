"""RFT (GRPO): the mean reward of a verifiable toy task rises, with a Python and with an HTTP reward;
reward sources that fail end the stage with an error naming the source and batch; Lambda via Stubber."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import rft_rewards
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.lm.rewards import Reward, RewardError
from forge.recipe import DataSource, RftStage
from forge_testing import run_stage
from servers import json_server

HERE = Path(__file__).resolve().parent
REWARDS = HERE / "rft_rewards.py"


def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}.", "answer": "x" if i % 2 else "y"}) + "\n"
                            for i in range(16)))
    return {"p": resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp_path)}


def rft(source=f"{REWARDS}:e_share", **kw) -> RftStage:
    # top_k 50: the random-init model's 50 likeliest tokens; from its whole, near-uniform vocabulary
    # (top_k 0, the default) 12 steps show no rise of the e_share reward
    cfg = {"name": "rft", "kind": "rft", "data": ["p"], "rewards": [{"source": source, "timeout_s": 1.0}],
           "max_steps": 12, "seq_len": 64, "batch_size": 4, "group": 8, "max_new_tokens": 12,
           "optim": {"lr": 2e-3}, "log_every": 1, "top_k": 50}
    cfg.update(kw)
    return RftStage(**cfg)


def rises(tmp_path, tiny_checkpoint, stage):
    t = rft_rewards.RewardRows()
    result = run_stage(stage, tiny_checkpoint, prompts(tmp_path), tmp_path / "o", tracker=t)
    first = sum(r["reward_mean"] for r in t.rows[:3]) / 3
    last = sum(r["reward_mean"] for r in t.rows[-3:]) / 3
    print(f"mean reward: first 3 steps {first:.3f} -> last 3 steps {last:.3f}")
    assert last > first + 0.05 and last > 1.5 * first
    assert {"kl", "clip_fraction", "completion_length", "reward_std"} <= set(t.rows[-1])
    if stage.rewards[0].source.endswith(":e_share"):  # per source, under the name eval.reward reports it by
        assert t.rows[-1]["reward.e_share.mean"] == pytest.approx(t.rows[-1]["reward_mean"])
    return result


def test_grpo_raises_the_mean_reward_python(tmp_path, tiny_checkpoint):
    result = rises(tmp_path, tiny_checkpoint, rft(kl_beta=0.01, updates_per_rollout=2))
    assert (result.checkpoint / "model.safetensors").is_file()


@pytest.fixture
def server():
    with json_server(lambda body, path: {"rewards": rft_rewards.e_share(body["prompts"], body["completions"])}) as url:
        yield f"{url}/score"


@pytest.mark.slow
def test_grpo_raises_the_mean_reward_http(tmp_path, tiny_checkpoint, server):
    rises(tmp_path, tiny_checkpoint, rft(server, kl_beta=0.01, updates_per_rollout=2))


def test_http_reward_chunks_and_async_python(server):
    spec = rft(server).rewards[0].model_copy(update={"batch_size": 3, "concurrency": 2})
    got = Reward(spec)(["p"] * 7, ["eee", "abc", "e"] * 2 + ["x"], {}, batch=1)
    assert got == pytest.approx([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    a = Reward(rft(f"{REWARDS}:e_share_async").rewards[0])(["p"], ["ee"], {}, batch=1)
    assert a == [1.0]
    f = Reward(rft(f"{REWARDS}:with_fields").rewards[0])(["p", "q"], ["", ""], {"answer": ["x", "y"]}, batch=1)
    assert f == [1.0, 0.0]


@pytest.mark.parametrize("fn, message", [
    ("raises", "raised RuntimeError: grader crashed"), ("hangs", "no answer within 1s"),
    ("nan", "score 0 is nan, not a finite number"), ("short", "returned 7 scores for 8 completions"),
])
def test_bad_rewards_end_the_stage_naming_source_and_batch(tmp_path, tiny_checkpoint, fn, message):
    with pytest.raises(RewardError, match=rf"reward '.*rft_rewards.py:{fn}' on batch 1: {message}"):
        run_stage(rft(f"{REWARDS}:{fn}", max_steps=1, batch_size=1), tiny_checkpoint, prompts(tmp_path), tmp_path / "o")


def test_an_empty_prompt_is_refused_naming_its_file_and_line(tmp_path, tiny_checkpoint):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Tell me.", "Say more.", "  ", "Why?"]))
    sources = {"p": resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp_path)}
    with pytest.raises(ForgeError, match=rf"^{path}:line 3: the prompt \('prompt', prompt_field\) is empty"):
        run_stage(rft(max_steps=1, batch_size=1), tiny_checkpoint, sources, tmp_path / "o")
    assert not (tmp_path / "o").exists()  # refused before anything starts


def test_http_endpoint_down_is_a_clear_error():
    spec = rft("http://127.0.0.1:9/none").rewards[0].model_copy(update={"retries": 1, "timeout_s": 0.5})
    with pytest.raises(RewardError, match=r"reward 'http://127.0.0.1:9/none' on batch 3: the endpoint failed after 2"):
        Reward(spec)(["p"], ["c"], {}, batch=3)


def test_lambda_reward_through_boto3_stubber():
    import boto3
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    spec = rft("lambda:grader").rewards[0].model_copy(update={"batch_size": 2, "concurrency": 1})
    stub = Stubber(client)
    for chunk, scores in ((["a", "b"], [0.5, 1.0]), (["c"], [0.25])):
        payload = json.dumps(scores).encode()
        stub.add_response("invoke", {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(payload), len(payload))},
                          {"FunctionName": "grader", "InvocationType": "RequestResponse",
                           "Payload": json.dumps({"prompts": ["p"] * len(chunk), "completions": chunk}).encode()})
    err = json.dumps({"errorMessage": "boom"}).encode()
    stub.add_response("invoke", {"StatusCode": 200, "FunctionError": "Unhandled",
                                 "Payload": StreamingBody(io.BytesIO(err), len(err))})
    with stub:
        assert Reward(spec, lambda_client=client)(["p"] * 3, ["a", "b", "c"], {}, batch=1) == [0.5, 1.0, 0.25]
        with pytest.raises(RewardError, match=r"reward 'lambda:grader' on batch 2: the Lambda function failed \(Unhandled\)"):
            Reward(spec, lambda_client=client)(["p"], ["a"], {}, batch=2)
        stub.assert_no_pending_responses()


def test_validate_refuses_rft_without_rewards_and_dpo_without_pairs(tmp_path):
    from forge.errors import ForgeError
    from forge.recipe import load_recipe
    from forge_testing import base_recipe, write_recipe

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"prompt": "hi", "completion": "ho"}) + "\n")
    r = base_recipe(tmp_path)
    r["data"]["qa"] = {"path": str(qa), "chat": {"kind": "prompt_completion"}}
    r["stages"] = [{"name": "rl", "kind": "rft", "data": ["qa"], "rewards": [], "max_steps": 1}]
    with pytest.raises(ForgeError, match=r"stages\[0\]\.rewards"):
        load_recipe(write_recipe(tmp_path / "a.yaml", r))
    r["stages"] = [{"name": "d", "kind": "dpo", "data": ["qa"], "max_steps": 1}]
    with pytest.raises(ForgeError, match=r"stages\[0\]\.data\[0\]: data.qa has chat.kind 'prompt_completion', "
                                         r"which holds no preference pairs"):
        load_recipe(write_recipe(tmp_path / "b.yaml", r))
    r["stages"] = [{"name": "s", "kind": "sft", "data": ["qa"], "max_steps": 1, "lora": {"merge": False}},
                   {"name": "d", "kind": "sft", "data": ["qa"], "max_steps": 1}]
    with pytest.raises(ForgeError, match=r"stages\[0\]\.lora\.merge: false saves only an adapter"):
        load_recipe(write_recipe(tmp_path / "c.yaml", r))


def test_prompts_are_shuffled_each_epoch_by_the_seed_and_resume_in_place():
    from forge.stages.rft import PromptStream

    rows = [([{"role": "user", "content": str(i)}], {}) for i in range(10)]

    def texts(stream, n):
        return [m[0]["content"] for m, _ in stream.take(n)]

    a = PromptStream(rows, seed=1)
    first, second = texts(a, 10), texts(a, 10)
    assert sorted(first) == sorted(second) == sorted(str(i) for i in range(10))  # every prompt once an epoch
    assert first != [str(i) for i in range(10)] and first != second  # shuffled, anew each epoch
    assert texts(PromptStream(rows, seed=2), 10) != first
    b = PromptStream(rows, seed=1)
    texts(b, 7)
    resumed = PromptStream(rows, seed=1)
    resumed.load_state_dict(b.state_dict())
    assert texts(resumed, 13) == (first + second)[7:20]


def test_log_probs_are_those_of_the_sampling_temperature(tiny_checkpoint):
    import torch
    from transformers import AutoModelForCausalLM

    from forge.stages.rft import token_logps

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    ids = torch.randint(4, 100, (2, 10))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, 5:-1] / 0.7
        want = torch.gather(torch.log_softmax(logits, -1), 2, ids[:, 6:, None]).squeeze(-1)
        got = token_logps(model, ids, torch.ones_like(ids), 6, 0.7)
        plain = token_logps(model, ids, torch.ones_like(ids), 6)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)
