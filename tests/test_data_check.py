"""`forge data check FILE --as KIND`: every bad record named by file:line and field, Nova's rules and
minimums (100 RFT training records; first turn user, last assistant), no training, and the first
line before any heavy library loads (as every command's: tests/test_cli_first_line.py)."""
from __future__ import annotations

import json

import pytest

from forge.cli import main
from forge_testing import REPO
from test_cli_first_line import first_line

RFT = {"id": "q", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
       "reference_answer": {"answer": "4"}}
TURN = {"schemaVersion": "bedrock-conversation-2024", "system": [{"text": "Be kind."}],
        "messages": [{"role": "user", "content": [{"text": "Hi?"}]}, {"role": "assistant", "content": [{"text": "Hello."}]}]}


def write(tmp_path, records, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def check(path, kind, capsys):
    code = main(["data", "check", str(path), "--as", kind])
    return code, capsys.readouterr().out


def test_openai_rft_file_with_bad_records_and_too_few(tmp_path, capsys):
    no_ref = {k: v for k, v in RFT.items() if k != "reference_answer"}
    ends = {**RFT, "messages": RFT["messages"] + [{"role": "assistant", "content": "4"}]}
    path = write(tmp_path, [RFT, RFT, "{not json", no_ref, ends] + [RFT] * 96)
    code, out = check(path, "openai_rft", capsys)
    assert code == 1
    assert f"error: {path}:line 3: not valid JSON" in out
    assert f"error: {path}:line 4: field 'reference_answer': missing: Nova's RFT records carry a reference_answer" in out
    assert f"error: {path}:line 5: field 'messages[2].role': an RFT prompt ends with a user turn" in out
    assert "error: 98 usable records; Nova's reinforcement fine-tuning needs at least 100 training records" in out
    assert out.strip().endswith("101 records as openai_rft: 98 ok, 3 bad, 0 warnings: not usable as it is")
    code, out = check(write(tmp_path, [RFT] * 100, "good.jsonl"), "openai_rft", capsys)
    assert code == 0 and out.strip().endswith("100 records as openai_rft: 100 ok, 0 bad, 0 warnings: ok")


def test_bedrock_file_names_media_and_nova_turn_rules(tmp_path, capsys):
    image = json.loads(json.dumps(TURN))
    image["messages"][0]["content"].append({"image": {"format": "png", "source": {"s3Location": {"uri": "s3://b/x.png"}}}})
    last_user = {**TURN, "messages": TURN["messages"] + [{"role": "user", "content": [{"text": "And?"}]}]}
    reserved = json.loads(json.dumps(TURN))
    reserved["messages"][0]["content"][0]["text"] = "User: hi"
    path = write(tmp_path, [TURN, image, last_user, reserved])
    code, out = check(path, "bedrock", capsys)
    assert code == 1
    assert f"error: {path}:line 2: field 'messages[0].content[1].image': image content is not supported" in out
    assert f"error: {path}:line 3: field 'messages[2].role': Nova: the last turn must be the assistant's" in out
    assert f"warning: {path}:line 4: a user prompt starts with 'User:', one of Nova's reserved keywords" in out
    assert "warning: 2 usable records; Nova recommends at least 100 samples for each task" in out


def test_the_shipped_nova_data_pass(capsys):
    code, out = check(REPO / "recipes" / "data" / "nova_rft.jsonl", "openai_rft", capsys)
    assert code == 0, out


def test_a_bad_field_mapping_is_one_line(tmp_path, capsys):
    code = main(["data", "check", str(write(tmp_path, [RFT])), "--as", "bedrock", "--field", "prompt=x"])
    assert code == 2 and "--field: format 'bedrock' has no field(s) ['prompt']" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["data", "check", "{data}", "--as", "openai_rft"],
    ["reward", "verify", "{reward}", "--data", "{data}", "--n", "1"],
])
def test_the_first_line_comes_before_the_heavy_libraries(command, tmp_path):
    args = [a.format(data=REPO / "recipes" / "data" / "nova_rft.jsonl",
                     reward=f"{REPO / 'recipes' / 'rewards' / 'nova_lambda.py'}:lambda_handler") for a in command]
    got = first_line(args, tmp_path)
    assert got["line"].startswith(f"forge {command[0]} {command[1]} ") and got["heavy"] == [], got
