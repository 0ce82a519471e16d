"""Text that exists on any machine: the prose of the docstrings and comments of the running Python's
standard library, harvested at build time by parsing its source files with `ast` and `tokenize`
(never importing them: a module such as `antigravity` acts when imported), deterministically (files
in sorted order, fixed caps). Nothing else installed is read, so a checkout with more packages builds
the same text. forge.gen.instructions and the forge-tiny foundation build on it.
"""
from __future__ import annotations

import ast
import hashlib
import io
import os
import platform
import random
import re
import sysconfig
import textwrap
import tokenize
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator

# Folders never read: tests, vendored copies, and the parts of the standard library that
# distributions ship as separate packages (Debian's python3-tk, idle, python3-lib2to3,
# python3-distutils, python3-venv), so a system Python and a python.org one read the same files.
SKIP_DIRS = {"test", "tests", "testing", "__pycache__", "site-packages", "dist-packages", "idlelib", "lib2to3",
             "turtledemo", "ensurepip", "tkinter", "distutils", "_vendor", "vendor", "vendored", "examples", "docs",
             "benchmarks", "node_modules", "build", "forge", "pipelines"}  # forge's own code is not general text
SKIP_FILES = {"turtle.py", "this.py", "antigravity.py"}  # turtle ships with Tk; the other two are jokes
MAX_FILE_BYTES = 400_000      # larger files are mostly generated tables
MAX_FILES_PER_ROOT = 20_000
MIN_WORDS = 6                 # a paragraph with fewer words is a label, not prose
_CODE_CHARS = set("{}[]<>=*_`|#$\\@~^")
_WORD = re.compile(r"[A-Za-z][a-z]+")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")


@dataclass(frozen=True)
class Doc:
    """One docstring's prose: where it is from, what kind of object it documents, its text."""

    module: str        # dotted module name, e.g. json.decoder
    name: str          # qualified name inside the module ("" for the module's own docstring)
    kind: str          # module | class | function | topic (language reference) | comments (a module's)
    text: str          # prose paragraphs joined by newlines, each unwrapped to one line
    prose: float       # share of the docstring's characters that survived as prose (0..1)

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"

    @property
    def unit(self) -> str:
        """What is held out together: a module's docstrings, or one topic / one description."""
        return self.key if self.kind == "topic" else self.module

    @property
    def titled(self) -> str:
        """The text under a line naming what it documents (so names and descriptions meet in training)."""
        head = {"module": f"Module {self.module}.", "topic": f"Python reference: {self.name}.",
                "comments": f"Notes in {self.module}."}.get(self.kind, f"{self.module}.{self.name}:")
        return f"{head}\n{self.text}"


def default_roots() -> list[tuple[str, Path]]:
    """(label, folder): the running Python's standard library, and nothing that was installed
    beside it (another set of packages would make another foundation)."""
    return [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]


def source_files(root: Path, cap: int = MAX_FILES_PER_ROOT) -> list[Path]:
    """The root's .py files in sorted order (folders sorted too), skipping tests, vendored code and
    anything that is not a plain file of at most MAX_FILE_BYTES; at most `cap` files."""
    out: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and "-" not in d
                         and not d.endswith((".dist-info", ".egg-info")))
        for name in sorted(files):
            path = Path(folder) / name
            if name.endswith(".py") and not name.startswith("test_") and name not in SKIP_FILES and path.is_file() \
                    and not path.is_symlink() and path.stat().st_size <= MAX_FILE_BYTES:
                out.append(path)
                if len(out) >= cap:
                    return out
    return out


def fingerprint(roots: list[tuple[str, Path]] | None = None, cap: int | None = None) -> dict[str, object]:
    """What a harvest reads, named: the Python version, each root's label and file count, and a
    sha256 of every file's module name and size. Two builds with the same fingerprint parsed the
    same files; another one (another Python release) means other text."""
    digest, counts = hashlib.sha256(), {}
    for label, root in roots or default_roots():
        files = source_files(root, cap or MAX_FILES_PER_ROOT)
        counts[label] = counts.get(label, 0) + len(files)
        for path in files:
            digest.update(f"{module_name(root, path)}\t{path.stat().st_size}\n".encode())
    return {"python": platform.python_version(), "files": counts, "sha256": digest.hexdigest()}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse_docs(path: Path, module: str) -> list[Doc]:
    """The public docstrings of one file (module, classes, functions; private names skipped), read
    with ast.parse, then its prose comments as one more doc: the file is never executed. A file
    that does not parse gives nothing."""
    try:
        source = path.read_bytes()
        docs: list[Doc] = []
        if b'"""' in source or b"'''" in source:  # else no docstring to find (one-quote ones are rare)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences and the like
                tree = ast.parse(source, filename=str(path))
            _collect(tree, module, "", docs)
        notes = comment_prose(source)
        if notes:
            docs.append(Doc(module, "", "comments", "\n".join(notes), 1.0))
    except (SyntaxError, ValueError, RecursionError, OSError, MemoryError, tokenize.TokenError):
        return []
    return docs


