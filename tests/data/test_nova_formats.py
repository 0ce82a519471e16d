"""Nova's data formats read unchanged: Bedrock conversation records (text, reasoning, tool use and
results, tool definitions) and OpenAI chat messages with tool calls map onto the chat template with
loss on the assistant's own tokens; OpenAI-RFT records become RFT prompts with their fields; media
and malformed records are refused naming file:line and field."""
from __future__ import annotations

import json

import pytest

from forge.data.chat_render import ChatRenderer
from forge.data.examples import sft_examples
from forge.data.formats import FormatSpec, FormatStats, RecordError, prompt_messages, to_messages
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource

# Amazon's tool-calling SFT sample, shortened ("Fine-tune Nova 2.0", Nova 2.0 user guide)
BEDROCK = {
    "schemaVersion": "bedrock-conversation-2024",
    "system": [{"text": "You are an expert in composing function calls."}],
    "toolConfig": {"tools": [{"toolSpec": {"name": "getItemAvailability", "description": "Is an item in stock",
                                           "inputSchema": {"json": {"type": "object", "properties": {
                                               "item_id": {"type": "string"}}}}}}]},
    "messages": [
        {"role": "user", "content": [{"text": "Is id-123 available in 94086?"}]},
        {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "I should check availability."}}},
            {"toolUse": {"toolUseId": "avail_0", "name": "getItemAvailability", "input": {"item_id": "id-123"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "avail_0",
                                                     "content": [{"json": {"availability": True}}]}}]},
        {"role": "assistant", "content": [{"text": "Yes, id-123 is available."}]},
    ],
}
# a template that renders reasoning, tool calls, the tool role and tool definitions itself
NATIVE = ("{% if tools %}[tools]{{ tools | tojson }}\n{% endif %}{% for m in messages %}<{{ m['role'] }}>"
          "{% if m.reasoning_content %}(think){{ m.reasoning_content }}(/think){% endif %}{{ m['content'] }}"
          "{% for c in m.tool_calls or [] %}(call){{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}"
          "{% if m['role'] == 'tool' %}{{ '' }}{% endif %}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def rows_of(tmp_path, records, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path, resolve_source("s", DataSource(path=str(path), holdout=0.0), tmp_path).rows()


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def test_bedrock_record_maps_text_reasoning_and_tools():
    m = to_messages(BEDROCK, FormatSpec("bedrock"), "f:line 1")
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "assistant"]
    assert m[0]["tools"][0]["function"]["name"] == "getItemAvailability"
    assert m[0]["tools"][0]["function"]["parameters"]["properties"] == {"item_id": {"type": "string"}}
    assert m[2]["reasoning_content"] == "I should check availability."
    assert m[2]["tool_calls"] == [{"id": "avail_0", "type": "function",
                                   "function": {"name": "getItemAvailability", "arguments": {"item_id": "id-123"}}}]
    assert m[3] == {"role": "tool", "content": '{"availability": true}', "tool_call_id": "avail_0"}


def test_a_template_without_tools_gets_them_as_text_and_loss_falls_on_the_replies(tmp_path, tok):
    _, rows = rows_of(tmp_path, [BEDROCK])
    [ex] = list(sft_examples(rows, tok, FormatSpec("bedrock"), 512, "s", FormatStats()))
    trained = tok.decode([t for t in ex["labels"] if t != -100])
    assert "<think>" in trained and "I should check availability." in trained
    assert '"name": "getItemAvailability"' in trained and "Yes, id-123 is available." in trained
    assert "availability\": true" not in trained and "94086" not in trained  # the tool's answer and the prompt: no loss
    whole = tok.decode(ex["input_ids"])
    assert "<tool_response>" in whole and "You may call these tools" in whole


def test_a_template_with_tools_renders_them_itself():
    m = to_messages(BEDROCK, FormatSpec("bedrock"), "f:line 1")
    text = ChatRenderer(NATIVE, {"bos_token": "<s>", "eos_token": "</s>"}).render(m)
    assert text.startswith('[tools][{"type": "function"')
    assert "(think)I should check availability.(/think)" in text
    assert '(call)getItemAvailability{"item_id": "id-123"}' in text
    assert '<tool>{"availability": true}</s>' in text and "<tool_call>" not in text


