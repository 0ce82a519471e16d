"""Exact-answer evaluators by greedy generation: fact recall (a question, its reference answer) and
instruction following (a prompt's conversation, its reference reply), scored on normalised text.

Prompts are plain text after the document separator, or (`chat`) a user turn rendered with the
model's chat template (its tokenizer's, else forge's default: the one SFT trains with) and the
generation prompt; a fact-recall question that is the start of a document's sentence (`complete`)
is plain text as it is, and its completion is scored on how it begins. Generation is batched (left
padding) and stops at EOS/BOS.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass

import torch

from forge.data.chat_render import ChatRenderer
from forge.data.formats import FormatSpec, resolve_chat_template
from forge.data.packing import pad_token_id
from forge.errors import ForgeError
from forge.progress import counted

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD normalisation)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def separator_ids(tokenizer, separator: str) -> list[int]:
    """What precedes a document in training: EOS (end of the one before) or BOS."""
    sep = tokenizer.eos_token_id if separator == "eos" else tokenizer.bos_token_id
    return [sep] if sep is not None else []


class Prompter:
    """Token ids of prompts, plain (`separator` + text) or through the chat template."""

    def __init__(self, tokenizer, chat: bool, separator: str = "eos"):
        self.tokenizer, self.chat, self.separator = tokenizer, chat, separator
        self.renderer = None
        if chat:
            template, _ = resolve_chat_template(tokenizer, FormatSpec(kind="messages"))
            self.renderer = ChatRenderer(template, tokenizer.special_tokens_map)

    def ids(self, prompt: str | list[dict]) -> list[int]:
        if self.renderer is None:
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt) + "\n"
            return separator_ids(self.tokenizer, self.separator) + self._encode(text)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self._encode(self.renderer.render(messages, add_generation_prompt=True))

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, device, batch_size: int = 32) -> list[str]:
    """Greedy completions of token-id prompts (batched, left-padded), each cut at EOS/BOS."""
    stops = [t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id) if t is not None]
    pad = pad_token_id(tokenizer)
    pad = pad if pad is not None else 0
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for i in counted(range(0, len(prompts), batch_size), -(-len(prompts) // batch_size), "eval: answers", "batch"):
            chunk = prompts[i:i + batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
            seqs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                  eos_token_id=stops or None, pad_token_id=pad, top_p=None, top_k=None,
                                  temperature=None)
            for row in seqs[:, width:].tolist():
                cut = next((j for j, t in enumerate(row) if t in stops), len(row))
                out.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


def scores(texts: list[str], answers: list[str]) -> tuple[float, float]:
    """(exact, contains): the generation's first line, normalised, equals the normalised answer;
    the normalised answer appears in the normalised generation."""
    exact = contains = 0
    for text, answer in zip(texts, answers):
        want = normalize_answer(answer)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        exact += normalize_answer(lines[0] if lines else "") == want
        contains += bool(want) and want in normalize_answer(text)
    return exact / len(answers), contains / len(answers)


def completion_scores(texts: list[str], answers: list[str]) -> tuple[float, float]:
    """(exact, contains) of completions of a sentence cut before its answer: the normalised
    completion is the normalised answer, or begins with it and a space (the sentence goes on;
    "66" does not match "6600"); the normalised answer appears in the normalised completion."""
    exact = contains = 0
    for text, answer in zip(texts, answers):
        want, got = normalize_answer(answer), normalize_answer(text)
        exact += bool(want) and (got == want or got.startswith(want + " "))
        contains += bool(want) and want in got
    return exact / len(answers), contains / len(answers)


@dataclass(frozen=True)
class Asking:
    """How fact recall asks: `prompt` places the question (with `chat`, the user turn's text);
    `separator` starts a plain prompt; `name` prefixes the metrics. With `complete` the question
    is the start of a sentence: the prompt is the separator and the question as it is, plain text
    whatever `chat` and `prompt` say, and the completion is scored on how it begins."""

    prompt: str = "{question}\n"
    separator: str = "eos"
    chat: bool = False
    name: str = "fact_recall"
    complete: bool = False


def fact_recall(model, tokenizer, pairs: list[tuple[str, str]], max_new_tokens: int, device,
                asking: Asking = Asking()) -> dict[str, float]:
    """`<name>.exact` and `<name>.contains` over (question, answer) pairs, asked as `asking` says."""
    prompt, separator, chat, name = asking.prompt, asking.separator, asking.chat, asking.name
    if not pairs:
        raise ForgeError(f"{name}: no question/answer pairs to score")
    if asking.complete:
        prompt, chat = "{question}", False  # the sentence start as the documents have it, no turn, no newline
    p = Prompter(tokenizer, chat, separator)
    texts = [prompt.replace("{question}", q).strip() if chat else prompt.replace("{question}", q) for q, _ in pairs]
    out = greedy(model, tokenizer, [p.ids(t) for t in texts], max_new_tokens, device)
    exact, contains = (completion_scores if asking.complete else scores)(out, [a for _, a in pairs])
    return {f"{name}.exact": exact, f"{name}.contains": contains}


def instruction_following(model, tokenizer, conversations: list[tuple[list[dict], str]], max_new_tokens: int,
                          device, chat: bool = True, separator: str = "eos") -> dict[str, float]:
    """`instruct.accuracy` (exact match of the reply's first line) and `instruct.contains` over
    (prompt messages, reference reply) pairs."""
    if not conversations:
        raise ForgeError("instruction following: no prompts with a reference reply to score")
    p = Prompter(tokenizer, chat, separator)
    out = greedy(model, tokenizer, [p.ids(m) for m, _ in conversations], max_new_tokens, device)
    exact, contains = scores(out, [r for _, r in conversations])
    return {"instruct.accuracy": exact, "instruct.contains": contains}