def comment_prose(source: bytes) -> list[str]:
    """The file's comment blocks (consecutive `#` lines, joined) that read as prose sentences."""
    blocks: list[list[str]] = []
    last = -2
    for tok in tokenize.tokenize(io.BytesIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.string.lstrip("#").strip()
        if tok.start[0] == last + 1 and blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
        last = tok.start[0]
    out = []
    for block in blocks:
        text = _plain(" ".join(line for line in block if line).translate(_ASCII))
        if _is_prose(text):
            out.append(text)
    return out


def _collect(node: ast.AST, module: str, prefix: str, docs: list[Doc]) -> None:
    kind = "module" if isinstance(node, ast.Module) else "class" if isinstance(node, ast.ClassDef) else "function"
    raw = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
    if raw:
        text, share = prose_of(raw)
        if text:
            docs.append(Doc(module, prefix, kind, text, share))
    for child in getattr(node, "body", []):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not child.name.startswith("_"):
            _collect(child, module, f"{prefix}.{child.name}" if prefix else child.name, docs)


def prose_of(docstring: str) -> tuple[str, float]:
    """(the docstring's prose paragraphs, each unwrapped to one line, joined by newlines; the share
    of its characters kept). Code, doctests, reST directives, tables, field lists and headings go;
    reST/Markdown inline markup (roles, ``literals``, *emphasis*, links) is reduced to its words."""
    kept: list[str] = []
    for para in re.split(r"\n\s*\n", docstring.translate(_ASCII)):
        lines = textwrap.dedent(para).splitlines()
        if not lines or any(_code_line(line) for line in lines):
            continue
        text = _plain(" ".join(line.strip() for line in lines))
        if _is_prose(text):
            kept.append(text)
    total = max(1, len(docstring))
    return "\n".join(kept), sum(len(p) for p in kept) / total


_ASCII = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
                        "\u2026": "...", "\u00a0": " "})
_MARKUP = [(re.compile(r":[\w:.-]+:`~?!?([^`<]*?)(?:\s*<[^`>]*>)?`"), r"\1"),  # :func:`name`, :ref:`text <target>`
           (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),                     # [text](url)
           (re.compile(r"`([^`]+)`_{0,2}"), r"\1"), (re.compile(r"``([^`]+)``"), r"\1"),
           (re.compile(r"(?<![\w*])\*{1,2}([^*\s][^*]*?)\*{1,2}(?![\w*])"), r"\1")]  # *emphasis*, **strong**


def _plain(text: str) -> str:
    text = text.replace("``", "`")
    for pattern, repl in _MARKUP:
        text = pattern.sub(repl, text)
    return re.sub(r"\s{2,}", " ", text)


def _code_line(line: str) -> bool:
    s = line.strip()
    return (line.startswith((" ", "\t")) or s.startswith((">>>", "...", ".. ", ":", "--", "==", "~~", "**", "+", "|",
                                                          "#", "$", "%", "@", "<", "{", "[", "!"))
            or s.endswith((":", "::", ",")) or bool(re.match(r"^[\w.]+\s*[:(=]", s)) or set(s) <= set("=-~*^#+ "))


def _is_prose(text: str) -> bool:
    words = text.split()
    if len(words) < MIN_WORDS or not text[0].isupper() or text[-1] not in ".!?" or not text.isascii():
        return False
    code = sum(c in _CODE_CHARS for c in text)
    plain = sum(bool(_WORD.fullmatch(w.strip(".,;:!?\"'()"))) for w in words)
    return code <= len(text) * 0.03 and plain >= 0.7 * len(words) and "http" not in text


def sentences(text: str) -> list[str]:
    """A prose text cut into sentences (on '. ' followed by a capital letter)."""
    return [s.strip() for line in text.splitlines() for s in _SENTENCE_END.split(line) if s.strip()]


def harvest(roots: list[tuple[str, Path]] | None = None, cap_files: int | None = None,
            workers: int = 2) -> list[Doc]:
    """Every root's docstring and comment prose in sorted file order, then the standard library's
    language reference (pydoc_data/topics.py); a paragraph found twice (a re-exported docstring, a
    copied comment) is kept once, where it first occurs. `workers` processes parse files; the result
    does not depend on their number."""
    return list(_harvest(tuple(roots or default_roots()), cap_files or MAX_FILES_PER_ROOT, workers))


