"""LLM judges (forge.lm.judges): a tiny local judge scored by its score-token probabilities, an
OpenAI-compatible chat server on 127.0.0.1 (pointwise, group, parse failures, the verdict cache),
Bedrock InvokeModel through botocore's Stubber, rubrics, and the judge: reward source."""
from __future__ import annotations

import io
import json

import pytest

from forge.errors import ForgeError
from forge.lm.judge_rubrics import load_rubric, parse_group, parse_score
from forge.lm.judges import Judge, Reach
from forge.lm.rewards import Reward, RewardError
from forge.recipe import RewardSource
from forge.recipe.judge import JudgeOptions
from judge_server import judge_server, rule

PROMPTS = ["Uppercase this word: cat", "Uppercase this word: cat"]
ANSWERS = ["CAT", "the cat sat on a mat and then it rained all day"]


def test_a_tiny_local_judge_scores_by_its_score_token_probabilities(tiny_checkpoint, tmp_path):
    judge = Judge(str(tiny_checkpoint), JudgeOptions(), tmp_path / "cache")
    scores = judge.score(PROMPTS, ANSWERS, {})
    assert all(1.0 <= s <= 5.0 for s in scores) and scores[0] != scores[1]
    # group scoring: both completions in one context, one score each, still on the scale
    group = Judge(str(tiny_checkpoint), JudgeOptions(scoring="group"), None).score(PROMPTS, ANSWERS, {})
    assert len(group) == 2 and all(1.0 <= s <= 5.0 for s in group)
    assert judge.score(PROMPTS, ANSWERS, {}) == scores and judge.hits == 2  # the second time from the cache


def test_a_local_judge_refuses_a_scale_its_tokenizer_cannot_read(tiny_checkpoint):
    with pytest.raises(ForgeError, match="no single token for the score 10"):
        Judge(str(tiny_checkpoint), JudgeOptions(low=1, high=10))


def test_an_endpoint_judge_pointwise_group_and_cache(tmp_path):
    prompts = ["Say something nice."] * 3
    texts = ["good", "good good good", "meh"]
    with judge_server() as srv:
        judge = Judge(srv["url"], JudgeOptions(), tmp_path / "cache")
        assert judge.score(prompts, texts, {}) == [float(rule(t)) for t in texts] == [2.0, 4.0, 1.0]
        assert len(srv["requests"]) == 3 and srv["requests"][0]["model"] == "rule-judge"  # from /v1/models
        group = Judge(srv["url"], JudgeOptions(scoring="group"), tmp_path / "cache")
        assert group.score(prompts, texts, {}) == [2.0, 4.0, 1.0]
        assert len(srv["requests"]) == 4  # the whole group in one call
        again = Judge(srv["url"], JudgeOptions(), tmp_path / "cache")  # a new judge over the same run folder
        assert again.score(prompts, texts, {}) == [2.0, 4.0, 1.0] and again.hits == 3 and again.calls == 0
        assert len(srv["requests"]) == 4
        other = Judge(srv["url"], JudgeOptions(rubric="rag_faithfulness"), tmp_path / "cache")
        other.score(prompts[:1], texts[:1], {"context": ["a passage"]})  # another rubric: not the cached verdict
        assert len(srv["requests"]) == 5


def test_a_parse_failure_names_the_completion_and_quotes_the_judge(tmp_path):
    with judge_server() as srv:
        with pytest.raises(ForgeError) as info:
            Judge(srv["url"], JudgeOptions()).score(["Q"] * 2, ["good", "GARBLE here"], {})
        msg = str(info.value)
        assert "completion 1" in msg and "'GARBLE here'" in msg and "Hmm, hard to say." in msg
        with pytest.raises(ForgeError) as info:
            Judge(srv["url"], JudgeOptions(scoring="group")).score(["Q"] * 2, ["good", "GARBLE"], {})
        assert "completion 0 (response 1 of its group of 2)" in str(info.value)
        assert "These are all fine, I suppose." in str(info.value)


