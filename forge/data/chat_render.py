"""Rendering chat messages with a chat template, fast: the template compiled once and called directly,
and forge's own default template as plain Python (equal to its Jinja rendering; tested).

transformers' render_jinja_template copies every message and argument into plain JSON types before
each call (a safety step for rich objects); forge's messages are already plain `{role, content}`
string dicts, so calling the compiled template gives the same text for less. Renders that need the
`{% generation %}` spans still go through transformers.

Messages may carry reasoning, tool calls, tool results and tool definitions (forge.data.nova_formats).
A template that handles them (it names `reasoning_content`, `tool_calls`, the `tool` role, `tools`)
gets them as they are; for one that does not, they are written into the text in the widely used
open forms: reasoning as `<think>...</think>` before the reply (Qwen3, DeepSeek-R1), each call as
`<tool_call>{"name", "arguments"}</tool_call>` after it and a result as a user turn
`<tool_response>...</tool_response>` (Hermes / Qwen2.5), the definitions in the system prompt.
"""
from __future__ import annotations

import json
import re
from typing import Any

# The default chat template, used when neither the recipe nor the tokenizer gives one:
#   <s><|system|>\n{system}</s><|user|>\n{question}</s><|assistant|>\n{answer}</s>
# Each turn is a role header then the content then EOS; the generation prompt is the assistant
# header. Loss falls on an assistant turn's content and its EOS, never on the header.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
PLAIN = frozenset(("role", "content"))


class Features:
    """What a chat template renders itself: reasoning, tool calls, the tool role, tool definitions."""

    def __init__(self, template: str):
        self.reasoning = "reasoning_content" in template
        self.tool_calls = "tool_calls" in template
        self.tool_role = bool(re.search(r"""['"]tool['"]""", template))
        self.tools = bool(re.search(r"\btools\b", template))


def _call_text(call: dict) -> str:
    fn = call.get("function", call)
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments", {})},
                                         ensure_ascii=False) + "\n</tool_call>"


def adapt(messages: list[dict], features: Features) -> tuple[list[dict], list[dict] | None]:
    """(messages for the template, tool definitions to pass it): what the template does not render
    itself is written into the text (see the module docstring); forge's own keys are dropped."""
    tools = next((m["tools"] for m in messages[:1] if m.get("tools")), None)
    out: list[dict] = []
    for m in messages:
        m = {k: v for k, v in m.items() if k not in ("tools", "weight")}
        if m["role"] == "tool" and not features.tool_role:
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        if m.get("tool_calls") and not features.tool_calls:
            m["content"] = "\n".join([t for t in (m["content"], *map(_call_text, m.pop("tool_calls"))) if t])
        if m.get("reasoning_content") and not features.reasoning:
            m["content"] = f"<think>\n{m.pop('reasoning_content')}\n</think>\n\n{m['content']}"
        out.append(m)
    if tools and not features.tools:
        listed = "You may call these tools (JSON Schema):\n" + json.dumps(tools, ensure_ascii=False)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{listed}"}
        else:
            out.insert(0, {"role": "system", "content": listed})
        tools = None
    return out, tools


class ChatRenderer:
    """render(messages, add_generation_prompt) -> text, and spans(messages) -> (text, generation spans)."""

    def __init__(self, template: str, special_tokens: dict):
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.template, self.special = template, dict(special_tokens)
        self.compiled = _compile_jinja_template(template)
        self.python = template == DEFAULT_CHAT_TEMPLATE and all(
            isinstance(self.special[k], str) for k in ("bos_token", "eos_token") if k in self.special)
        # an absent token renders as Jinja's Undefined, i.e. nothing
        self.bos, self.eos = self.special.get("bos_token") or "", self.special.get("eos_token") or ""
        self.features = Features(template)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        tools: Any = None
        if any(m.keys() - PLAIN for m in messages):
            messages, tools = adapt(messages, self.features)
        if self.python and all(type(m.get("role")) is str and type(m.get("content")) is str for m in messages):
            eos = self.eos
            body = "".join([f"<|{m['role']}|>\n{m['content']}{eos}" for m in messages])
            return self.bos + body + ("<|assistant|>\n" if add_generation_prompt else "")
        return self.compiled.render(messages=messages, tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.special)

    def spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        from transformers.utils.chat_template_utils import render_jinja_template

        tools = None
        if any(m.keys() - PLAIN for m in messages):
            messages, tools = adapt(messages, self.features)
        text, indices = render_jinja_template([messages], tools=tools, chat_template=self.template,
                                              return_assistant_tokens_mask=True, **self.special)
        return text[0], indices[0]
