"""Amazon Nova's data formats read unchanged: the Bedrock conversation schema (SFT), OpenAI chat
messages with tool calls, and the OpenAI reinforcement fine-tuning form (RFT prompts), each mapped
onto forge's chat messages (`forge.data.chat_render` puts them on the chat template).

Forge's messages are `{role, content}` dicts; an assistant turn may add `reasoning_content` (text)
and `tool_calls` (`[{id, type: function, function: {name, arguments: dict}}]`, the Hugging Face
chat-template convention), a tool's answer is `{role: tool, content, tool_call_id}`, and the tool
definitions of a conversation ride on its first message as `tools` (JSON-schema functions).

Schemas, as Amazon documents them:
- Bedrock conversation (`schemaVersion`, `system: [{text}]`, `messages: [{role, content: [block]}]`,
  blocks `text`, `reasoningContent.reasoningText.text`, `toolUse {toolUseId, name, input}` in
  assistant turns, `toolResult {toolUseId, content: [{text}|{json}]}` in user turns, `toolConfig.tools
  [{toolSpec {name, description, inputSchema.json}}]`; image/video/document blocks): "Fine-tune
  Nova 2.0", https://docs.aws.amazon.com/nova/latest/nova2-userguide/nova-fine-tune-2.html, and
  "Preparing data for fine-tuning Understanding models" (first turn user, last assistant),
  https://docs.aws.amazon.com/nova/latest/userguide/fine-tune-prepare-data-understanding.html
- OpenAI-RFT (`{id?, messages: [system, user], reference_answer, ...extra fields}`, text only):
  https://docs.aws.amazon.com/bedrock/latest/userguide/rft-prepare-data.html
Problems raise `Bad(field, problem)`; forge.data.formats turns it into a RecordError with file:line.
"""
from __future__ import annotations

import json
from typing import Any

MEDIA = ("image", "video", "document")  # forge trains text models: these blocks are refused
BLOCKS = ("text", "reasoningContent", "toolUse", "toolResult") + MEDIA


class Bad(Exception):
    """A record that does not follow its format: the field (dotted, with indices) and what is wrong."""

    def __init__(self, fld: str | None, problem: str):
        super().__init__(problem)
        self.fld, self.problem = fld, problem


def _obj(value: Any, fld: str, what: str = "an object") -> dict:
    if not isinstance(value, dict):
        raise Bad(fld, f"expected {what}, got {type(value).__name__}")
    return value


def _text(value: Any, fld: str) -> str:
    if not isinstance(value, str):
        raise Bad(fld, f"expected text, got {type(value).__name__}")
    return value


def _list(row: dict, key: str, fld: str | None = None, required: bool = True) -> list:
    fld = fld or key
    if key not in row or row[key] is None:
        if required:
            raise Bad(fld, f"missing (fields present: {sorted(row)[:12]})")
        return []
    if not isinstance(row[key], list):
        raise Bad(fld, f"expected a list, got {type(row[key]).__name__}")
    return row[key]


# ------------------------------------------------------------------------------ Bedrock conversation
def bedrock_messages(row: Any, messages_field: str = "messages", system_field: str = "system") -> list[dict]:
    """Forge messages of one Bedrock conversation record (`bedrock-conversation-2024`)."""
    row = _obj(row, "record", "a JSON object")
    if "schemaVersion" in row and not isinstance(row["schemaVersion"], str):
        raise Bad("schemaVersion", "expected text (e.g. 'bedrock-conversation-2024')")
    out: list[dict] = []
    system = [_text(_obj(b, f"{system_field}[{i}]").get("text"), f"{system_field}[{i}].text")
              for i, b in enumerate(_list(row, system_field, required=False))]
    if system:
        out.append({"role": "system", "content": "\n".join(system)})
    turns = _list(row, messages_field)
    if not turns:
        raise Bad(messages_field, "the message list is empty")
    uses: set[str] = set()
    for i, m in enumerate(turns):
        at = f"{messages_field}[{i}]"
        role = _obj(m, at).get("role")
        if role not in ("user", "assistant"):
            raise Bad(f"{at}.role", f"bad role {role!r}; Bedrock conversations have 'user' and 'assistant' "
                      "(the system prompt is the record's 'system' list)")
        blocks = _list(m, "content", f"{at}.content")
        if not blocks:
            raise Bad(f"{at}.content", "the content list is empty")
        out += _bedrock_turn(role, blocks, f"{at}.content", uses)
    tools = _bedrock_tools(row)
    if tools:
        out[0] = {**out[0], "tools": tools}
    return out


