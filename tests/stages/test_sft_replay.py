"""Plain-text replay in an SFT stage (forge/stages/replay.py): a text source beside chat sources
becomes language-modelling examples of its training split, trains in the same batches, and holds
the general perplexity that SFT alone loses; an SFT stage of plain text only is still refused."""
from __future__ import annotations

import pytest

from forge.data.mixing import in_holdout
from forge.errors import ForgeError
from forge.eval.evaluators import perplexity
from forge.inputs import resolve_source
from forge.lm.perplexity import source_blocks
from forge.recipe import DataSource, SftStage, load_recipe
from forge_testing import base_recipe, run_stage, write_recipe
from sft_fixtures import write_qa


def _sources(tmp_path, generated_sources):
    qa = resolve_source("qa", DataSource(path=str(write_qa(tmp_path / "qa.jsonl")), holdout=0.0,
                                         chat={"kind": "prompt_completion"}), tmp_path)
    return {"qa": qa, "general": generated_sources["general"]}


def _sft(data, **kw) -> SftStage:
    return SftStage(**{"name": "sft", "kind": "sft", "data": data, "max_steps": 30, "seq_len": 64, "batch_size": 8,
                       "optim": {"lr": 2e-2}, "schedule": {"kind": "constant"}, **kw})


def test_text_examples_are_the_training_split_with_loss_on_every_token(tmp_path, tiny_checkpoint, generated_sources):
    from transformers import AutoTokenizer

    from forge.stages.sft import load_examples

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    sources = _sources(tmp_path, generated_sources)
    examples, counts, template = load_examples(_sft(["qa", "general"]), sources, tok, held_out=False)
    general = sources["general"]
    train_docs = [t for n, t in general.records() if not in_holdout("general", n, general.holdout)]
    assert counts["general"].records == len(train_docs) and counts["qa"].records > 0
    text = [e for e in examples if e["labels"][1:] == e["input_ids"][1:]]
    assert len(text) == counts["general"].examples >= len(train_docs)
    assert all(len(e["input_ids"]) <= 64 for e in text) and "assistant" in template
    first = next(e for e in text if e["input_ids"][0] == tok.eos_token_id)
    assert first["labels"][0] == -100  # the separator before a document is context only
    held = load_examples(_sft(["qa", "general"]), sources, tok, held_out=True)[1]["general"]
    assert held.records == len(list(general.records())) - len(train_docs)


def test_replay_holds_general_perplexity_that_sft_alone_loses(tmp_path, tiny_checkpoint, generated_sources):
    sources = _sources(tmp_path, generated_sources)
    alone = run_stage(_sft(["qa"]), tiny_checkpoint, sources, tmp_path / "alone")
    replayed = run_stage(_sft(["qa", "general"]), tiny_checkpoint, sources, tmp_path / "replay")
    assert replayed.tokens_by_source["general"] > 0 and replayed.tokens_by_source["qa"] > 0

    def general_ppl(checkpoint):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(checkpoint)
        blocks = source_blocks(sources, ["general"], tok, 32, "eos", 8)
        return perplexity(AutoModelForCausalLM.from_pretrained(checkpoint), blocks, 8, "cpu")["ppl.general"]

    start, lost, kept = general_ppl(tiny_checkpoint), general_ppl(alone.checkpoint), general_ppl(replayed.checkpoint)
    print(f"general ppl: start {start:.1f}, SFT alone {lost:.1f}, SFT with replay {kept:.1f}")
    assert kept < lost and kept < start  # replay learns the general text the SFT alone forgets


