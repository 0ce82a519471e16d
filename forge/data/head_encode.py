"""Encode only the head of a long text, with exactly the tokens the whole text starts with, and find
the tokens of character spans without offsets.

SFT keeps at most `seq_len` tokens of a conversation (truncated or dropped beyond that), yet a long
record can be many times longer: encoding all of it was most of the SFT preparation time, and asking
the tokenizer for offsets (to find the assistant spans) about doubles the cost of encoding. Both rest
on one fact: at a character position p that no token of the whole text can span, the tokens of
text[:p] are exactly the whole text's tokens before p. So a long text is encoded up to such a p past
`limit` tokens, and a span edge at such a p is the token count of text[:p] (anything else: offsets).

HeadCutter.hard(text, p) says when that holds, for a BPE model without dropout, word suffixes or
prefixes, ignore_merges or a normalizer (checked on the tokenizer's own JSON; anything else encodes
whole, with offsets), and added tokens that take no whitespace:

* p at the edge of an added token: added tokens split the text into segments encoded one by one.
* ByteLevel pre-tokenizer with its regex: p where a non-space is followed by whitespace (letter, digit
  and punctuation runs stop there), or where a lone whitespace other than ' ' sits between non-spaces;
  the regex ends a piece at p in the head and in the whole, and BPE runs per piece.
* Metaspace (e.g. Llama 2 / stories260K, where a whole segment is one BPE word): no merge can make a
  symbol spanning p if no vocabulary token holds the two characters around p ('x▁' for a space) next
  to each other; merges on either side of p then never interact, so the head alone ends up with the
  same symbols (BPE picks merges by rank, and the head's merges keep their order). Characters outside
  the vocabulary become byte tokens (byte_fallback) that no merge touches.

tests/data/test_head_encode.py checks every position it calls hard against whole encodings, and the
SFT examples against the straightforward path.
"""
from __future__ import annotations

import bisect
import json
import re


class HeadCutter:
    """Safe cut positions for one fast tokenizer (see the module docstring); build with for_tokenizer."""

    def __init__(self, kind: str, added: tuple[str, ...], pairs: frozenset[str] = frozenset(),
                 known: frozenset[str] = frozenset(), unknown_hard: bool = False):
        self.kind = kind  # "bytelevel", "metaspace"
        self.added = added  # added-token strings: they split the text into independently encoded segments
        self.margin = max((len(a) for a in added), default=0) + 1
        self.pairs, self.known, self.unknown_hard = pairs, known, unknown_hard

    @classmethod
    def for_tokenizer(cls, backend) -> HeadCutter | None:
        """A cutter for a `tokenizers.Tokenizer` (transformers' backend_tokenizer), or None if the
        tokenizer is not one whose cuts forge can prove safe."""
        try:
            cfg = json.loads(backend.to_str())
        except Exception:  # not a tokenizers.Tokenizer, or one that cannot serialise
            return None
        model, pre = cfg.get("model") or {}, cfg.get("pre_tokenizer") or {}
        if model.get("type") != "BPE" or model.get("dropout") or model.get("end_of_word_suffix") \
                or model.get("continuing_subword_prefix") or cfg.get("normalizer") is not None \
                or model.get("ignore_merges"):
            return None
        tokens = cfg.get("added_tokens", [])
        if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in tokens):
            return None  # such tokens take whitespace next to them: keep the plain whole encoding
        added = tuple(t["content"] for t in tokens)
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
            return cls("bytelevel", added)
        if pre.get("type") != "Metaspace" or pre.get("replacement") != "\u2581":
            return None
        vocab = model.get("vocab") or {}
        merges = [m.split(" ") if isinstance(m, str) else m for m in model.get("merges") or []]
        byte_merges = any(_BYTE.match(part) for m in merges for part in m)
        return cls("metaspace", added, frozenset(t[i:i + 2] for t in vocab for i in range(len(t) - 1)),
                   frozenset(t for t in vocab if len(t) == 1),
                   unknown_hard=bool(model.get("byte_fallback")) and not byte_merges)

    def hard(self, text: str, p: int) -> bool:
        """No token of the whole text spans character p, and text[:p] encodes to exactly the tokens
        before p."""
        if p <= 0 or p >= len(text):
            return True
        lo = max(0, p - self.margin)
        window = text[lo:p + self.margin]
        edge = False
        for a in self.added:
            i = window.find(a)
            while i >= 0:
                start, end = lo + i, lo + i + len(a)
                if start < p < end:
                    return False
                edge = edge or p in (start, end)
                i = window.find(a, i + 1)
        if edge:  # added tokens split the text into segments that are encoded one by one
            return True
        x, y = text[p - 1], text[p]
        if self.kind == "bytelevel":  # a regex piece ends at p, in the head and in the whole
            if x not in _WS:
                return y in _WS
            return x != " " and y not in _WS and (p < 2 or text[p - 2] not in _WS)
        if self.kind == "metaspace":
            x, y = ("\u2581" if c == " " else c for c in (x, y))
            if x in self.known and y in self.known:
                return x + y not in self.pairs
            return self.unknown_hard
        return False

    def cut(self, text: str, start: int, search: int = 512) -> int | None:
        """The first safe cut position p >= start before a space (text[:p] is the head to encode),
        or None within `search` characters (or past the end)."""
        p = max(start, 1)
        end = min(len(text), p + search)
        while (p := text.find(" ", p, end)) >= 0:
            if self.hard(text, p):
                return p
            p += 1
        return None


