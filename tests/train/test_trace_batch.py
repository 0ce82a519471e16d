"""Trace a bad batch: when the divergence guard stops or skips a step, its message and the run
(guard/step-N.txt, a tag) name the records of that batch as `source file:line`."""
from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer

from forge.data.sources import name_records
from forge.inputs import resolve_source
from forge.recipe import DataSource, PretrainStage, SftStage
from forge.stages import pretrain, sft
from forge.train.step import Divergence, DivergenceGuard
from forge_testing import Recorder, pretrain_stage, run_stage

POISON = "caf\u00e9 \u00a7\u00a7 na\u00efve \u00fcber \u00f8re"  # the only non-ASCII text: tokens no other record has


def _write(path, rows, bad_line):
    rows[bad_line - 1] = {k: POISON for k in rows[bad_line - 1]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _poison_hook(monkeypatch, module, name, tok, others):
    """The stage's loss becomes NaN on a micro-batch holding a token only the poisoned record has
    (`others`: every token id the clean records give)."""
    marks = set(tok(POISON, add_special_tokens=False)["input_ids"]) - others
    assert marks
    real = getattr(module, name)

    def hooked(model, batch):
        loss = real(model, batch)
        ids = batch if not isinstance(batch, dict) else batch["input_ids"]
        return loss * math.nan if marks & set(ids.flatten().tolist()) else loss

    monkeypatch.setattr(module, name, hooked)


def _trip_files(tracker):
    return {args[1]: args[0] for method, args in tracker.calls if method == "log_text" and args[1].startswith("guard/")}


def test_pretrain_stop_names_the_poisoned_record(tmp_path, monkeypatch, tiny_checkpoint):
    words = "the cat sat on a mat and then it ran to see the dog who was there".split()
    rows = [{"text": " ".join(words[i % 7:i % 7 + 6])} for i in range(30)]
    path = _write(tmp_path / "web.jsonl", rows, 17)
    sources = {"web": resolve_source("web", DataSource(path=str(path), holdout=0.0), tmp_path)}
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    clean = {t for r in rows if r["text"] != POISON for t in tok(r["text"], add_special_tokens=False)["input_ids"]}
    _poison_hook(monkeypatch, pretrain, "causal_lm_loss", tok, clean | {tok.eos_token_id})
    stage = PretrainStage(**pretrain_stage(mixture={"web": 1.0}, max_steps=20, batch_size=1))
    tracker = Recorder()
    with pytest.raises(Divergence, match=rf"loss became nan at step \d+; the batch held: .*web {path}:17"):
        run_stage(stage, tiny_checkpoint, sources, tmp_path / "out", tracker)
    [(name, text)] = _trip_files(tracker).items()
    assert name.startswith("guard/step-") and f"web {path}:17\n" in text and "stopped" in text
    tags = [args[0] for method, args in tracker.calls if method == "set_tags"]
    assert any(f"web {path}:17" in v for t in tags for k, v in t.items() if k.startswith("guard.step-"))


def test_sft_skip_names_the_poisoned_example(tmp_path, monkeypatch, tiny_checkpoint):
    rows = [{"prompt": f"What is {i} plus one?", "completion": f"It is {i + 1}."} for i in range(12)]
    chat = {"kind": "prompt_completion"}
    stage = SftStage(name="sft", kind="sft", data=["qa"], max_steps=6, seq_len=128, batch_size=2, packing="pad",
                     guard={"action": "skip", "max_skips": 5})
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    clean = _write(tmp_path / "clean.jsonl", list(rows), 5).read_text().replace(json.dumps(POISON), '"no"')
    (tmp_path / "clean.jsonl").write_text(clean)
    clean_qa = resolve_source("qa", DataSource(path=str(tmp_path / "clean.jsonl"), holdout=0.0, chat=chat), tmp_path)
    others = {t for ex in sft.load_examples(stage, {"qa": clean_qa}, tok, False)[0] for t in ex["input_ids"]}
    _poison_hook(monkeypatch, sft, "masked_lm_loss", tok, others)
    path = _write(tmp_path / "qa.jsonl", rows, 5)
    qa = resolve_source("qa", DataSource(path=str(path), holdout=0.0, chat=chat), tmp_path)
    tracker = Recorder()
    result = run_stage(stage, tiny_checkpoint, {"qa": qa}, tmp_path / "out", tracker)
    assert result.metrics["guard_skipped_steps"] == 1  # one epoch: the poisoned example once
    [(name, text)] = _trip_files(tracker).items()
    step = name.removeprefix("guard/step-").removesuffix(".txt")
    assert text.startswith(f"stage sft: loss became nan at step {step}; the batch held: ")
    assert f"qa {path}:5" in text.splitlines()[0] and "skipped the batch" in text
    assert f"qa {path}:5\n" in text and text.count(f"qa {path}:") == 2 + 2  # named in the message, then listed


def test_the_message_counts_what_it_does_not_name(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"doc {i}\n\n" for i in range(9)))
    src = resolve_source("t", DataSource(path=str(path)), tmp_path)
    names = name_records({"t": src}, [("t", 3), ("t", 1), ("gone", 2)])
    assert names == [f"t {path}:5", f"t {path}:1", "gone record 2"]  # paragraphs: record 3 starts at line 5

    class Cfg:
        spike_factor, window, action, max_skips = None, 3, "stop", 0

    guard = DivergenceGuard(Cfg(), "stage x", lambda records: [f"s f:{n}" for _, n in records])
    guard.batch = [("s", n) for n in range(1, 9)]
    with pytest.raises(Divergence, match=r"at step 4; the batch held: s f:1, s f:2, s f:3, s f:4, s f:5 and 3 more "
                                         r"\(all in the run's guard/step-4.txt\); stopped"):
        guard.trip(4, "loss became nan")