def test_recipes_accept_text_beside_chat_in_sft_only(tmp_path):
    r = base_recipe(tmp_path)
    r["data"]["qa"] = {"path": str(write_qa(tmp_path / "qa.jsonl")), "chat": {"kind": "prompt_completion"}}
    r["stages"] = [{"name": "sft", "kind": "sft", "data": ["qa", "general"], "max_steps": 2, "seq_len": 64}]
    assert load_recipe(write_recipe(tmp_path / "ok.yaml", r)).stages[0].data == ["qa", "general"]
    r["stages"] = [{"name": "sft", "kind": "sft", "data": ["general"], "max_steps": 2, "seq_len": 64}]
    with pytest.raises(ForgeError, match=r"stages\[0\]\.data\[0\]: data.general holds plain text"):
        load_recipe(write_recipe(tmp_path / "text-only.yaml", r))
    r["data"]["pairs"] = {"path": str(tmp_path / "qa.jsonl"), "chat": {"kind": "preference"}}
    r["stages"] = [{"name": "dpo", "kind": "dpo", "data": ["pairs", "general"], "max_steps": 2, "seq_len": 64}]
    with pytest.raises(ForgeError, match=r"stages\[0\]\.data\[1\]: data.general holds plain text"):
        load_recipe(write_recipe(tmp_path / "dpo.yaml", r))


