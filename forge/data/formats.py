"""SFT and preference record formats: map rows to chat messages and tokenize them with loss labels
(`forge.data.examples` streams training examples from rows with them).

A row (one JSON object) becomes chat messages by its format (`messages`, `instruction`,
`prompt_completion`, `preference`, `hh`; Nova's `bedrock`, `openai` and, for RFT prompts,
`openai_rft`: forge.data.nova_formats), with record field names set by the recipe. Messages are
rendered with the recipe's chat template, else the tokenizer's, else DEFAULT_CHAT_TEMPLATE, and
tokenized once; labels are -100 except on the tokens the loss covers (by default every assistant
turn's content plus its end-of-turn token). Bad records raise ForgeError naming the file, line and
field, or are skipped and counted up to a cap.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict

from forge.data.chat_render import DEFAULT_CHAT_TEMPLATE, GENERATION_TAG, ChatRenderer
from forge.data.head_encode import HeadEncoder, token_spans
from forge.data.nova_formats import Bad, bedrock_messages, openai_messages, rft_prompt
from forge.errors import ForgeError

IGNORE = -100
ROLES = ("system", "user", "assistant")

# logical field -> (default record field, required)
FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "messages": {"messages": ("messages", True), "role": ("role", True), "content": ("content", True)},
    "instruction": {"instruction": ("instruction", True), "input": ("input", False),
                    "output": ("output", True), "system": ("system", False)},
    "prompt_completion": {"prompt": ("prompt", True), "completion": ("completion", True),
                          "system": ("system", False)},
    "preference": {"prompt": ("prompt", True), "chosen": ("chosen", True), "rejected": ("rejected", True),
                   "system": ("system", False)},
    "hh": {"chosen": ("chosen", True), "rejected": ("rejected", True)},
    "bedrock": {"messages": ("messages", True), "system": ("system", False)},
    "openai": {"messages": ("messages", True), "tools": ("tools", False)},
    "openai_rft": {"messages": ("messages", True)},
}
Kind = Literal["messages", "instruction", "prompt_completion", "preference", "hh", "bedrock", "openai", "openai_rft"]
NOVA = ("bedrock", "openai", "openai_rft")  # the kinds forge.data.nova_formats reads


@dataclass
class FormatSpec:
    """How records map to conversations and which tokens carry loss: a data source's `chat:`
    section in the recipe (pydantic validates this dataclass there)."""

    __pydantic_config__ = ConfigDict(extra="forbid")
    kind: Kind
    fields: dict[str, str] = field(default_factory=dict)  # logical name -> record field
    roles: dict[str, str] = field(default_factory=dict)  # extra role names, e.g. {"human": "user", "gpt": "assistant"}
    chat_template: str | None = None
    loss_on: Literal["assistant", "all", "last_assistant"] = "assistant"
    too_long: Literal["truncate", "drop"] = "drop"

    def __post_init__(self) -> None:
        if self.kind not in FIELDS:
            raise ValueError(f"format kind {self.kind!r}: expected one of {sorted(FIELDS)}")
        unknown = sorted(set(self.fields) - set(FIELDS[self.kind]))
        if unknown:
            raise ValueError(f"format {self.kind!r} has no field(s) {unknown}; it has {sorted(FIELDS[self.kind])}")
        bad = {k: v for k, v in self.roles.items() if v not in ROLES}
        if bad:
            raise ValueError(f"roles {bad}: each must map to one of {list(ROLES)}")

    def field_name(self, logical: str) -> str:
        return self.fields.get(logical, FIELDS[self.kind][logical][0])


@dataclass
class FormatStats:
    """Counts for one source, logged to MLflow via as_dict()."""

    records: int = 0
    examples: int = 0
    tokens: int = 0
    label_tokens: int = 0
    skipped_errors: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_labels: int = 0
    errors: list[str] = field(default_factory=list)  # the first few error messages, for the log
    kept: list[int] = field(default_factory=list)    # the record number of each example made, in order

    def as_dict(self, prefix: str = "data.format") -> dict[str, int]:
        return {f"{prefix}.{k}": v for k, v in vars(self).items() if isinstance(v, int)}


class RecordError(ForgeError):
    """A bad record: names where it is (file:line) and the field."""

    def __init__(self, where: str, problem: str, fld: str | None = None, logical: str | None = None):
        what = "" if fld is None else f"field {fld!r}" + (f" ({logical})" if logical and logical != fld else "") + ": "
        super().__init__(f"{where}: {what}{problem}")


# ------------------------------------------------------------------------------- rows -> messages
def _get(row: Any, spec: FormatSpec, logical: str, where: str, kinds=(str,)) -> Any:
    if isinstance(row, Exception):  # a reader's stand-in for a malformed line
        raise RecordError(where, str(row).removeprefix(where).lstrip(": "))
    if not isinstance(row, dict):
        raise RecordError(where, f"expected a JSON object, got {type(row).__name__}")
    name = spec.field_name(logical)
    required = FIELDS[spec.kind][logical][1]
    if name not in row or row[name] is None:
        if required:
            raise RecordError(where, f"missing (fields present: {sorted(row)[:12]})", name, logical)
        return None
    value = row[name]
    if not isinstance(value, kinds):
        want = " or ".join("a list of messages" if k is list else "text" for k in kinds)
        raise RecordError(where, f"expected {want}, got {type(value).__name__}", name, logical)
    return value


def _messages(value: Any, spec: FormatSpec, where: str, fld: str) -> list[dict]:
    """Validate a list of {role, content} dicts (field names per spec), normalising role aliases."""
    if not isinstance(value, list):
        raise RecordError(where, f"expected a list of messages, got {type(value).__name__}", fld)
    if not value:
        raise RecordError(where, "the message list is empty", fld)
    rk = spec.field_name("role") if spec.kind == "messages" else "role"
    ck = spec.field_name("content") if spec.kind == "messages" else "content"
    out = []
    for i, m in enumerate(value):
        at = f"{fld}[{i}]"
        if not isinstance(m, dict):
            raise RecordError(where, f"expected a message object, got {type(m).__name__}", at)
        if rk not in m or ck not in m:
            raise RecordError(where, f"a message needs {rk!r} and {ck!r} keys, has {sorted(m)}", at)
        role = spec.roles.get(m[rk], m[rk])
        if role not in ROLES:
            allowed = list(ROLES) + sorted(spec.roles)
            raise RecordError(where, f"bad role {m[rk]!r}; expected one of {allowed}", f"{at}.{rk}")
        if not isinstance(m[ck], str):
            raise RecordError(where, f"content should be text, got {type(m[ck]).__name__}", f"{at}.{ck}")
        out.append({"role": role, "content": m[ck]})
    return out


def _turn(value: str | list, role: str, spec: FormatSpec, where: str, logical: str) -> list[dict]:
    if isinstance(value, list):
        return _messages(value, spec, where, spec.field_name(logical))
    return [{"role": role, "content": value}]


def _system(row: dict, spec: FormatSpec, where: str) -> list[dict]:
    text = _get(row, spec, "system", where) if "system" in FIELDS[spec.kind] else None
    return [{"role": "system", "content": text}] if text else []


def _nova(row: Any, spec: FormatSpec, where: str) -> list[dict]:
    if isinstance(row, Exception):  # a reader's stand-in for a malformed line
        raise RecordError(where, str(row).removeprefix(where).lstrip(": "))
    try:
        if spec.kind == "bedrock":
            return bedrock_messages(row, spec.field_name("messages"), spec.field_name("system"))
        if spec.kind == "openai":
            return openai_messages(row, spec.field_name("messages"), spec.field_name("tools"))
    except Bad as e:
        raise RecordError(where, e.problem, e.fld) from None
    raise ForgeError(f"format {spec.kind!r} holds RFT prompts (for an rft stage), not conversations to train on; "
                     "use kind: bedrock or openai for SFT")


def prompt_messages(row: Any, spec: FormatSpec | None, prompt_field: str, where: str) -> tuple[list[dict], dict]:
    """(prompt messages, the fields rewards receive) of one RFT prompt row: an `openai_rft` record
    (its messages; id, reference_answer and the rest as fields), else a row whose `prompt_field`
    text is the user turn (the other columns as fields)."""
    if isinstance(row, Exception):
        raise RecordError(where, str(row).removeprefix(where).lstrip(": "))
    if spec is not None and spec.kind == "openai_rft":
        try:
            return rft_prompt(row, spec.field_name("messages"))
        except Bad as e:
            raise RecordError(where, e.problem, e.fld) from None
    if not isinstance(row, dict) or not isinstance(row.get(prompt_field), str):
        raise ForgeError(f"{where}: a prompt row needs a text field {prompt_field!r} (prompt_field)")
    if not row[prompt_field].strip():
        raise ForgeError(f"{where}: the prompt ({prompt_field!r}, prompt_field) is empty; an rft prompt needs text")
    return [{"role": "user", "content": row[prompt_field]}], {k: v for k, v in row.items() if k != prompt_field}


def to_messages(row: Any, spec: FormatSpec, where: str) -> list[dict]:
    """An SFT conversation from one record (preference formats give the prompt plus the chosen reply)."""
    if spec.kind in NOVA:
        return _nova(row, spec, where)
    if spec.kind == "messages":
        return _messages(_get(row, spec, "messages", where, (list,)), spec, where, spec.field_name("messages"))
    if spec.kind == "instruction":
        user = _get(row, spec, "instruction", where)
        extra = _get(row, spec, "input", where)
        if extra and extra.strip():
            user = f"{user}\n\n{extra}"
        return _system(row, spec, where) + [{"role": "user", "content": user},
                                            {"role": "assistant", "content": _get(row, spec, "output", where)}]
    if spec.kind == "prompt_completion":
        prompt = _turn(_get(row, spec, "prompt", where, (str, list)), "user", spec, where, "prompt")
        completion = _turn(_get(row, spec, "completion", where, (str, list)), "assistant", spec, where, "completion")
        return _system(row, spec, where) + prompt + completion
    prompt, chosen, _ = to_preference(row, spec, where)
    return prompt + chosen


_HH_TURN = re.compile(r"\n\n(Human|Assistant):")


def parse_hh(text: str, where: str, fld: str) -> list[dict]:
    """'\\n\\nHuman: ...\\n\\nAssistant: ...' -> chat messages (content stripped of surrounding space)."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise RecordError(where, "expected a transcript starting with '\\n\\nHuman:'", fld)
    return [{"role": "user" if r == "Human" else "assistant", "content": c.strip()}
            for r, c in zip(parts[1::2], parts[2::2])]