_BYTE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# Unicode White_Space, what the ByteLevel regex's \s matches (str.isspace also takes \x1c-\x1f)
_WS = frozenset(" \t\n\x0b\x0c\r\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                + "".join(chr(c) for c in range(0x2000, 0x200B)))


class HeadEncoder:
    """Encodes rendered conversations in batches: token ids (only a head of a long text when a cutter
    proves it exact and `limit` tokens suffice) and the token slices of character spans (a token
    belongs to a span when it starts inside it)."""

    def __init__(self, backend):
        # padding or truncation set in tokenizer.json would change ids in a batch or a head: text by text
        self.plain = getattr(backend, "padding", None) is None and getattr(backend, "truncation", None) is None
        self.backend, self.cutter = backend, HeadCutter.for_tokenizer(backend) if self.plain else None
        self.chars_per_token: float | None = None  # running estimate of where to cut for `limit` tokens

    def encode(self, texts: list[str], spans: list[list[tuple[int, int]]], limit: int | None):
        """[(ids, [(lo, hi) per span])] for each text."""
        if self.cutter is None:  # the Rust tokenizer with offsets (same as transformers' call, less wrapping)
            encs = [self.backend.encode(t, add_special_tokens=False) for t in texts]
            return [(e.ids, token_spans(e.offsets, s)) for e, s in zip(encs, spans)]
        if limit and self.chars_per_token is None and texts:  # a first estimate from a sample of the batch
            sample = "".join(texts)[:20 * limit]
            self.chars_per_token = len(sample) / max(1, len(self._fast([sample])[0]))
        heads = [self._guess(t, limit) for t in texts]
        ids = self._fast(heads)
        for k, text in enumerate(texts):  # a short guess: retry a quarter longer, up to the whole text
            while limit and len(ids[k]) < limit and len(heads[k]) < len(text):
                p = self.cutter.cut(text, len(heads[k]) * 5 // 4 + 16)
                heads[k] = text if p is None else text[:p]
                ids[k] = self._fast([heads[k]])[0]
        cut = [(len(h), len(x)) for h, x, t in zip(heads, ids, texts) if len(h) < len(t)]
        if cut:  # the heads that were cut tell how many characters `limit` tokens take
            self.chars_per_token = 0.5 * self.chars_per_token + 0.5 * sum(c for c, _ in cut) / sum(n for _, n in cut)
        # span edges at positions no token spans: the token count of the text before them (one batch)
        edges = [sorted({p for sp in s for p in sp if 0 < p < len(h)}) for h, s in zip(heads, spans)]
        exact = [sum(e) <= 4 * len(h) + 64 and all(self.cutter.hard(t, p) for p in e)
                 for t, h, e in zip(texts, heads, edges)]
        counts = iter(map(len, self._fast([t[:p] for t, e, ok in zip(texts, edges, exact) if ok for p in e])))
        out = []
        for _t, h, x, s, e, ok in zip(texts, heads, ids, spans, edges, exact):
            if ok:
                at = {0: 0, **{p: next(counts) for p in e}}
                out.append((x, [(at.get(a, len(x)), at.get(b, len(x))) for a, b in s]))
            else:
                out.append((x, token_spans(self.backend.encode(h, add_special_tokens=False).offsets, s)))
        return out

    def _guess(self, text: str, limit: int | None) -> str:
        want = int(limit * self.chars_per_token * 1.05) + 8 if limit else len(text)
        p = self.cutter.cut(text, want) if want < len(text) else None
        return text if p is None else text[:p]

    def _fast(self, texts: list[str]) -> list[list[int]]:  # ids without offsets: about twice as fast
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)] if texts else []


def token_spans(offsets: list, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans as [first, end) token index spans, from the tokens' character offsets."""
    # token start offsets are non-decreasing: each span is one slice of tokens
    return [(bisect.bisect_left(offsets, a, key=_start), bisect.bisect_left(offsets, b, key=_start)) for a, b in spans]


def _start(offset: tuple[int, int]) -> int:
    return offset[0]
