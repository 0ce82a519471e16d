"""Nova's reward contract (`protocol: nova`): a reward Lambda written only from Nova's documentation
(recipes/rewards/nova_lambda.py) runs unchanged as a local file, through boto3's Lambda client
(botocore Stubber) and behind an HTTP endpoint; every breach of the answer is named; `forge reward
verify` reports them; an RFT stage trains on aggregate_reward_score and logs the Metric entries."""
from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch

from forge.cli import main
from forge.inputs import resolve_source
from forge.lm.nova_reward import event, read_answer
from forge.lm.rewards import Reward, RewardError
from forge.recipe import DataSource, RftStage
from forge.recipe.rft_settings import RewardSource
from forge_testing import REPO, Recorder, run_stage
from servers import json_server

HERE = Path(__file__).resolve().parent
LAMBDA = REPO / "recipes" / "rewards" / "nova_lambda.py"
DATA = REPO / "recipes" / "data" / "nova_rft.jsonl"
CHATS = [[{"role": "system", "content": "You tell very short stories."},
          {"role": "user", "content": "Tell a one-sentence story about a cat and the park."}]] * 2
FIELDS = {"id": ["story-000"] * 2, "reference_answer": [{"animal": "cat", "max_words": 20}] * 2, "topic": ["the park"] * 2}
REPLIES = ["The cat ran in the park.", "A dog sat"]


def handler():
    """The Lambda module itself, as AWS would import it."""
    spec = importlib.util.spec_from_file_location("nova_lambda", LAMBDA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


def source(src, **kw) -> RewardSource:
    return RewardSource(source=src, protocol="nova", timeout_s=kw.pop("timeout_s", 10.0), **kw)


def test_the_event_is_novas():
    samples = event(REPLIES, CHATS, FIELDS, 3)
    assert [s["id"] for s in samples] == ["story-000#0", "story-000#1"]  # unique per sample
    assert samples[0]["messages"] == CHATS[0] + [{"role": "assistant", "content": REPLIES[0]}]
    assert samples[0]["reference_answer"] == {"animal": "cat", "max_words": 20}  # SageMaker's page: top level
    assert samples[0]["metadata"]["reference_answer"] == {"animal": "cat", "max_words": 20}  # Nova's guide: metadata
    assert samples[0]["metadata"]["topic"] == "the park" and samples[0]["metadata"]["id"] == "story-000"


def test_a_nova_lambda_runs_unchanged_as_a_local_file():
    with Reward(source(f"{LAMBDA}:lambda_handler")) as reward:
        assert reward(["p"] * 2, REPLIES, FIELDS, 1, CHATS) == pytest.approx([1.0, 1 / 3])
        assert reward.metrics["metric.words"] == [6.0, 3.0]
        assert reward.metrics["reward.full_stop"] == [1.0, 0.0]
        assert reward.label == "nova_lambda"  # a lambda_handler is named by its file
    with Reward(source(f"{HERE / 'nova_rewards.py'}:remaining")) as reward:  # a Lambda-like context
        assert reward(["p"], ["x"], {}, 1) == [1.0] and "metric.remaining" in reward.metrics


def test_a_nova_lambda_runs_unchanged_through_boto3():
    import boto3
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    stub = Stubber(client)
    samples = event(REPLIES, CHATS, FIELDS, 1)
    for chunk in ([samples[0]], [samples[1]]):  # batch_size 1: one invoke a sample
        answer = json.dumps(handler()(chunk, None)).encode()  # what AWS would run and return
        stub.add_response("invoke", {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(answer), len(answer))},
                          {"FunctionName": "arn:aws:lambda:us-east-1:1:function:grader", "InvocationType": "RequestResponse",
                           "Payload": json.dumps(chunk).encode()})
    with stub:
        reward = Reward(source("lambda:arn:aws:lambda:us-east-1:1:function:grader", batch_size=1, concurrency=1),
                        lambda_client=client)
        assert reward(["p"] * 2, REPLIES, FIELDS, 1, CHATS) == pytest.approx([1.0, 1 / 3])
        stub.assert_no_pending_responses()
    assert reward.label == "grader" and reward.metrics["metric.words"] == [6.0, 3.0]


def _nova(samples, path):
    answer = handler()(samples, None)
    return [answer[0], answer[0]] + answer[2:] if path == "/twice" else answer


@pytest.fixture
def endpoint():
    with json_server(_nova) as url:
        yield url


def test_a_nova_endpoint_on_http(endpoint):
    assert Reward(source(f"{endpoint}/score"))(["p"] * 2, REPLIES, FIELDS, 1, CHATS) == pytest.approx([1.0, 1 / 3])
    with pytest.raises(RewardError, match=r"reward 'http://127.0.0.1:\d+/twice' on batch 4: the answer breaks Nova's "
                                          r"reward contract: id 'story-000#0' is answered twice \(results 0 and 1\); "
                                          r"no result for sample id\(s\) 'story-000#1'"):
        Reward(source(f"{endpoint}/twice"))(["p"] * 2, REPLIES, FIELDS, 4, CHATS)


