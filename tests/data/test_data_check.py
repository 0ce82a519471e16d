"""`forge data check FILE --as KIND`: every bad record named by file:line and field, Nova's rules and
minimums (100 RFT training records; first turn user, last assistant), no training, and the first
line before any heavy library loads (as every command's: tests/test_cli_first_line.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

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
    assert f"error: {path}:line 3: malformed JSON" in out  # the training reader's words
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


# ------------------------------------------------------------------ what the training reader reads
def run_check(path, capsys, *extra, kind="openai_rft"):
    code = main(["data", "check", str(path), "--as", kind, *extra])
    got = capsys.readouterr()
    assert "unexpected error" not in got.err and "Traceback" not in got.err, got.err
    return code, got.out, got.err


@pytest.mark.parametrize("body, said", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01", "line 1: not UTF-8 text"),
    (json.dumps(RFT).encode() + b'\n{"id": "caf\xe9"}\n', "line 2: not UTF-8 text"),  # Latin-1
    (b"[" * 100_000 + b"\n", "line 1: JSON this reader refuses (RecursionError"),
    (b'{"n": ' + b"1" * 5000 + b"}\n", "line 1: JSON this reader refuses (ValueError"),
])
def test_unreadable_records_are_one_line_each_as_the_training_reader_says(tmp_path, capsys, body, said):
    path = tmp_path / "d.jsonl"
    path.write_bytes(body)
    code, out, _ = run_check(path, capsys)
    assert code == 1 and f"error: {path}:{said}" in out


def test_a_gzipped_file_is_read_as_training_reads_it(tmp_path, capsys):
    import gzip

    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(("".join(json.dumps(RFT) + "\n" for _ in range(100))).encode()))
    code, out, _ = run_check(path, capsys)
    assert code == 0 and out.strip().endswith("100 records as openai_rft: 100 ok, 0 bad, 0 warnings: ok")


def test_a_bare_carriage_return_does_not_split_a_record(tmp_path, capsys):
    from forge.data.readers import read_jsonl

    lines = [json.dumps(RFT) for _ in range(40)]
    lines[4] = lines[4].replace('"messages":', '\r"messages":')  # JSON whitespace: the line trains fine
    lines[29] = "{not json"
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    assert len(list(read_jsonl(path))) == 40
    code, out, _ = run_check(path, capsys)
    assert out.strip().endswith("40 records as openai_rft: 39 ok, 1 bad, 0 warnings: not usable as it is")
    assert f"error: {path}:line 30: " in out and out.count("error: /") == 1


@pytest.mark.parametrize("body", [b"", b"\n \n\t\r\n"])
def test_an_empty_or_blank_file_is_not_ok(tmp_path, capsys, body):
    path = tmp_path / "d.jsonl"
    path.write_bytes(body)
    code, out, _ = run_check(path, capsys, kind="messages")
    assert code == 1 and f"error: {path}: no records" in out and ": ok" not in out


def test_max_errors_must_not_be_negative(tmp_path, capsys):
    code, out, err = run_check(write(tmp_path, [RFT] * 100), capsys, "--max-errors", "-1")
    assert code == 2 and "forge: error: --max-errors -1: expected 0 or more" in err and "more bad" not in out


def test_only_the_first_errors_are_listed_then_a_count(tmp_path, capsys):
    code, out, _ = run_check(write(tmp_path, ["{x"] * 50 + [RFT] * 100), capsys, "--max-errors", "3")
    assert code == 1 and out.count("error: ") == 4 and "error: ... and 47 more bad records" in out


def _peak_kb(tmp_path, path, *extra) -> tuple[int, int, str]:
    """(exit code, peak KB of Python allocations, what it printed) of `forge data check` in a fresh process, counted
    from after its imports (tracemalloc: the process's peak RSS may be an import's, not the check's)."""
    script = textwrap.dedent(f"""
        import tracemalloc
        from forge.cli import main
        import forge.data.check_command, forge.data.formats, forge.data.readers
        tracemalloc.start()
        code = main(["data", "check", {str(path)!r}, "--as", "openai_rft", *{list(extra)!r}])
        print("PEAK", code, tracemalloc.get_traced_memory()[1] // 1024)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("PEAK")]
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    _, code, peak = line[0].split()
    return int(code), int(peak), done.stdout


def test_a_50_mb_line_is_reported_too_long_without_holding_it(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(RFT) + "\n")
        f.write('{"id": "big", "messages": [{"role": "user", "content": "')
        for _ in range(50):
            f.write("a" * (1 << 20))
        f.write('"}], "reference_answer": 1}\n')
    code, peak, out = _peak_kb(tmp_path, path)
    assert code == 1 and peak < 24 * 1024, f"{peak} KB at the peak"
    size = path.stat().st_size - len(json.dumps(RFT)) - 1  # line 2, its newline counted
    assert f"error: {path}:line 2: too long: {size:,} bytes, over the limit of 8,388,608" in out, out


@pytest.mark.slow
def test_a_million_bad_lines_are_counted_not_kept(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{x\n" * 200_000)
    code, peak, out = _peak_kb(tmp_path, path)
    assert code == 1 and peak < 8 * 1024, f"{peak} KB at the peak"
    assert "error: ... and 199980 more bad records" in out
