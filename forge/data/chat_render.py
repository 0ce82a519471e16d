"""Rendering chat messages with a chat template, fast: the template compiled once and called directly,
and forge's own default template as plain Python (equal to its Jinja rendering; tested).

transformers' render_jinja_template copies every message and argument into plain JSON types before
each call (a safety step for rich objects); forge's messages are already plain `{role, content}`
string dicts, so calling the compiled template gives the same text for less. Renders that need the
`{% generation %}` spans still go through transformers.
"""
from __future__ import annotations

import re

# The default chat template, used when neither the recipe nor the tokenizer gives one:
#   <s><|system|>\n{system}</s><|user|>\n{question}</s><|assistant|>\n{answer}</s>
# Each turn is a role header then the content then EOS; the generation prompt is the assistant
# header. Loss falls on an assistant turn's content and its EOS, never on the header.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


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

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        if self.python and all(type(m.get("role")) is str and type(m.get("content")) is str for m in messages):
            eos = self.eos
            body = "".join([f"<|{m['role']}|>\n{m['content']}{eos}" for m in messages])
            return self.bos + body + ("<|assistant|>\n" if add_generation_prompt else "")
        return self.compiled.render(messages=messages, tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.special)

    def spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        from transformers.utils.chat_template_utils import render_jinja_template

        text, indices = render_jinja_template([messages], chat_template=self.template,
                                              return_assistant_tokens_mask=True, **self.special)
        return text[0], indices[0]
