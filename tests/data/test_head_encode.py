"""The fast SFT tokenization (head-only encoding, offset-free label edges, direct template rendering)
gives exactly what the straightforward path gives: every render through transformers, the whole text
encoded with offsets, a token labelled when it starts inside an assistant span."""
from __future__ import annotations

import bisect
import json
import random
import zlib

import pytest

from forge.data.chat_render import DEFAULT_CHAT_TEMPLATE, GENERATION_TAG, ChatRenderer
from forge.data.examples import preference_examples, sft_examples
from forge.data.formats import (
    IGNORE,
    ChatEncoder,
    FormatSpec,
    FormatStats,
    resolve_chat_template,
    to_messages,
)
from forge.data.head_encode import HeadCutter
from forge.data.packing import pack_best_fit
from forge_testing import shared_path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_GEN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
              "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}"
              "<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["the", "cancer", "cells", "is", "a", "type", "of", "treatment", "don't", "it's", "(ALL)", "2+2=4",
         "1,024", "café", "naïve", "中文", "🙂", "x\ty", "end.", "—", "'quoted'", "e.g.,", "</s>", "<s>",
         "<|user|>", "\u00a0nbsp", "\x1c", "a\rb"]


def reference(tokenizer, spec: FormatSpec, messages: list[dict], seq_len: int, first: int = 0,
              keep_end: bool = False):
    """input_ids and labels the plain way, or None when dropped (too long or nothing labelled).
    `keep_end`: a preference sequence that is too long loses its prompt's start, not its reply's end."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = resolve_chat_template(tokenizer, spec)[0]

    def render(msgs, gen=False):
        return render_jinja_template([msgs], chat_template=template, add_generation_prompt=gen,
                                     **tokenizer.special_tokens_map)[0][0]

    full = render(messages)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    if spec.loss_on == "all":
        labels = list(ids)
    else:
        if GENERATION_TAG.search(template):
            spans = render_jinja_template([messages], chat_template=template, return_assistant_tokens_mask=True,
                                          **tokenizer.special_tokens_map)[1][0]
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= first]
            spans = spans[len(spans) - len(turns):] if turns else []
        else:
            spans = []
            for i, m in enumerate(messages):
                if m["role"] == "assistant" and i >= first:
                    head, upto = render(messages[:i], True), render(messages[:i + 1])
                    spans.append((len(head), len(upto.rstrip()) if len(upto.rstrip()) > len(head) else len(head)))
        if spec.loss_on == "last_assistant":
            spans = spans[-1:]
        labels = [tok if any(a <= s < b for a, b in spans) else IGNORE for tok, (s, _) in zip(ids, offsets)]
    if labels:
        labels[0] = IGNORE
    if len(ids) > seq_len:
        if spec.too_long == "drop":
            return None
        cut, reply = len(ids) - seq_len, next((i for i, x in enumerate(labels) if x != IGNORE), len(ids))
        if keep_end and reply - cut >= 1:
            ids, labels = ids[:1] + ids[1 + cut:], labels[:1] + labels[1 + cut:]
        ids, labels = ids[:seq_len], labels[:seq_len]
    return None if all(x == IGNORE for x in labels) else {"input_ids": ids, "labels": labels}


def random_chat(rng: random.Random, turns: int, words: int) -> list[dict]:
    def text():
        seps = [" ", " ", " ", "  ", "\n", "\n\n", " \n", ""]
        return "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(rng.randint(1, words))).strip() or "ok"

    msgs = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
    for _ in range(turns):
        msgs += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
    return msgs


@pytest.fixture(scope="module")
def tiny_tok(tiny_checkpoint):  # byte-level BPE with the GPT-2 regex, no chat template
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def stories_tok():  # Llama-2 style: Metaspace without split, byte fallback
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shared_path("models", "stories260K"))


@pytest.fixture(scope="module")
def normalizing_tok():  # a tokenizer no cut is proven for (a normalizer): the offsets path throughout
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer, tok.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def check_texts(tok, texts: list[str]) -> int:
    """Every position HeadCutter calls hard is one no token spans, and the head encodes to exactly the
    tokens before it; returns how many positions were checked."""
    cutter = HeadCutter.for_tokenizer(tok.backend_tokenizer)
    assert cutter is not None
    checked = 0
    for text in texts:
        enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
        starts = [s for s, _ in enc.offsets]
        for p in range(1, len(text)):
            if cutter.hard(text, p):
                k = bisect.bisect_left(starts, p)
                assert all(e <= p for _, e in enc.offsets[:k]), (text, p)
                assert tok.backend_tokenizer.encode(text[:p], add_special_tokens=False).ids == enc.ids[:k], (text, p)
                checked += 1
    return checked


@pytest.mark.parametrize("which", ["tiny_tok", "stories_tok"])
def test_hard_positions_split_the_encoding_exactly(request, which):
    tok = request.getfixturevalue(which)
    rng = random.Random(3)
    texts = [ChatRenderer(DEFAULT_CHAT_TEMPLATE, tok.special_tokens_map).render(random_chat(rng, 2, 12))
             for _ in range(6)]
    assert check_texts(tok, texts) > 100


def test_stories_merge_pairs_decide_hardness(stories_tok):
    cutter = HeadCutter.for_tokenizer(stories_tok.backend_tokenizer)
    assert cutter.kind == "metaspace" and cutter.unknown_hard
    vocab = stories_tok.backend_tokenizer.get_vocab()
    joined = next(t for t in vocab if len(t) == 2 and t.isalpha())  # a merged pair: never a cut inside it
    assert not cutter.hard("xx" + joined + "yy", 3)
    assert HeadCutter.for_tokenizer(object()) is None


def test_a_tokenizer_with_a_normalizer_gets_no_cutter_and_the_same_labels(normalizing_tok):
    assert HeadCutter.for_tokenizer(normalizing_tok.backend_tokenizer) is None
    rng = random.Random(5)
    spec = FormatSpec("messages", too_long="truncate")
    for _ in range(10):
        msgs = random_chat(rng, 2, 20)
        assert ChatEncoder(normalizing_tok, spec).encode(msgs, limit=41) == tuple(
            reference(normalizing_tok, spec, msgs, 10**9).values())


def test_python_default_template_equals_jinja(tiny_tok, stories_tok):
    from transformers.utils.chat_template_utils import render_jinja_template

    rng = random.Random(1)
    for tok in (tiny_tok, stories_tok):
        r = ChatRenderer(DEFAULT_CHAT_TEMPLATE, tok.special_tokens_map)
        assert r.python
        for gen in (False, True):
            msgs = random_chat(rng, 3, 8)
            assert r.render(msgs, gen) == render_jinja_template(
                [msgs], chat_template=DEFAULT_CHAT_TEMPLATE, add_generation_prompt=gen, **tok.special_tokens_map)[0][0]


@pytest.mark.parametrize("template", [None, CHATML, CHATML_GEN])
@pytest.mark.parametrize("loss_on", ["assistant", "last_assistant", "all"])
@pytest.mark.parametrize("which", ["tiny_tok", "stories_tok"])
def test_multi_turn_chats_equal_the_reference(request, which, template, loss_on):
    tok = request.getfixturevalue(which)
    rng = random.Random(zlib.crc32(f"{which}{template}{loss_on}".encode()))
    for too_long in ("truncate", "drop"):
        spec = FormatSpec("messages", too_long=too_long, loss_on=loss_on, chat_template=template)
        rows = [(i, f"f:line {i}", {"messages": random_chat(rng, rng.randint(1, 4), rng.choice([3, 20, 80]))})
                for i in range(30)]
        for seq_len in (16, 64, 300):
            want = [reference(tok, spec, row["messages"], seq_len) for _, _, row in rows]
            got = list(sft_examples(rows, tok, spec, seq_len, "s", FormatStats()))
            assert got == [w for w in want if w is not None]
            assert pack_best_fit(got, seq_len, 0) == pack_best_fit([w for w in want if w], seq_len, 0)


def test_tokenizer_template_and_preference_pairs_equal_the_reference(stories_tok):
    import copy

    tok = copy.deepcopy(stories_tok)
    tok.chat_template = CHATML
    rng = random.Random(7)
    spec = FormatSpec("preference", too_long="truncate")
    rows, want = [], []
    for i in range(20):
        chat, long = random_chat(rng, 2, 4), random_chat(rng, 1, 60)[-1]["content"]
        row = {"prompt": chat[:-1], "chosen": long, "rejected": "No " + chat[-1]["content"]}
        rows.append((i, f"p:{i}", row))
        pair = [reference(tok, spec, row["prompt"] + [{"role": "assistant", "content": row[name]}], 128,
                          first=len(row["prompt"]), keep_end=True) for name in ("chosen", "rejected")]
        if all(pair):
            want.append({f"{n}_{k}": pair[j][k] for j, n in enumerate(("chosen", "rejected"))
                         for k in ("input_ids", "labels")})
    stats = FormatStats()
    got = list(preference_examples(rows, tok, spec, 128, "p", stats))
    assert got == want and len(got) >= 10 and stats.truncated >= 3


@pytest.mark.parametrize("seq_len", [128, 512, 2048])
def test_medquad_records_equal_the_reference(stories_tok, seq_len):
    path = shared_path("domain", "medquad_cancergov", "cancergov_qa.jsonl")
    rows = [(i, f"q:{i}", json.loads(line)) for i, line in enumerate(path.read_text().splitlines()[:120])]
    for too_long in ("truncate", "drop"):
        spec = FormatSpec("instruction", fields={"instruction": "question", "output": "answer"}, too_long=too_long)
        stats = FormatStats()
        got = list(sft_examples(rows, stories_tok, spec, seq_len, "qa", stats))
        want = [reference(stories_tok, spec, to_messages(r, spec, w), seq_len) for _, w, r in rows]
        assert got == [w for w in want if w is not None]
        assert stats.truncated + stats.dropped_too_long > 0  # long records were cut, not only short ones seen


def test_padding_set_in_the_tokenizer_file_keeps_text_by_text_encoding(stories_tok):
    from tokenizers import Tokenizer

    from forge.data.head_encode import HeadEncoder

    padded = Tokenizer.from_str(stories_tok.backend_tokenizer.to_str())
    padded.enable_padding(pad_id=0)  # BatchLongest: a batch would pad the shorter texts
    enc = HeadEncoder(padded)
    assert not enc.plain and enc.cutter is None
    texts = ["a short one", "a much longer text than the first one " * 5]
    got = enc.encode(texts, [[(2, 5)], [(0, 10)]], limit=8)
    assert [ids for ids, _ in got] == [stories_tok.backend_tokenizer.encode(t, add_special_tokens=False).ids
                                       for t in texts]