def test_bedrock_invoke_model_through_stubber(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    model = "anthropic.claude-3-haiku-20240307-v1:0"
    judge = Judge(f"bedrock:{model}", JudgeOptions(max_tokens=16), None, Reach(client=client))
    text = judge.rubric.render("Say hi.", ["hi"], {}, (1, 5))
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    reply = json.dumps({"content": [{"type": "text", "text": "Score: 4"}]}).encode()
    with Stubber(client) as stub:
        stub.add_response("invoke_model", {"body": StreamingBody(io.BytesIO(reply), len(reply)),
                                           "contentType": "application/json"},
                          {"modelId": model, "body": json.dumps(body), "contentType": "application/json",
                           "accept": "application/json"})
        stub.add_client_error("invoke_model", "ThrottlingException", "Rate exceeded")
        assert judge.score(["Say hi."], ["hi"], {}) == [4.0]
        with pytest.raises(ForgeError, match="InvokeModel failed: ThrottlingException.*Rate exceeded"):
            judge.score(["Say hi."], ["hello"], {})
        stub.assert_no_pending_responses()


def test_rubrics_fields_files_and_parsing(tmp_path):
    rubric = load_rubric("summarization_faithfulness")
    assert rubric.fields() == ["document"]
    with pytest.raises(ForgeError, match=r"reads the prompt row's field\(s\) \['document'\]"):
        rubric.render("Summarize.", ["x"], {"title": "t"}, (1, 5))
    rendered = load_rubric("reasoning_correctness").render("6*7?", ["42"], {"reference_answer": 42}, (1, 5))
    assert "Reference answer:\n42" in rendered
    own = tmp_path / "tone.yaml"
    own.write_text("criteria: Is it polite?\ninputs: 'Request: {prompt} ({audience})'\n")
    mine = load_rubric(str(own))
    assert mine.name == "tone" and mine.fields() == ["audience"]
    assert "Request: hi (kids)" in mine.render("hi", ["hello"], {"audience": "kids"}, (1, 5))
    with pytest.raises(ForgeError, match="not a built-in rubric"):
        load_rubric("politeness")
    assert parse_score("The score is 4.", (1, 5)) == 4.0 and parse_score("3", (1, 5)) == 3.0
    assert parse_score("Score: 9", (1, 5)) is None and parse_score("no idea", (1, 5)) is None
    assert parse_group("Response 2: 5\nResponse 1: 2", 2, (1, 5)) == [2.0, 5.0]
    assert parse_group("scores: [3, 4, 1]", 3, (1, 5)) == [3.0, 4.0, 1.0]
    assert parse_group("Response 1: 3", 2, (1, 5)) == [3.0, None]


def test_the_judge_reward_source(tmp_path):
    spec = RewardSource(source="judge:http://127.0.0.1:9/v1", judge={"scoring": "group"})
    assert spec.judge.scoring == "group"
    with pytest.raises(ValueError, match="judge: options need a judge:ADDRESS source"):
        RewardSource(source="r.py:f", judge={})
    with pytest.raises(ValueError, match="expected a Hugging Face model folder"):
        RewardSource(source=f"judge:{tmp_path}")
    with pytest.raises(ValueError, match="not to a judge: source"):
        RewardSource(source="judge:bedrock:x", protocol="nova")
    with judge_server() as srv:
        with Reward(RewardSource(source=f"judge:{srv['url']}", retries=0), cache_dir=tmp_path) as reward:
            assert reward.label == "judge_instruction_following"
            assert reward(["Q", "Q"], ["good", "meh"], {}, 3) == [2.0, 1.0]
            with pytest.raises(RewardError, match=r"reward 'judge:http.*' on batch 4: judge .*completion 0"):
                reward(["Q"], ["GARBLE"], {}, 4)


def test_judge_folders_rubric_files_and_eval_files_are_relative_to_the_recipe(tmp_path):
    from forge.recipe import resolve_paths

    raw = {"stages": [{"kind": "rft", "rewards": [
        {"source": "judge:models/judge", "judge": {"rubric": "rubrics/mine.yaml"}},
        {"source": "judge:catalog://forge-tiny@post-trained", "judge": {"rubric": "instruction_following"}},
        {"source": "judge:http://127.0.0.1:8000/v1"}]}],
        "eval": {"llm_judge": {"judge": "judge:models/judge", "source": "tasks", "rubric": "rubrics/mine.yaml"},
                 "gen_qa": {"source": "data/qa.jsonl"}}}
    out, root = resolve_paths(raw, tmp_path), tmp_path.resolve()
    rewards = out["stages"][0]["rewards"]
    assert rewards[0] == {"source": f"judge:{root}/models/judge", "judge": {"rubric": f"{root}/rubrics/mine.yaml"}}
    assert rewards[1]["source"] == "judge:catalog://forge-tiny@post-trained"
    assert rewards[1]["judge"]["rubric"] == "instruction_following" and rewards[2]["source"] == "judge:http://127.0.0.1:8000/v1"
    assert out["eval"]["llm_judge"] == {"judge": f"{root}/models/judge", "source": "tasks",
                                        "rubric": f"{root}/rubrics/mine.yaml"}
    assert out["eval"]["gen_qa"]["source"] == f"{root}/data/qa.jsonl"


def test_a_bedrock_judge_without_a_region_is_one_line_naming_the_setting(tmp_path, monkeypatch):
    pytest.importorskip("boto3")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "aws_config").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws_config"))
    with pytest.raises(ForgeError, match=r"^judge bedrock:amazon\.nova-lite-v1:0: no AWS region: set the judge's "
                                         r"`region` .*AWS_REGION"):
        Judge("judge:bedrock:amazon.nova-lite-v1:0", JudgeOptions(), None, Reach())


def test_a_judge_folder_without_a_tokenizer_is_one_line_naming_it(tiny_checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "judge"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_checkpoint / name, folder / name)
    with pytest.raises(ForgeError, match=rf"^judge {folder}: no tokenizer in the folder"):
        Judge(str(folder), JudgeOptions())


def test_an_endpoint_judge_that_redirects_is_refused_and_its_key_goes_nowhere(monkeypatch):
    """A chat endpoint answering 302 used to be followed by urllib, the Authorization header with it
    (to whatever host Location named). forge follows no redirect for a judge, as for a reward."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization", ""))
            self.send_error(404)

        do_POST = do_GET

        def log_message(self, *a):
            pass

    class Redirects(Elsewhere):
        def do_POST(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()

    other, first = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere), ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    for srv in (other, first):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUDGE_KEY", "sk-judge-secret")
    try:
        judge = Judge(f"http://127.0.0.1:{first.server_address[1]}/v1", JudgeOptions(model="m", api_key_env="JUDGE_KEY"),
                      None, Reach(retries=0))
        with pytest.raises(ForgeError, match=r"HTTP 302.*redirect to http://127\.0\.0\.1:\d+/steal.*does not follow"):
            judge.score(["Q"], ["good"], {})
    finally:
        for srv in (other, first):
            srv.shutdown()
            srv.server_close()
    assert seen == []  # nothing, and no key, reached the other server