def test_distilled_replay_keeps_the_start_models_predictions(tmp_path, tiny_checkpoint, generated_sources):
    """replay_distill: 1 trains the replayed text toward the input model's own next-token
    distributions, so on that text the trained model stays closer to where it started (KL) than
    plain replay leaves it, while the chat data is learned all the same."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.packing import pad_batches
    from forge.stages.sft import heldout_sft_loss, load_examples
    from forge_testing import Recorder

    sources = _sources(tmp_path, generated_sources)
    plain = run_stage(_sft(["qa", "general"]), tiny_checkpoint, sources, tmp_path / "plain")
    tracker = Recorder()
    distilled = run_stage(_sft(["qa", "general"], replay_distill=1.0), tiny_checkpoint, sources, tmp_path / "distil",
                          tracker)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    blocks = source_blocks(sources, ["general"], tok, 32, "eos", 8)["general"]  # held-out text

    def logps(path):
        with torch.no_grad():
            return F.log_softmax(AutoModelForCausalLM.from_pretrained(path)(input_ids=blocks).logits, -1)

    start = logps(tiny_checkpoint)
    kl = {name: float((start.exp() * (start - logps(r.checkpoint))).sum(-1).mean())
          for name, r in (("plain", plain), ("distilled", distilled))}
    print("KL(start || trained) on the general text:", kl)
    assert kl["distilled"] < 0.5 * kl["plain"]
    examples = load_examples(_sft(["qa"]), sources, tok, held_out=False)[0]
    qa = pad_batches(examples, 8, tok.eos_token_id)[0]

    def qa_loss(path):
        return heldout_sft_loss(AutoModelForCausalLM.from_pretrained(path), qa, torch.device("cpu"))

    learned = {name: qa_loss(path) for name, path in
               (("start", tiny_checkpoint), ("plain", plain.checkpoint), ("distilled", distilled.checkpoint))}
    print("answer loss on the chat data:", learned)
    # the chat data is learned all the same (as with plain replay, its blocks spread over the steps)
    assert learned["distilled"] < 0.8 * learned["start"] and learned["distilled"] < 1.05 * learned["plain"]
    assert all("replay_kl" in m for _, m in tracker.rows if "loss" in m)


def test_distilled_replay_needs_a_text_source(tmp_path, tiny_checkpoint, generated_sources):
    sources = _sources(tmp_path, generated_sources)
    with pytest.raises(ForgeError, match=r"stage sft: replay_distill is 0.5 but no source in data \['qa'\] is plain text"):
        run_stage(_sft(["qa"], replay_distill=0.5), tiny_checkpoint, sources, tmp_path / "x")


def test_distilled_replay_from_the_base_needs_the_pipelines_base(tmp_path, tiny_checkpoint, generated_sources):
    sources = _sources(tmp_path, generated_sources)
    with pytest.raises(ForgeError, match=r"stage sft: replay_teacher: base needs the pipeline's base checkpoint"):
        run_stage(_sft(["qa", "general"], replay_distill=1.0, replay_teacher="base"), tiny_checkpoint, sources,
                  tmp_path / "x")


def test_distilled_replay_from_the_base_loads_the_base_as_teacher(tmp_path, tiny_checkpoint, generated_sources,
                                                                 monkeypatch):
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker
    from forge.train.session import Session

    loaded = []
    real = Session.frozen_input
    monkeypatch.setattr(Session, "frozen_input", lambda self, path=None: loaded.append(path) or real(self, path))
    sources = _sources(tmp_path, generated_sources)
    first = run_stage(_sft(["qa"], max_steps=2), tiny_checkpoint, sources, tmp_path / "first")
    stage = _sft(["qa", "general"], max_steps=2, replay_distill=1.0, replay_teacher="base")
    KINDS["sft"].runner()(stage, StageInputs(first.checkpoint, sources, tmp_path / "second", null_tracker(),
                                             base=tiny_checkpoint, log=lambda *_: None))
    assert loaded == [tiny_checkpoint]  # the pipeline's base, not the stage's input (first.checkpoint)


def test_distilled_replay_packs_apart_from_the_chat_examples():
    """With replay_distill, a block holds replayed text or chat examples, never both (the teacher
    reads only the rows that hold replay); every example is packed once an epoch."""
    from forge.stages.sft import SftStream

    examples = [{"input_ids": [5] * n, "labels": [5] * n, "record": ("qa", i)} for i, n in enumerate(range(3, 40, 3))]
    examples += [{"input_ids": [7] * n, "labels": [7] * n, "teach": True, "record": ("text", i)}
                 for i, n in enumerate(range(5, 30, 4))]
    stream = SftStream(examples, seq_len=48, batch_size=2, packing="best_fit", pad_id=0, seed=0)
    kinds = [{bool(ex_teach) for ex_teach, n in zip(b.get("teach", [False] * 48), range(sum(b["lengths"])))}
             for b in stream.units]
    assert kinds and all(len(k) == 1 for k in kinds)  # one kind of example per block
    assert {True} in kinds and {False} in kinds
    taught = [k == {True} for k in kinds]  # spread evenly: each half of the epoch holds half of each kind
    assert abs(sum(taught[: len(taught) // 2]) - sum(taught) / 2) <= 1
    assert sorted(r for b in stream.units for r in b["records"]) == sorted(ex["record"] for ex in examples)


def test_without_distillation_an_epoch_packs_as_before():
    """No replayed text to distil: one part, packed best-fit and shuffled by the epoch's generator,
    exactly the blocks and order of a plain SFT stage (the reference trajectory depends on it)."""
    import torch

    from forge.data.packing import pack_best_fit
    from forge.stages.post_data import epoch_generator
    from forge.stages.sft import SftStream

    examples = [{"input_ids": [5 + i % 7] * n, "labels": [5] * n, "record": ("qa", i)}
                for i, n in enumerate([3, 17, 9, 30, 12, 5, 22, 8, 40, 2, 14, 6])]
    stream = SftStream(examples, seq_len=48, batch_size=2, packing="best_fit", pad_id=0, seed=3)
    g = epoch_generator(3, 0)
    shuffled = [examples[i] for i in torch.randperm(len(examples), generator=g).tolist()]
    blocks = pack_best_fit(shuffled, 48, 0)
    assert stream.units == [blocks[i] for i in torch.randperm(len(blocks), generator=g).tolist()]


def test_distillation_never_pulls_proprietary_documents_toward_the_teacher(tmp_path, tiny_checkpoint,
                                                                           generated_sources):
    """Documents given to SFT to be learned (a proprietary text source) keep the language-modelling
    loss; only the general replay is distilled toward a teacher that never read them."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from forge.stages.sft import load_examples

    sources = {**_sources(tmp_path, generated_sources), "docs": replace(generated_sources["domain"], proprietary=True)}
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    examples = load_examples(_sft(["qa", "general", "docs"], replay_distill=1.0), sources, tok, held_out=False)[0]
    taught = {ex["record"][0] for ex in examples if ex.get("teach")}
    assert taught == {"general"}
    assert any(ex["record"][0] == "domain" for ex in examples)  # the documents are trained, with the plain loss
