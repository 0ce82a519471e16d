"""SFT/preference formats: field mapping, HH splitting, chat templates, loss masks, bad records."""
from __future__ import annotations

import copy
import gzip
import json
import re
from itertools import islice

import pytest

from forge.data.examples import OnError, preference_examples, sft_examples
from forge.data.formats import (
    DEFAULT_CHAT_TEMPLATE,
    ChatEncoder,
    FormatSpec,
    FormatStats,
    parse_hh,
    to_messages,
    to_preference,
    tokenize_sft,
)
from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource
from forge_testing import shared_path


def read_rows(path):
    """Structured rows of a file, as the pipeline reads them (Source.rows)."""
    return resolve_source("sft", DataSource(path=str(path)), path.parent).rows()

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_GEN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
              "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}"
              "<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"},
         {"role": "assistant", "content": "Hi there."}, {"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "It is 4."}]


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert t.chat_template is None
    return t


def labelled_runs(tok, ex) -> list[str]:
    """The decoded text of each contiguous run of labelled tokens."""
    runs, cur = [], []
    for i, lab in zip(ex["input_ids"], ex["labels"]):
        if lab != -100:
            assert lab == i
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


# ------------------------------------------------------------------------------------ mappings
def test_messages_with_custom_field_and_role_names():
    spec = FormatSpec("messages", fields={"messages": "conversation", "role": "from", "content": "value"},
                      roles={"human": "user", "gpt": "assistant"})
    row = {"conversation": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    assert to_messages(row, spec, "f:line 1") == [{"role": "user", "content": "Hi"},
                                                  {"role": "assistant", "content": "Hello"}]


def test_instruction_input_output_and_system():
    spec = FormatSpec("instruction", fields={"output": "response"})
    row = {"instruction": "Translate.", "input": "bonjour", "response": "hello", "system": "You translate."}
    assert to_messages(row, spec, "w") == [{"role": "system", "content": "You translate."},
                                           {"role": "user", "content": "Translate.\n\nbonjour"},
                                           {"role": "assistant", "content": "hello"}]
    assert to_messages({"instruction": "Say hi.", "input": "", "response": "hi"}, spec, "w") == [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]


def test_prompt_completion_custom_names_and_conversational_prompt():
    spec = FormatSpec("prompt_completion", fields={"prompt": "question", "completion": "answer"})
    assert to_messages({"question": "Q?", "answer": "A.", "id": 3}, spec, "w") == [
        {"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    row = {"question": CONVO[:4], "answer": "It is 4."}
    assert to_messages(row, spec, "w") == CONVO


def test_explicit_preference_pairs():
    spec = FormatSpec("preference", fields={"prompt": "q", "chosen": "good", "rejected": "bad"})
    prompt, chosen, rejected = to_preference({"q": "Q?", "good": "Yes.", "bad": "No."}, spec, "w")
    assert prompt == [{"role": "user", "content": "Q?"}]
    assert chosen == [{"role": "assistant", "content": "Yes."}]
    assert rejected == [{"role": "assistant", "content": "No."}]
    assert to_messages({"q": "Q?", "good": "Yes.", "bad": "No."}, spec, "w") == prompt + chosen


HH = {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: Why did the chicken...",
      "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: No."}


def test_hh_transcripts_split_at_the_final_assistant_turn():
    prompt, chosen, rejected = to_preference(HH, FormatSpec("hh"), "w")
    assert prompt == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "Tell me a joke."}]
    assert chosen == [{"role": "assistant", "content": "Why did the chicken..."}]
    assert rejected == [{"role": "assistant", "content": "No."}]
    # replies of different lengths: the shared prefix still ends at the last shared human turn
    longer = dict(HH, rejected=HH["rejected"] + "\n\nHuman: Why?\n\nAssistant: Because.")
    p2, c2, r2 = to_preference(longer, FormatSpec("hh"), "w")
    assert p2 == prompt and c2 == chosen and [m["role"] for m in r2] == ["assistant", "user", "assistant"]
    with pytest.raises(ForgeError, match="identical"):
        to_preference({"chosen": HH["chosen"], "rejected": HH["chosen"]}, FormatSpec("hh"), "w")
    with pytest.raises(ForgeError, match=r"w: field 'chosen'.*Human:"):
        to_preference({"chosen": "no markers", "rejected": HH["rejected"]}, FormatSpec("hh"), "w")


def test_hh_rlhf_records_from_shared_data():
    path = shared_path("preference", "hh_rlhf_harmless", "test.jsonl.gz")
    norm = lambda s: re.sub(r"\s+", " ", s).strip()  # noqa: E731
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in islice(f, 40)]
    for row in rows:
        prompt, chosen, rejected = to_preference(row, FormatSpec("hh"), "hh")
        assert prompt[-1]["role"] == "user" and chosen[0]["role"] == rejected[0]["role"] == "assistant"
        for full, reply in ((row["chosen"], chosen), (row["rejected"], rejected)):
            text = "".join(f"\n\n{'Human' if m['role'] == 'user' else 'Assistant'}: {m['content']}"
                           for m in prompt + reply)
            assert norm(text) == norm(full)
        assert parse_hh(row["chosen"], "hh", "chosen")[:len(prompt)] == prompt


# ------------------------------------------------------------------------- templates and masks
def test_assistant_only_labels_cover_exactly_the_replies_and_eos(tok):
    ex = tokenize_sft(CONVO, tok, FormatSpec("messages"), seq_len=512)
    assert labelled_runs(tok, ex) == ["Hi there.</s>", "It is 4.</s>"]
    assert tok.decode(ex["input_ids"]) == ("<s><|system|>\nBe brief.</s><|user|>\nHello?</s><|assistant|>\n"
                                           "Hi there.</s><|user|>\nWhat is 2+2?</s><|assistant|>\nIt is 4.</s>")
    # exact positions: everything after the last assistant header is labelled, nothing before the first
    head = tok(ChatEncoder(tok, FormatSpec("messages")).render(CONVO[:4], add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    assert ex["input_ids"][:len(head)] == head
    assert ex["labels"][len(head):] == ex["input_ids"][len(head):]


def test_last_assistant_and_all_tokens(tok):
    last = tokenize_sft(CONVO, tok, FormatSpec("messages", loss_on="last_assistant"), seq_len=512)
    assert labelled_runs(tok, last) == ["It is 4.</s>"]
    every = tokenize_sft(CONVO, tok, FormatSpec("messages", loss_on="all"), seq_len=512)
    assert every["labels"][0] == -100 and every["labels"][1:] == every["input_ids"][1:]


def test_template_from_recipe_tokenizer_or_default(tok):
    assert ChatEncoder(tok, FormatSpec("messages")).template_origin == "default"
    assert ChatEncoder(tok, FormatSpec("messages")).template == DEFAULT_CHAT_TEMPLATE
    enc = ChatEncoder(tok, FormatSpec("messages", chat_template=CHATML))
    assert enc.template_origin == "recipe"
    ex = tokenize_sft(CONVO, enc, FormatSpec("messages"), seq_len=512)
    assert tok.decode(ex["input_ids"]).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert labelled_runs(tok, ex) == ["Hi there.<|im_end|>", "It is 4.<|im_end|>"]  # trailing newline excluded
    with_tpl = copy.deepcopy(tok)
    with_tpl.chat_template = CHATML
    enc2 = ChatEncoder(with_tpl, FormatSpec("messages"))
    assert enc2.template_origin == "tokenizer"
    assert enc2.encode(CONVO) == enc.encode(CONVO)
    assert ChatEncoder(with_tpl, FormatSpec("messages", chat_template=DEFAULT_CHAT_TEMPLATE)).template_origin == "recipe"


def test_generation_blocks_match_prefix_diffing_and_rescue_unstable_templates(tok):
    plain = ChatEncoder(tok, FormatSpec("messages", chat_template=CHATML))
    tagged = ChatEncoder(tok, FormatSpec("messages", chat_template=CHATML_GEN))
    assert tagged.generation_tags and not plain.generation_tags
    assert tagged.encode(CONVO) == plain.encode(CONVO)
    last = ChatEncoder(tok, FormatSpec("messages", chat_template=CHATML_GEN, loss_on="last_assistant"))
    assert labelled_runs(tok, dict(zip(("input_ids", "labels"), last.encode(CONVO)))) == ["It is 4.<|im_end|>"]
    # a template whose header depends on the whole conversation is not prefix-stable
    unstable = "[{{ messages|length }} turns]" + CHATML
    with pytest.raises(ForgeError, match="generation"):
        ChatEncoder(tok, FormatSpec("messages", chat_template=unstable)).encode(CONVO)
    ex = ChatEncoder(tok, FormatSpec("messages", chat_template="[{{ messages|length }} turns]" + CHATML_GEN)).encode(CONVO)
    assert labelled_runs(tok, dict(zip(("input_ids", "labels"), ex))) == ["Hi there.<|im_end|>", "It is 4.<|im_end|>"]


def test_preference_labels_only_the_replies(tok):
    spec = FormatSpec("hh")
    stats = FormatStats()
    (ex,) = preference_examples([(1, "w", HH)], tok, spec, 512, "hh", stats)
    assert labelled_runs(tok, {"input_ids": ex["chosen_input_ids"], "labels": ex["chosen_labels"]}) == [
        "Why did the chicken...</s>"]
    assert labelled_runs(tok, {"input_ids": ex["rejected_input_ids"], "labels": ex["rejected_labels"]}) == ["No.</s>"]
    n = ex["chosen_labels"].index(next(x for x in ex["chosen_labels"] if x != -100))
    assert ex["chosen_input_ids"][:n] == ex["rejected_input_ids"][:n]


# ------------------------------------------------------------------------------- length policy
def test_too_long_truncate_and_drop_are_counted(tok):
    rows = [(1, "f:line 1", {"prompt": "Q?", "completion": "word " * 200}),
            (2, "f:line 2", {"prompt": "Q?", "completion": "ok"}),
            (3, "f:line 3", {"prompt": "long question " * 100, "completion": "ok"})]
    stats = FormatStats()
    kept = list(sft_examples(rows, tok, FormatSpec("prompt_completion", too_long="drop"), 64, "s", stats))
    assert len(kept) == 1 and stats.dropped_too_long == 2 and stats.examples == 1 and stats.records == 3
    stats = FormatStats()
    kept = list(sft_examples(rows, tok, FormatSpec("prompt_completion", too_long="truncate"), 64, "s", stats))
    # row 3 loses its whole answer to truncation: nothing left to learn, so it is dropped and counted
    assert len(kept) == 2 and len(kept[0]["input_ids"]) == 64 and len(kept[1]["input_ids"]) < 64
    assert stats.truncated == 2 and stats.dropped_no_labels == 1 and stats.examples == 2
    assert stats.as_dict()["data.format.truncated"] == 2


def test_too_long_preference_pairs_lose_the_prompt_start_not_the_reply(tok):
    row = {"prompt": "long question " * 60, "chosen": "Yes, surely.", "rejected": "No."}
    full, cut = (list(preference_examples([(1, "w", row)], tok, FormatSpec("preference", too_long=t), n, "p",
                                          FormatStats())) for t, n in (("drop", 4096), ("truncate", 48)))
    (full,), (cut,) = full, cut
    for side in ("chosen", "rejected"):
        ids, labels = cut[f"{side}_input_ids"], cut[f"{side}_labels"]
        assert len(ids) == 48 and ids[0] == full[f"{side}_input_ids"][0]  # BOS kept
        assert ids[-20:] == full[f"{side}_input_ids"][-20:]  # the reply's end is all there
        assert [x for x in labels if x != -100] == [x for x in full[f"{side}_labels"] if x != -100]


# ---------------------------------------------------------------------------------- bad records
BAD = [
    ('{"messages": [{"role": "user", "content": "hi"}]', "malformed JSON", None),
    ('{"conversation": [{"role": "user", "content": "hi"}]}', "missing", "'messages'"),
    ('{"messages": "hi there"}', "expected a list of messages, got str", "'messages'"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "bad role 'robot'", "'messages[0].role'"),
    ('{"messages": [{"role": "user", "content": 7}]}', "content should be text", "'messages[0].content'"),
    ('{"messages": [{"role": "user"}]}', "needs 'role' and 'content'", "'messages[0]'"),
    ('["messages"]', "expected a JSON object, got list", None),
]
GOOD = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})


@pytest.mark.parametrize("line,problem,fld", BAD, ids=[b[1].split()[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_records_name_file_line_and_field(tmp_path, tok, line, problem, fld):
    path = tmp_path / "sft.jsonl"
    path.write_text(f"{GOOD}\n{line}\n{GOOD}\n")
    with pytest.raises(ForgeError) as err:
        list(sft_examples(read_rows(path), tok, FormatSpec("messages"), 128, "sft", FormatStats()))
    msg = str(err.value)
    assert msg.startswith(f"{path}:line 2: ") and problem in msg
    if fld:
        assert f"field {fld}" in msg


def test_skip_counts_bad_records_and_the_cap_raises(tmp_path, tok):
    path = tmp_path / "sft.jsonl"
    path.write_text("\n".join([GOOD] + [b[0] for b in BAD[:4]] + [GOOD, GOOD]) + "\n")
    stats = FormatStats()
    kept = list(sft_examples(read_rows(path), tok, FormatSpec("messages"), 128, "sft", stats, OnError("skip")))
    assert len(kept) == 3 and stats.skipped_errors == 4 and stats.records == 7
    assert stats.errors[0].startswith(f"{path}:line 2: malformed JSON")
    with pytest.raises(ForgeError, match=r"more than 3 bad records.*line 2.*last: .*line 5"):
        list(sft_examples(read_rows(path), tok, FormatSpec("messages"), 128, "sft", FormatStats(),
                          OnError("skip", 3)))


def test_spec_rejects_unknown_fields_and_roles():
    with pytest.raises(ValueError, match="no field"):
        FormatSpec("instruction", fields={"question": "q"})
    with pytest.raises(ValueError, match="roles"):
        FormatSpec("messages", roles={"bot": "robot"})


def test_a_readers_error_in_place_of_a_row_is_reported_once(tok):
    rows = [(1, "d.jsonl:line 4", ForgeError("d.jsonl:line 4: malformed JSON (Expecting value at column 1)"))]
    with pytest.raises(ForgeError) as err:
        list(sft_examples(rows, tok, FormatSpec("messages"), 128, "d", FormatStats()))
    assert str(err.value) == "d.jsonl:line 4: malformed JSON (Expecting value at column 1)"


def test_rust_fast_path_matches_the_transformers_call(tok):
    enc = ChatEncoder(tok, FormatSpec("messages", chat_template=CHATML))
    assert enc.heads is not None and enc.heads.cutter is not None
    fast = enc.encode(CONVO)
    enc.heads = None
    assert enc.encode(CONVO) == fast


def test_recipe_chat_format_maps_fields_and_rejects_unknown_ones(tmp_path, tok):
    from pydantic import ValidationError

    path = tmp_path / "qa.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"q": "What is the Zephyr pump made of?", "a": "Titanium."}) + "\n")
    cfg = DataSource(path=str(path), chat={"kind": "prompt_completion", "fields": {"prompt": "q", "completion": "a"}})
    source = resolve_source("qa", cfg, tmp_path)
    (ex,) = list(sft_examples(source.rows(), tok, cfg.chat, 128, "qa", FormatStats()))
    labelled = tok.decode([t for t, label in zip(ex["input_ids"], ex["labels"]) if label != -100])
    assert labelled == "Titanium." + tok.eos_token
    with pytest.raises(ValidationError, match="has no field"):
        DataSource(path=str(path), chat={"kind": "prompt_completion", "fields": {"question": "q"}})
