"""A document longer than WINDOW_CHARS is tokenized a window at a time, cut where no token of the
whole text can span (forge.data.head_encode): the blocks equal whole-document encoding, resume
inside it is exact, and peak memory follows the window, not the record (a 50 MB record)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from forge.data import mixing
from forge.data.mixing import build_mixture
from forge.inputs import resolve_source
from forge.recipe import DataSource
from forge_testing import REPO, shared_path


def _long_source(tmp_path, n_words=6000, seed=0):
    import random

    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "Ünïcödé", "naïve", "x1", "42,", "well-known", "!", "\tgo", "\nnew"]
    text = " ".join(rng.choice(words) for _ in range(n_words))
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "short first record."}) + "\n" + json.dumps({"text": text}) + "\n"
                    + json.dumps({"text": "and a short last one."}) + "\n")
    return resolve_source("long", DataSource(path=str(path), holdout=0.0), tmp_path), text


def _tokenizers(tiny_checkpoint):
    from transformers import AutoTokenizer

    out = [AutoTokenizer.from_pretrained(tiny_checkpoint)]  # byte-level BPE (GPT-2 regex)
    try:
        out.append(AutoTokenizer.from_pretrained(shared_path("models", "stories260K")))  # Metaspace, byte fallback
    except pytest.skip.Exception:
        pass
    return out


def _blocks(src, tok, n=None):
    mix = build_mixture({"long": src}, {"long": 1.0}, tok, 32, "eos", max_repeats=0, on_exhausted="rebalance")
    out = []
    while (n is None or len(out) < n) and (block := mix.next_block()) is not None:
        out.append(block)
    return out, mix


def test_windowed_encoding_equals_whole_document_encoding(tmp_path, tiny_checkpoint, monkeypatch):
    src, text = _long_source(tmp_path)
    for tok in _tokenizers(tiny_checkpoint):
        whole, _ = _blocks(src, tok)
        monkeypatch.setattr(mixing, "WINDOW_CHARS", 997)  # ~37 windows over the long record
        windowed, mix = _blocks(src, tok)
        monkeypatch.setattr(mixing, "WINDOW_CHARS", 1 << 20)
        assert windowed == whole and len(whole) > 100
        assert mix.streams["long"]._cutter is not None  # the windowed path really ran


def test_resume_inside_a_long_document_is_exact(tmp_path, tiny_checkpoint, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    src, _ = _long_source(tmp_path)
    monkeypatch.setattr(mixing, "WINDOW_CHARS", 997)
    straight, _ = _blocks(src, tok)
    first, mix = _blocks(src, tok, n=57)  # stops mid-document, mid-window
    state = mix.state_dict()
    again = build_mixture({"long": src}, {"long": 1.0}, tok, 32, "eos", max_repeats=0, on_exhausted="rebalance")
    again.load_state_dict(state)
    rest = []
    while (block := again.next_block()) is not None:
        rest.append(block)
    assert first + rest == straight


WINDOW: list[str] = []  # ["1000000000"] encodes the record whole, as forge did before windows (5.8 GB seen)


@pytest.mark.slow
def test_a_50_mb_record_costs_under_500_mb(tmp_path):
    """Peak RSS (VmHWM, reset after setup) over the RSS before streaming every block of one 50 MB record."""
    path = tmp_path / "big.jsonl"
    words = "customer ticket escalated to tier two after the router firmware update failed again ".split()
    with path.open("w") as f:
        f.write('{"text": "')
        size = 0
        i = 0
        while size < 50_000_000:
            chunk = " ".join(words[(i + k) % len(words)] for k in range(1000)) + " "
            f.write(chunk)
            size += len(chunk)
            i += 7
        f.write('"}\n')
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from transformers import AutoTokenizer
        from forge.data.mixing import build_mixture
        from forge.inputs import resolve_source
        from forge.recipe import DataSource
        from forge.train.memory import _rss_bytes, peak_rss_mb, reset_peak_rss
        tok = AutoTokenizer.from_pretrained({str(tmp_path.parent)!r} + "/tok")
        src = resolve_source("big", DataSource(path={str(path)!r}, holdout=0.0), Path({str(tmp_path)!r}))
        mix = build_mixture({{"big": src}}, {{"big": 1.0}}, tok, 256, "eos", max_repeats=0, on_exhausted="rebalance")
        import forge.data.mixing as m
        if len(sys.argv) > 1:
            m.WINDOW_CHARS = int(sys.argv[1])
        reset_peak_rss(); before = _rss_bytes() / 2**20
        blocks = 0
        while mix.next_block() is not None:
            blocks += 1
        print("RESULT", blocks, peak_rss_mb() - before)
    """)
    from forge.scratch import train_tokenizer  # a byte-level BPE like the tiny model's, trained on the words

    small = tmp_path / "words.jsonl"
    small.write_text("".join(json.dumps({"text": " ".join(words[i:] + words[:i])}) + "\n" for i in range(len(words))))
    tok = train_tokenizer([resolve_source("w", DataSource(path=str(small), holdout=0.0), tmp_path)], vocab_size=512)
    tok.save_pretrained(tmp_path.parent / "tok")
    out = subprocess.run([sys.executable, "-c", script, *WINDOW], capture_output=True, text=True, timeout=900)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    assert line, out.stderr[-3000:]
    blocks, grew_mb = int(line[0].split()[1]), float(line[0].split()[2])
    assert blocks > 25_000  # ~7.7M tokens in 256-token blocks: every block came out
    print(f"one 50 MB record: {blocks} blocks, peak {grew_mb:.0f} MB over the baseline")
    assert grew_mb < 500, f"{grew_mb:.0f} MB over the baseline for one 50 MB record"