def _bedrock_turn(role: str, blocks: list, at: str, uses: set[str]) -> list[dict]:
    texts, reasoning, calls, results = [], [], [], []
    for j, block in enumerate(blocks):
        fld = f"{at}[{j}]"
        keys = [k for k in _obj(block, fld) if k in BLOCKS]
        if len(keys) != 1 or len(block) != 1:
            raise Bad(fld, f"a content block has exactly one of {list(BLOCKS)}, this one has {sorted(block)}")
        kind = keys[0]
        body = block[kind]
        if kind in MEDIA:
            raise Bad(f"{fld}.{kind}", f"{kind} content is not supported: forge trains text-only models "
                      "(remove the record, or its non-text blocks)")
        if kind == "text":
            texts.append(_text(body, f"{fld}.text"))
        elif role != ("assistant" if kind in ("reasoningContent", "toolUse") else "user"):
            raise Bad(f"{fld}.{kind}", f"{kind} belongs in {'an assistant' if role == 'user' else 'a user'} turn")
        elif kind == "reasoningContent":
            inner = _obj(_obj(body, f"{fld}.reasoningContent").get("reasoningText"), f"{fld}.reasoningContent.reasoningText")
            reasoning.append(_text(inner.get("text"), f"{fld}.reasoningContent.reasoningText.text"))
        elif kind == "toolUse":
            calls.append(_tool_use(_obj(body, f"{fld}.toolUse"), f"{fld}.toolUse", uses))
        else:
            results.append(_tool_result(_obj(body, f"{fld}.toolResult"), f"{fld}.toolResult", uses))
    if role == "user":
        return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def _tool_use(body: dict, fld: str, uses: set[str]) -> dict:
    uid = _text(body.get("toolUseId"), f"{fld}.toolUseId")
    if uid in uses:
        raise Bad(f"{fld}.toolUseId", f"{uid!r} is used twice in this conversation")
    uses.add(uid)
    args = _obj(body.get("input", {}), f"{fld}.input", "an object (the tool's arguments)")
    return {"id": uid, "type": "function", "function": {"name": _text(body.get("name"), f"{fld}.name"), "arguments": args}}


def _tool_result(body: dict, fld: str, uses: set[str]) -> dict:
    uid = _text(body.get("toolUseId"), f"{fld}.toolUseId")
    if uid not in uses:
        raise Bad(f"{fld}.toolUseId", f"{uid!r} answers no earlier toolUse of this conversation")
    uses.discard(uid)  # each toolUseId is answered once
    parts = []
    for k, part in enumerate(_list(body, "content", f"{fld}.content")):
        p = _obj(part, f"{fld}.content[{k}]")
        if "text" in p:
            parts.append(_text(p["text"], f"{fld}.content[{k}].text"))
        elif "json" in p:
            parts.append(json.dumps(p["json"], ensure_ascii=False))
        else:
            raise Bad(f"{fld}.content[{k}]", f"a tool result is text or json, this one has {sorted(p)}")
    return {"role": "tool", "content": "\n".join(parts), "tool_call_id": uid}


def _bedrock_tools(row: dict) -> list[dict]:
    if row.get("toolConfig") is None:
        return []
    out = []
    for i, tool in enumerate(_list(_obj(row["toolConfig"], "toolConfig"), "tools", "toolConfig.tools")):
        spec = _obj(_obj(tool, f"toolConfig.tools[{i}]").get("toolSpec"), f"toolConfig.tools[{i}].toolSpec")
        schema = _obj(spec.get("inputSchema", {"json": {}}), f"toolConfig.tools[{i}].toolSpec.inputSchema")
        out.append({"type": "function", "function": {
            "name": _text(spec.get("name"), f"toolConfig.tools[{i}].toolSpec.name"),
            "description": spec.get("description", ""), "parameters": schema.get("json", {})}})
    return out


