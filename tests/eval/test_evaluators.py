"""Known-answer checks for each evaluator: a model trained to memorise facts (or the preferred
answers) scores 100%, a random one about 0%; retention sees forgetting after domain-only tuning."""
from __future__ import annotations

import pytest

from forge.errors import ForgeError
from forge.eval import evaluators as E
from forge.lm.perplexity import source_blocks
from forge.recipe import PretrainStage
from forge_testing import memorise, pretrain_stage, run_stage

FACTS = [("What is the Zephyr valve made of?", "titanium"),
         ("Where is the Ion pump built?", "Oslo"),
         ("Who fixed the red kite?", "Mia")]


def _model(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_normalize_answer():
    assert E.normalize_answer("  The Answer: Titanium!  ") == "answer titanium"
    assert E.normalize_answer("an  Apple, a pear") == "apple pear"


@pytest.mark.slow
def test_fact_recall_memorised_model_scores_100_random_scores_0(tiny_checkpoint):
    model, tok = _model(tiny_checkpoint)
    before = E.fact_recall(model, tok, FACTS, max_new_tokens=8, device="cpu")
    assert before == {"fact_recall.exact": 0.0, "fact_recall.contains": 0.0}
    memorise(model, tok, [f"{q}\n{a}" for q, a in FACTS])
    after = E.fact_recall(model, tok, FACTS, max_new_tokens=8, device="cpu")
    assert after == {"fact_recall.exact": 1.0, "fact_recall.contains": 1.0}
    # contains: the answer inside a longer generation; exact wants the first line to be the answer
    swapped = [(q, "the " + a.upper() + ".") for q, a in FACTS]  # normalisation: case, article, punctuation
    assert E.fact_recall(model, tok, swapped, max_new_tokens=8, device="cpu")["fact_recall.exact"] == 1.0
    wrong = [(q, "granite") for q, _ in FACTS]
    assert E.fact_recall(model, tok, wrong, max_new_tokens=8, device="cpu")["fact_recall.contains"] == 0.0


@pytest.mark.slow
def test_preference_accuracy_follows_what_the_model_learned(tiny_checkpoint):
    pairs = [("Human: what colour is the sky?\nAssistant:", " blue, on a clear day.", " made of cheese."),
             ("Human: how many legs has a cat?\nAssistant:", " four legs.", " nine wheels."),
             ("", "Tom went to the park.", "Tom went to the moon.")]
    model, tok = _model(tiny_checkpoint)
    memorise(model, tok, [p + c for p, c, _ in pairs])
    assert E.preference_accuracy(model, tok, pairs, "cpu") == {"preference_accuracy": 1.0}
    flipped = [(p, r, c) for p, c, r in pairs]
    assert E.preference_accuracy(model, tok, flipped, "cpu") == {"preference_accuracy": 0.0}


def test_retention_detects_forgetting_after_domain_only_tuning(tmp_path, tiny_checkpoint, generated_sources):
    def stage(name, mixture, steps):
        return PretrainStage(**pretrain_stage(name=name, mixture=mixture, max_steps=steps, optim={"lr": 1e-2}))

    start = run_stage(stage("general", {"general": 1.0}, 40), tiny_checkpoint, generated_sources, tmp_path / "a")
    forgot = run_stage(stage("domain", {"domain": 1.0}, 40), start.checkpoint, generated_sources, tmp_path / "b")
    kept = run_stage(stage("replay", {"domain": 0.5, "general": 0.5}, 40), start.checkpoint, generated_sources,
                     tmp_path / "c")
    start_model, tok = _model(start.checkpoint)
    blocks = source_blocks(generated_sources, ["general"], tok, 32, "eos", 8)
    lost = E.retention(_model(forgot.checkpoint)[0], start_model, blocks, 8, "cpu")["retention.general"]
    held = E.retention(_model(kept.checkpoint)[0], start_model, blocks, 8, "cpu")["retention.general"]
    assert lost > 0.2          # domain-only tuning: general perplexity rose by over 20%
    assert held < lost / 2     # mixing general text back in cuts the rise by more than half
    assert E.retention(start_model, start_model, blocks, 8, "cpu")["retention.general"] == 0.0


def test_custom_evaluator_from_a_file(tmp_path, tiny_checkpoint):
    (tmp_path / "mine.py").write_text(
        "def vocab(model, tokenizer, sources, device):\n    return {'size': len(tokenizer)}\n"
        "def one(model, tokenizer, sources, device):\n    return 1\n"
        "def bad(model, tokenizer, sources, device):\n    return 'x'\n")
    model, tok = _model(tiny_checkpoint)
    fn = E.load_custom("mine.py:vocab", tmp_path)
    assert E.run_custom("mine.py:vocab", fn, model, tok, {}, "cpu") == {"vocab.size": float(len(tok))}
    assert E.run_custom("m.py:one", E.load_custom("mine.py:one", tmp_path), model, tok, {}, "cpu") == {"one": 1.0}
    with pytest.raises(ForgeError, match="returned str"):
        E.run_custom("mine.py:bad", E.load_custom("mine.py:bad", tmp_path), model, tok, {}, "cpu")
    with pytest.raises(ForgeError, match="no function 'nope'"):
        E.load_custom("mine.py:nope", tmp_path)
    with pytest.raises(ForgeError, match="no file"):
        E.load_custom("missing.py:f", tmp_path)