@lru_cache(maxsize=4)
def _harvest(roots: tuple[tuple[str, Path], ...], cap_files: int, workers: int) -> tuple[Doc, ...]:
    jobs = [(str(path), module_name(root, path)) for _, root in roots for path in source_files(root, cap_files)]
    seen: set[bytes] = set()
    docs = [d for found in _parse_all(jobs, workers) for d in found]
    for label, root in roots:
        docs += topic_docs(root) if label == "stdlib" else []
    return tuple(d for d in (_unseen(doc, seen) for doc in docs) if d is not None)


def _unseen(doc: Doc, seen: set[bytes]) -> Doc | None:
    """The doc without the paragraphs an earlier doc already had (an inherited or re-exported
    docstring, a reference topic quoting another): each paragraph is harvested once."""
    keep = []
    for para in doc.text.split("\n"):
        digest = hashlib.blake2b(para.encode(), digest_size=12).digest()
        if digest not in seen:
            seen.add(digest)
            keep.append(para)
    if not keep:
        return None
    return doc if len(keep) == doc.text.count("\n") + 1 else replace(doc, text="\n".join(keep))


def _parse_job(job: tuple[str, str]) -> list[Doc]:
    return parse_docs(Path(job[0]), job[1])


def _parse_all(jobs: list[tuple[str, str]], workers: int) -> Iterator[list[Doc]]:
    """parse_docs over the jobs, in their order; in `workers` forked processes where the platform
    forks (a spawned one would re-run the caller's main script; the children only parse text)."""
    import multiprocessing

    if workers <= 1 or len(jobs) < 200 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(_parse_job, jobs)
        return
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            found = list(pool.map(_parse_job, jobs, chunksize=64))
    except (BrokenProcessPool, OSError):  # a worker died or none could start: parse here instead
        found = list(map(_parse_job, jobs))
    yield from found


def topic_docs(stdlib: Path) -> list[Doc]:
    """The language reference's topics (pydoc_data/topics.py, one dict of strings), read by ast."""
    path = stdlib / "pydoc_data" / "topics.py"
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                    text, share = prose_of(v.value)
                    if text:
                        docs.append(Doc("pydoc_data.topics", str(k.value), "topic", text, share))
    return docs


def held_out(key: str, fraction: float) -> bool:
    """Whether the unit `key` (a module, a word, a number pair) is held out of training, by a hash
    of the key alone: the same module is held out in every curated set built from the harvest."""
    digest = hashlib.blake2b(f"forge-tiny-holdout:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


# ------------------------------------------------------------------------------ curated sets
Flagged = list[tuple[dict, bool]]  # (record, held out)
LONG_MIN_CHARS = 2_400   # ~600 tokens: past the extended context of 512
LONG_MAX_CHARS = 16_000


def general_set(docs: list[Doc], stories: list[str], holdout: float, seed: int) -> Flagged:
    """All harvested prose (one record per docstring, titled) and the generated stories, shuffled."""
    out = [({"text": d.titled}, held_out(d.unit, holdout)) for d in docs]
    out += [({"text": s}, held_out(f"story:{i}", holdout)) for i, s in enumerate(stories)]
    random.Random(f"general:{seed}").shuffle(out)
    return out


def quality(d: Doc) -> bool:
    """The cleanest prose: mostly sentences (prose share), at least two of them, 150+ characters;
    descriptions of modules, classes, topics and packages, or function docs that are all prose."""
    if len(d.text) < 150 or len(sentences(d.text)) < 2:
        return False
    return d.prose >= (0.8 if d.kind == "function" else 0.4)


def highquality_set(docs: list[Doc], holdout: float, seed: int) -> Flagged:
    out = [({"text": d.titled}, held_out(d.unit, holdout)) for d in docs if quality(d)]
    random.Random(f"highquality:{seed}").shuffle(out)
    return out


def long_set(docs: list[Doc], holdout: float, seed: int) -> Flagged:
    """Long documents: a module's docstrings in source order (module first), a reference topic, a
    package description; shorter modules of one package joined (held-out ones only with held-out
    ones) until LONG_MIN_CHARS; each cut at a paragraph near LONG_MAX_CHARS."""
    groups: dict[str, list[Doc]] = {}
    for d in docs:
        groups.setdefault(d.unit, []).append(d)
    out: Flagged = []
    pending: dict[tuple[str, bool], list[str]] = {}
    for unit, group in groups.items():
        held, text = held_out(unit, holdout), "\n\n".join(d.titled for d in group)
        if len(text) < LONG_MIN_CHARS:
            parts = pending.setdefault((unit.split(".")[0], held), [])
            parts.append(text)
            if sum(map(len, parts)) < LONG_MIN_CHARS:
                continue
            text = "\n\n".join(parts)
            parts.clear()
        cut = text.rfind("\n", 0, LONG_MAX_CHARS) if len(text) > LONG_MAX_CHARS else len(text)
        out.append(({"text": text[:cut]}, held))
    random.Random(f"long:{seed}").shuffle(out)
    return out
