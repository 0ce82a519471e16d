"""SFT stage: a tiny model learns a Q&A task (exact match on held-out phrasings), loss falls on
assistant tokens only, the chat template travels with the model, recipes are validated."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.inputs import resolve_source
from forge.recipe import DataSource, SftStage, load_recipe
from forge_testing import base_recipe, run_stage, write_recipe
from sft_fixtures import THINGS, exact_match, write_qa


def qa_source(tmp_path, holdout=0.0, **chat):
    path = write_qa(tmp_path / "qa.jsonl")
    return resolve_source("qa", DataSource(path=str(path), holdout=holdout,
                                           chat={"kind": "prompt_completion", **chat}), tmp_path)


def sft(name="sft", **kw) -> SftStage:
    cfg = {"name": name, "kind": "sft", "data": ["qa"], "max_steps": 100, "seq_len": 64, "batch_size": 8,
           "optim": {"lr": 1e-2}, "schedule": {"kind": "cosine", "warmup_steps": 5}}
    cfg.update(kw)
    return SftStage(**cfg)


def test_labels_cover_assistant_tokens_only(tmp_path, tiny_checkpoint):
    from transformers import AutoTokenizer

    from forge.stages.sft import SftStream, load_examples

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    examples, counts, template = load_examples(sft(), {"qa": qa_source(tmp_path)}, tok, held_out=False)
    assert counts["qa"].examples == len(examples) == 2 * 6 * len(THINGS)
    stream = SftStream(examples, 64, 4, "best_fit", tok.eos_token_id, 0)
    batch = stream.next_batch()
    assert {k for k in batch if not k.startswith("segment_")} == {"input_ids", "labels", "position_ids"}
    for ids, labels, pos in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), batch["position_ids"].tolist()):
        starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
        for a, b in zip(starts, starts[1:]):
            labelled = [t for t, lab in zip(ids[a:b], labels[a:b]) if lab != -100]
            if labelled:  # one labelled run per example: the colour and the end-of-turn token
                assert labelled[-1] == tok.eos_token_id
                assert tok.decode(labelled[:-1]).strip() in THINGS.values()
                assert "?" not in tok.decode(labelled) and "color" not in tok.decode(labelled)
    # every labelled token is a label of itself (no shift in the data), and the answer only
    all_labels = load_examples(sft(train_on="all"), {"qa": qa_source(tmp_path)}, tok, held_out=False)[0]
    assert sum(x != -100 for x in all_labels[0]["labels"]) > 2 * sum(x != -100 for x in examples[0]["labels"])


def test_sft_learns_held_out_phrasings(tmp_path, tiny_checkpoint):
    before = exact_match(tiny_checkpoint)
    result = run_stage(sft(), tiny_checkpoint, {"qa": qa_source(tmp_path)}, tmp_path / "out")
    after = exact_match(result.checkpoint)
    print(f"exact match on held-out phrasings: {before:.2f} -> {after:.2f}; loss {result.metrics['loss']:.3f}")
    assert before <= 0.125 and after >= 0.75
    assert result.metrics["loss"] < 0.5 and 0 < result.metrics["packing_efficiency"] <= 1
    cfg = json.loads((result.checkpoint / "tokenizer_config.json").read_text())
    template = cfg.get("chat_template") or (result.checkpoint / "chat_template.jinja").read_text()
    assert "assistant" in template


def test_padding_trains_too_and_held_out_loss_falls(tmp_path, tiny_checkpoint):
    result = run_stage(sft(max_steps=8, packing="pad"), tiny_checkpoint, {"qa": qa_source(tmp_path, 0.25)},
                       tmp_path / "o")
    assert result.metrics["heldout_examples"] > 0
    assert result.metrics["eval_loss"] < result.metrics["eval_loss_start"] - 0.5
    assert (result.checkpoint / "model.safetensors").is_file()


def _recipe(tmp_path, chat=None, **stage):
    qa = write_qa(tmp_path / "qa.jsonl")
    src = {"path": str(qa), **({"chat": chat} if chat else {})}
    st = {"name": "sft", "kind": "sft", "data": ["qa"], "max_steps": 2, "seq_len": 64, **stage}
    r = base_recipe(tmp_path)
    r["data"]["qa"] = src
    r["stages"] = [st]
    return write_recipe(tmp_path / "r.yaml", r)


def test_sft_on_plain_text_is_refused_with_the_dotted_path(tmp_path):
    with pytest.raises(ForgeError, match=r"stages\[0\]\.data\[0\]: data.qa holds plain text"):
        load_recipe(_recipe(tmp_path))
    assert load_recipe(_recipe(tmp_path, {"kind": "prompt_completion"})).stages[0].kind == "sft"


def test_unknown_lora_target_refused_at_validate(tmp_path):
    with pytest.raises(ForgeError, match=r"stages\[0\]\.lora\.target_modules\[1\]: 'c_attn'"):
        load_recipe(_recipe(tmp_path, {"kind": "prompt_completion"}, lora={"target_modules": ["q_proj", "c_attn"]}))


def test_repeat_holds_a_sources_training_examples_that_many_times_and_names_an_unknown_source(tmp_path, tiny_checkpoint):
    from transformers import AutoTokenizer

    from forge.stages.sft import load_examples

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    sources = {"qa": qa_source(tmp_path, holdout=0.25)}
    once, counts, _ = load_examples(sft(), sources, tok, held_out=False)
    thrice = load_examples(sft(repeat={"qa": 3}), sources, tok, held_out=False)[0]
    assert len(thrice) == 3 * len(once) == 3 * counts["qa"].examples > 0
    assert sorted(map(str, thrice)) == sorted(map(str, once * 3))  # the same examples, each three times
    held = load_examples(sft(repeat={"qa": 3}), sources, tok, held_out=True)[0]
    assert held and held == load_examples(sft(), sources, tok, held_out=True)[0]  # held out: once
    assert sft(repeat={"qa": 3}).sources == {"qa": 3.0}  # MLflow's dataset weight tag
    from forge.data.formats import FormatStats
    from forge.stages.post_data import tokens_by_source
    both = {"qa": FormatStats(tokens=100), "docs": FormatStats(tokens=100)}
    assert tokens_by_source(both, 900, {"qa": 2}) == {"qa": 600, "docs": 300}  # the trained tokens, repeats counted
    with pytest.raises(ForgeError, match=r"stages\[0\]: .*repeat: docs not among the stage's data \(qa\)"):
        load_recipe(_recipe(tmp_path, {"kind": "prompt_completion"}, repeat={"docs": 2}))
    with pytest.raises(ForgeError, match=r"data: qa listed more than once; .* set repeat: \{qa: 2\}"):
        load_recipe(_recipe(tmp_path, {"kind": "prompt_completion"}, data=["qa", "qa"]))
    with pytest.raises(ForgeError, match=r"stages\[0\]\.repeat\.qa"):
        load_recipe(_recipe(tmp_path, {"kind": "prompt_completion"}, repeat={"qa": 0}))