@pytest.mark.parametrize("change, problem", [
    (lambda r: r["messages"][0]["content"].append({"image": {"format": "png", "source": {}}}),
     r"field 'messages\[0\].content\[1\].image': image content is not supported"),
    (lambda r: r["messages"][0]["content"].append({"video": {"format": "mp4"}}),
     r"field 'messages\[0\].content\[1\].video': video content is not supported"),
    (lambda r: r["messages"][2]["content"][0]["toolResult"].update(toolUseId="nope"),
     r"field 'messages\[2\].content\[0\].toolResult.toolUseId': 'nope' answers no earlier toolUse"),
    (lambda r: r["messages"][0]["content"].append({"toolUse": {"toolUseId": "x", "name": "f", "input": {}}}),
     r"field 'messages\[0\].content\[1\].toolUse': toolUse belongs in an assistant turn"),
    (lambda r: r["messages"][1].update(role="system"), r"field 'messages\[1\].role': bad role 'system'"),
    (lambda r: r["messages"][3]["content"][0].update(extra=1),
     r"field 'messages\[3\].content\[0\]': a content block has exactly one of"),
])
def test_bad_bedrock_records_are_refused_naming_file_line_and_field(tmp_path, tok, change, problem):
    bad = json.loads(json.dumps(BEDROCK))
    change(bad)
    path, rows = rows_of(tmp_path, [BEDROCK, bad])
    with pytest.raises(RecordError, match=rf"^{path}:line 2: {problem}"):
        list(sft_examples(rows, tok, FormatSpec("bedrock"), 512, "s", FormatStats()))


OPENAI = {"messages": [
    {"role": "developer", "content": "Use tools."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "assistant", "content": "Sunny in Paris.", "weight": 0},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "You are welcome."}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}


def test_openai_messages_with_tool_calls_and_weights(tmp_path, tok):
    m = to_messages(OPENAI, FormatSpec("openai"), "f:line 1")
    assert m[0]["role"] == "system" and m[0]["tools"][0]["function"]["name"] == "get_weather"
    assert m[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # the JSON string parsed
    assert m[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    _, rows = rows_of(tmp_path, [OPENAI])
    [ex] = list(sft_examples(rows, tok, FormatSpec("openai"), 512, "s", FormatStats()))
    trained = tok.decode([t for t in ex["labels"] if t != -100])
    assert '"city": "Paris"' in trained and "You are welcome." in trained
    assert "Sunny in Paris." not in trained  # weight: 0 carries no loss


@pytest.mark.parametrize("change, problem", [
    (lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{city"),
     r"field 'messages\[2\].tool_calls\[0\].function.arguments': not valid JSON"),
    (lambda r: r["messages"][1].update(content=[{"type": "image_url", "image_url": {"url": "x"}}]),
     r"field 'messages\[1\].content\[0\]': 'image_url' content is not supported"),
    (lambda r: r["messages"][4].update(weight=0.5), r"field 'messages\[4\].weight': expected 0 or 1"),
])
def test_bad_openai_records_name_the_field(change, problem):
    bad = json.loads(json.dumps(OPENAI))
    change(bad)
    with pytest.raises(RecordError, match=rf"^f.jsonl:line 4: {problem}"):
        to_messages(bad, FormatSpec("openai"), "f.jsonl:line 4")


RFT = {"id": "math-001", "messages": [{"role": "system", "content": "You are a math tutor"},
                                      {"role": "user", "content": "Solve: 2x + 5 = 13"}],
       "reference_answer": {"solution": "x = 4"}, "difficulty_level": "easy"}


def test_openai_rft_records_are_prompts_with_their_fields():
    messages, fields = prompt_messages(RFT, FormatSpec("openai_rft"), "prompt", "f:line 1")
    assert messages == RFT["messages"]
    assert fields == {"id": "math-001", "reference_answer": {"solution": "x = 4"}, "difficulty_level": "easy"}
    ends = {**RFT, "messages": RFT["messages"] + [{"role": "assistant", "content": "x = 4"}]}
    with pytest.raises(RecordError, match=r"f:line 9: field 'messages\[2\].role': an RFT prompt ends with a user turn"):
        prompt_messages(ends, FormatSpec("openai_rft"), "prompt", "f:line 9")
    with pytest.raises(ForgeError, match="holds RFT prompts .* use kind: bedrock or openai"):
        to_messages(RFT, FormatSpec("openai_rft"), "f:line 1")