# ------------------------------------------------------------------------------ OpenAI chat messages
def openai_messages(row: Any, messages_field: str = "messages", tools_field: str = "tools") -> list[dict]:
    """Forge messages of one OpenAI chat record: roles system/developer/user/assistant/tool, content as
    text or text parts, assistant `tool_calls` (arguments a JSON string or object), an assistant
    `weight` of 0 or 1 (0: no loss on that turn), and the record's `tools` list."""
    row = _obj(row, "record", "a JSON object")
    turns = _list(row, messages_field)
    if not turns:
        raise Bad(messages_field, "the message list is empty")
    out = [_openai_message(m, f"{messages_field}[{i}]") for i, m in enumerate(turns)]
    tools = _list(row, tools_field, required=False)
    if tools:
        out[0] = {**out[0], "tools": [_obj(t, f"{tools_field}[{i}]") for i, t in enumerate(tools)]}
    return out


def _openai_content(value: Any, fld: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise Bad(fld, f"expected text or a list of text parts, got {type(value).__name__}")
    parts = []
    for k, part in enumerate(value):
        p = _obj(part, f"{fld}[{k}]")
        if p.get("type") != "text":
            raise Bad(f"{fld}[{k}]", f"{p.get('type')!r} content is not supported: forge trains text-only models")
        parts.append(_text(p.get("text"), f"{fld}[{k}].text"))
    return "".join(parts)


def _openai_message(m: Any, at: str) -> dict:
    role = _obj(m, at).get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise Bad(f"{at}.role", f"bad role {role!r}; expected system, developer, user, assistant or tool")
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _openai_content(m.get("content"), f"{at}.content")}
    if role == "tool":
        msg["tool_call_id"] = _text(m.get("tool_call_id"), f"{at}.tool_call_id")
    if role == "assistant":
        if m.get("reasoning_content") is not None:
            msg["reasoning_content"] = _text(m["reasoning_content"], f"{at}.reasoning_content")
        calls = [_openai_call(c, f"{at}.tool_calls[{k}]")
                 for k, c in enumerate(_list(m, "tool_calls", f"{at}.tool_calls", False))]
        if calls:
            msg["tool_calls"] = calls
        if "weight" in m:
            if m["weight"] not in (0, 1) or isinstance(m["weight"], bool):
                raise Bad(f"{at}.weight", f"expected 0 or 1, got {m['weight']!r}")
            msg["weight"] = int(m["weight"])
    return msg


def _openai_call(c: Any, fld: str) -> dict:
    fn = _obj(_obj(c, fld).get("function"), f"{fld}.function")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise Bad(f"{fld}.function.arguments", f"not valid JSON ({e.msg} at character {e.pos})") from None
    return {"id": str(c.get("id", "")), "type": "function",
            "function": {"name": _text(fn.get("name"), f"{fld}.function.name"),
                         "arguments": _obj(args, f"{fld}.function.arguments", "a JSON object")}}


# ------------------------------------------------------------------------------ OpenAI-RFT prompts
def rft_prompt(row: Any, messages_field: str = "messages") -> tuple[list[dict], dict[str, Any]]:
    """(prompt messages, the record's other fields) of one OpenAI-RFT record. The prompt is its
    `messages` (system and user turns, earlier assistant turns allowed), ending with a user turn;
    `id`, `reference_answer` and any extra field go to the rewards (a `tools` list is also put on the
    prompt, as in SFT records: https://docs.aws.amazon.com/nova/latest/nova2-userguide/nova-hp-rft-nova2.html)."""
    row = _obj(row, "record", "a JSON object")
    messages = openai_messages(row, messages_field)
    if messages[-1]["role"] != "user":
        raise Bad(f"{messages_field}[{len(messages) - 1}].role", "an RFT prompt ends with a user turn "
                  f"(the model answers it), this one ends with {messages[-1]['role']!r}")
    if not messages[-1]["content"].strip():
        raise Bad(f"{messages_field}[{len(messages) - 1}].content", "the prompt's user turn is empty")
    return messages, {k: v for k, v in row.items() if k != messages_field}
