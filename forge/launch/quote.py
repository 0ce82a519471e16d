"""How a value reaches a file `forge launch` writes. In a script every word is single-quoted
(shlex.quote) except the few shell expansions forge itself writes (`Live`: ${NODE_RANK:-0},
$SLURM_JOB_ID, ...), which never carry a user's value; a comment is one line whatever the
value holds; a YAML file is written by the emitter and parsed back before it is written."""
from __future__ import annotations

import shlex
from typing import Any, Iterable, Iterator

import yaml

from forge.errors import ForgeError


class Live(str):
    """A shell expansion forge writes itself, left live in double quotes (its value is the
    environment's, taken as one word, never parsed again)."""


def shell_word(word: str) -> str:
    if "\0" in word:  # no argv can hold one: bash would drop it and run another word
        raise ForgeError(f"{word!r}: holds a NUL byte (\\0), which no command line can carry")
    return f'"{word}"' if isinstance(word, Live) else shlex.quote(word)


def shell_line(words: Iterable[str]) -> str:
    return " ".join(shell_word(w) for w in words)


def one_line(text: str) -> str:
    """`text` with every character a shell or YAML would end a line at (\\n, \\r, \\x85, \\u2028, ...)
    or could not print written as its escape, so a comment stays one comment."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def comments(lines: Iterable[str]) -> list[str]:
    return [f"# {one_line(h)}" for h in lines]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def yaml_text(doc: dict[str, Any], header: Iterable[str], what: str) -> str:
    """`doc` as YAML under comment lines, checked to parse back to `doc` (else a ForgeError)."""
    for s in _strings(doc):
        if any("\ud800" <= c <= "\udfff" for c in s):  # the emitter would write an escape no reader maps back
            raise ForgeError(f"{what}: {s!r} is not valid UTF-8 (a file name that is not?); rename it")
    text = "\n".join([*comments(header), ""]) + yaml.safe_dump(doc, sort_keys=False)
    try:
        back = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ForgeError(f"{what}: the YAML written does not parse back ({str(e).splitlines()[0]})") from None
    if back != doc:
        raise ForgeError(f"{what}: the YAML written does not parse back to the document forge made")
    return text