def to_preference(row: Any, spec: FormatSpec, where: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(prompt messages, chosen reply messages, rejected reply messages)."""
    if spec.kind == "preference":
        prompt = _system(row, spec, where) + _turn(_get(row, spec, "prompt", where, (str, list)), "user", spec, where, "prompt")
        chosen = _turn(_get(row, spec, "chosen", where, (str, list)), "assistant", spec, where, "chosen")
        rejected = _turn(_get(row, spec, "rejected", where, (str, list)), "assistant", spec, where, "rejected")
    elif spec.kind == "hh":
        cf, rf = spec.field_name("chosen"), spec.field_name("rejected")
        c = parse_hh(_get(row, spec, "chosen", where), where, cf)
        r = parse_hh(_get(row, spec, "rejected", where), where, rf)
        k = 0  # the shared turns, cut back so that the prompt ends with a human turn
        while k < min(len(c), len(r)) and c[k] == r[k]:
            k += 1
        while k > 0 and c[k - 1]["role"] != "user":
            k -= 1
        prompt, chosen, rejected = c[:k], c[k:], r[k:]
        if not prompt:
            raise RecordError(where, "chosen and rejected share no human turn to use as the prompt", cf)
    else:
        raise ForgeError(f"format {spec.kind!r} has no preference pairs; use 'preference' or 'hh'")
    for name, reply in (("chosen", chosen), ("rejected", rejected)):
        if not reply or reply[0]["role"] != "assistant":
            raise RecordError(where, "the reply after the shared prompt must start with an assistant turn",
                              spec.field_name(name), name)
    if chosen == rejected:
        raise RecordError(where, "chosen and rejected replies are identical", spec.field_name("chosen"), "chosen")
    return prompt, chosen, rejected


# -------------------------------------------------------------------------- messages -> tokens
def resolve_chat_template(tokenizer, spec: FormatSpec) -> tuple[str, str]:
    """(template, origin): the recipe's, else the tokenizer's, else DEFAULT_CHAT_TEMPLATE."""
    if spec.chat_template:
        return spec.chat_template, "recipe"
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("default")
    if tpl:
        return tpl, "tokenizer"
    if tokenizer.eos_token is None:
        raise ForgeError("the tokenizer has no chat template and no EOS token for the default one; "
                         "give a chat_template in the recipe")
    return DEFAULT_CHAT_TEMPLATE, "default"


def m_weight(message: dict) -> int:
    """A reply's loss weight: OpenAI's per-message `weight` (0 or 1), 1 when absent."""
    return int(message.get("weight", 1))


class ChatEncoder:
    """Renders conversations with one chat template and labels the tokens the loss covers.

    Assistant spans are found in characters: turn i's reply starts where the rendering of
    messages[:i] with the generation prompt ends, and ends where the rendering of messages[:i+1]
    ends (trailing whitespace dropped). If the template has `{% generation %}` blocks, those spans
    are used instead. The full text is tokenized once; a token is labelled when it starts inside a
    span, so a token that straddles the header/reply boundary belongs to the prompt.
    """

    def __init__(self, tokenizer, spec: FormatSpec):
        if not getattr(tokenizer, "is_fast", True):
            raise ForgeError("SFT tokenization needs a fast tokenizer (tokenizer.json) for character offsets")
        self.tokenizer, self.loss_on = tokenizer, spec.loss_on
        self.template, self.template_origin = resolve_chat_template(tokenizer, spec)
        self.generation_tags = bool(GENERATION_TAG.search(self.template))
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.heads = HeadEncoder(self.backend) if self.backend is not None else None
        self.renderer = ChatRenderer(self.template, tokenizer.special_tokens_map)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.renderer.render(messages, add_generation_prompt)

    def _spans(self, messages: list[dict], full: str, first: int, where: str) -> list[tuple[int, int]]:
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        turns = [i for i in replies if i >= first and m_weight(messages[i])]  # OpenAI's weight: 0 turns carry no loss
        if self.loss_on == "last_assistant":
            turns = turns[-1:]
        if self.generation_tags:
            _, spans = self.renderer.spans(messages)
            if len(spans) == len(replies):  # one generation block per reply
                return [span for i, span in zip(replies, spans) if i in turns]
            return spans[len(spans) - len(turns):] if turns else []
        out = []
        for i in turns:
            if i == 0:
                raise RecordError(where, "the conversation starts with an assistant turn (nothing to condition on)")
            head = self.render(messages[:i], add_generation_prompt=True)
            upto = full if i == len(messages) - 1 else self.render(messages[:i + 1])
            if not (full.startswith(head) and full.startswith(upto)):
                raise ForgeError("the chat template does not render a conversation's beginning as a prefix of "
                                 "the whole; add {% generation %} blocks around assistant replies")
            end = len(upto)
            while end > len(head) and full[end - 1].isspace():
                end -= 1
            out.append((len(head), end))
        return out

    def prepare(self, messages: list[dict], where: str = "", first_loss_turn: int = 0):
        """(text, loss spans in characters or None for every token), or RecordError."""
        try:
            full = self.render(messages)
            return full, None if self.loss_on == "all" else self._spans(messages, full, first_loss_turn, where)
        except ForgeError:
            raise
        except Exception as e:  # jinja errors and raise_exception() from the template
            raise RecordError(where, f"the chat template rejected this conversation: {e}") from None

    def encode_prepared(self, prepared: list[tuple[str, list | None]], limit: int | None = None):
        """[(input_ids, labels)] of prepared conversations, tokenized in one batch. With `limit`, a long
        conversation may give only its first tokens, exactly, but at least `limit` of them."""
        texts, spans = [t for t, _ in prepared], [s or [] for _, s in prepared]
        if self.heads is None:
            encs = [self.tokenizer(t, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
                    for t in texts]
            done = [(e["input_ids"], token_spans(e["offset_mapping"], s)) for e, s in zip(encs, spans)]
        else:
            done = self.heads.encode(texts, spans, limit)
        out = []
        for (ids, bounds), (_, sp) in zip(done, prepared):
            if sp is None:
                labels = list(ids)
            else:
                labels = [IGNORE] * len(ids)
                for lo, hi in bounds:
                    labels[lo:hi] = ids[lo:hi]
            if labels:
                labels[0] = IGNORE  # the first token is never predicted (same packed or not)
            out.append((ids, labels))
        return out

    def encode(self, messages: list[dict], where: str = "", first_loss_turn: int = 0,
               limit: int | None = None) -> tuple[list[int], list[int]]:
        """(input_ids, labels) for a conversation, labels on turns at index >= first_loss_turn."""
        return self.encode_prepared([self.prepare(messages, where, first_loss_turn)], limit)[0]


def fit_to_length(ids: list[int], labels: list[int], seq_len: int, policy: str, stats: FormatStats) -> dict | None:
    """An encoded example within seq_len by the too_long policy (drop: None, counted), or as it is."""
    if len(ids) > seq_len:
        if policy == "drop":
            stats.dropped_too_long += 1
            return None
        stats.truncated += 1
        ids, labels = ids[:seq_len], labels[:seq_len]
    n = len(labels) - labels.count(IGNORE)
    if n == 0:
        stats.dropped_no_labels += 1
        return None
    stats.tokens += len(ids)
    stats.label_tokens += n
    return {"input_ids": ids, "labels": labels}


def tokenize_sft(messages: list[dict], tokenizer_or_encoder, spec: FormatSpec, seq_len: int,
                 stats: FormatStats | None = None, where: str = "") -> dict | None:
    """{'input_ids', 'labels'} for one conversation, or None when dropped (too long or nothing labelled)."""
    enc = tokenizer_or_encoder if isinstance(tokenizer_or_encoder, ChatEncoder) else ChatEncoder(tokenizer_or_encoder, spec)
    ids, labels = enc.encode(messages, where, limit=seq_len + 1)
    return fit_to_length(ids, labels, seq_len, spec.too_long, stats if stats is not None else FormatStats())