def test_every_breach_of_the_answer_is_named():
    ids = ["a#0", "b#0", "c#0"]
    got = read_answer([{"id": "a#0", "aggregate_reward_score": "0.5"}, {"id": "a#0", "aggregate_reward_score": 1},
                       {"aggregate_reward_score": 1}, {"id": "z", "aggregate_reward_score": 1},
                       {"id": "b#0", "aggregate_reward_score": float("inf"),
                        "metrics_list": [{"name": "m", "value": 1, "type": "Score"},
                                         {"name": "n", "value": None, "type": "Metric"}]}],
                      ids)
    assert got.problems == [
        "returned 5 results for 3 samples",
        "result 0 (id 'a#0'): aggregate_reward_score is '0.5', not a number",
        "id 'a#0' is answered twice (results 0 and 1)",
        "result 2 has no 'id' (echo the sample's 'id')",
        "result 3 has id 'z', which no sample of the event has",
        "result 4 (id 'b#0'): aggregate_reward_score is inf, not a finite number",
        "result 4 (id 'b#0'): metrics_list[0] ('m'): type is 'Score'; expected 'Reward' or 'Metric'",
        "result 4 (id 'b#0'): metrics_list[1] ('n'): value is None, not a finite number",
        "no result for sample id(s) 'c#0'",
    ]
    assert "API Gateway" in read_answer({"statusCode": 200, "body": "[]"}, ids).problems[0]


def test_reward_verify_reports_a_good_lambda_and_every_violation(capsys):
    assert main(["reward", "verify", f"{LAMBDA}:lambda_handler", "--data", str(DATA), "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "story-000#0: score" in out and "metric.words=" in out
    assert out.strip().endswith("2 samples: follows Nova's reward contract")
    assert main(["reward", "verify", f"{HERE / 'nova_rewards.py'}:broken", "--data", str(DATA), "--n", "3"]) == 1
    out = capsys.readouterr().out
    for problem in ("aggregate_reward_score is '0.5', not a number", "id 'story-000#0' is answered twice",
                    "aggregate_reward_score is nan", "type is 'Score'", "no result for sample id(s) 'story-002#0'"):
        assert "violation: result" in out and problem in out, problem
    assert out.strip().endswith("5 violation(s)")
    assert main(["reward", "verify", f"{HERE / 'nova_rewards.py'}:hangs", "--data", str(DATA), "--n", "1",
                 "--timeout", "1"]) == 1
    assert "no answer within 1s (timeout_s)" in capsys.readouterr().out


def test_rft_trains_on_a_nova_reward_and_logs_its_metrics(tmp_path, tiny_checkpoint):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": f"Say thing {i}."}],
                                        "reference_answer": {"n": i}}) + "\n" for i in range(8)))
    data = DataSource(path=str(path), holdout=0.0, chat={"kind": "openai_rft"})
    stage = RftStage(name="rft", kind="rft", data=["p"], max_steps=2, seq_len=64, batch_size=2, group=2,
                     max_new_tokens=6, log_every=1, optim={"lr": 1e-3}, reward_norm="per_reward",
                     rewards=[{"source": f"{HERE / 'nova_rewards.py'}:e_share", "protocol": "nova", "timeout_s": 30},
                              {"source": f"{HERE / 'rft_rewards.py'}:e_share", "weight": 0.5, "timeout_s": 30}])
    tracker = Recorder()
    result = run_stage(stage, tiny_checkpoint, {"p": resolve_source("p", data, tmp_path)}, tmp_path / "o", tracker)
    rows = [m for _, m in tracker.rows if "reward_mean" in m]
    assert len(rows) == 2
    assert {"reward.e_share.metric.length", "reward.e_share.reward.e_share"} <= set(rows[-1])
    assert rows[-1]["reward.e_share.reward.e_share"] == pytest.approx(rows[-1]["reward.e_share.mean"])
    assert rows[-1]["reward.e_share.metric.length"] > 0
    assert {"reward.e_share_2.mean", "reward.e_share_2.std", "reward.e_share.std"} <= set(rows[-1])  # each reward's own
    assert (result.checkpoint / "model.safetensors").is_file()


def test_per_reward_normalisation_keeps_each_rewards_resolution():
    """The GDPO paper's case: two 0/1 rewards, groups of 2 rollouts; group 1 scores (0,1) vs (0,0),
    group 2 (1,1) vs (0,0). The plain sum gives both groups the same advantages; per reward, the
    rollout that earned both rewards gets the larger one."""
    from forge.stages.rft import advantages, decoupled_advantages

    first, second = torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    summed = advantages(first + second, 2)
    assert summed[0].item() == pytest.approx(summed[2].item(), abs=1e-3)  # collapsed
    split = decoupled_advantages([first, second], [1.0, 1.0], 2)
    assert split[2] > split[0] + 0.4 > 0.4 and split[3] < split[1] < 0
    assert split.mean().item() == pytest.approx(0.0, abs=1e-5) and split.std().item() == pytest.approx(1.0, abs=1e-3)


ODD = '''
def long_name(event, context):
    return [{"id": s["id"], "aggregate_reward_score": 1.0,
             "metrics_list": [{"name": "m" * 300, "value": 1.0, "type": "Metric"}]} for s in event]


def flood(event, context):
    return [{"id": s["id"], "aggregate_reward_score": 1.0} for s in event] + [{"id": f"x{i}"} for i in range(5000)]


def huge(event, context):
    return [{"id": s["id"], "aggregate_reward_score": 10**400,
             "metrics_list": [{"name": "m", "value": -10**400, "type": "Metric"}]} for s in event]
'''


def test_reward_verify_warns_of_a_metric_name_mlflow_would_shorten(tmp_path, capsys):
    (tmp_path / "odd.py").write_text(ODD)
    assert main(["reward", "verify", f"{tmp_path / 'odd.py'}:long_name", "--data", str(DATA), "--n", "1"]) == 0
    out = capsys.readouterr().out
    warning = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "reward.long_name.metric.mmmm" in warning[0] and "324 characters" in warning[0], out
    assert "250" in warning[0] and "names.json" in warning[0]
    assert out.strip().endswith("1 samples: follows Nova's reward contract")


def test_reward_verify_output_is_bounded_whatever_the_answer(tmp_path, capsys):
    (tmp_path / "odd.py").write_text(ODD)
    assert main(["reward", "verify", f"{tmp_path / 'odd.py'}:flood", "--data", str(DATA), "--n", "2"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) < 40, len(lines)
    assert any("and 4981 more violation(s)" in line for line in lines), lines[-3:]
    assert lines[-1].endswith("2 samples: 5001 violation(s)")


def test_a_score_too_large_for_a_float_is_a_contract_breach_not_a_crash(tmp_path, capsys):
    got = read_answer([{"id": "a#0", "aggregate_reward_score": 10**400,
                        "metrics_list": [{"name": "m", "value": 10**400, "type": "Metric"}]}], ["a#0"])
    assert got.scores == [None] and len(got.problems) == 2
    assert all("not a finite number" in p and "too large" in p for p in got.problems), got.problems
    (tmp_path / "odd.py").write_text(ODD)
    with Reward(source(f"{tmp_path / 'odd.py'}:huge")) as reward:
        with pytest.raises(RewardError, match=r"on batch 2: the answer breaks Nova's reward contract: result 0 .*"
                                              r"aggregate_reward_score is a 401-digit integer"):
            reward(["p"], ["x"], {}, 2)


def test_reward_verify_of_a_judge_says_to_pass_protocol_forge(capsys):
    assert main(["reward", "verify", "judge:http://127.0.0.1:9/v1", "--data", str(DATA)]) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("forge:")]  # after the progress line
    assert "--protocol forge" in line and "validation error" not in err and "pydantic" not in err, err


@pytest.mark.slow
def test_an_rft_stage_whose_nova_metric_name_is_too_long_for_mlflow_keeps_all_its_metrics(tmp_path, tiny_checkpoint):
    """Issue 34: the batch holding a 300-character metric name was refused by MLflow on its writer
    thread, the stage FINISHED with no metric at all. Now every metric is there, that one shortened."""
    from forge.track import MlflowTracker

    (tmp_path / "odd.py").write_text(ODD)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Say thing {i}."}) + "\n" for i in range(4)))
    stage = RftStage(name="rft", kind="rft", data=["p"], max_steps=1, seq_len=64, batch_size=2, group=2,
                     max_new_tokens=4, log_every=1, optim={"lr": 1e-3},
                     rewards=[{"source": f"{tmp_path / 'odd.py'}:long_name", "protocol": "nova", "timeout_s": 30}])
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    data = resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp_path)
    with tracker.run("rft") as run_id:
        run_stage(stage, tiny_checkpoint, {"p": data}, tmp_path / "o", tracker)
    client = tracker._mlflow.MlflowClient()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "train/reward_mean" in run.data.metrics
    [short] = [k for k in run.data.metrics if k.startswith("reward.long_name.metric.mmm")]
    assert len(short) <= 250 and run.data.metrics[short] == 1.0
    names = json.loads(open(client.download_artifacts(run_id, "names.json")).read())
    assert names[short] == "reward.long_name.metric." + "m" * 300
