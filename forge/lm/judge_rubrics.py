"""Judge rubrics: the built-in templates of judge_rubrics.yaml or a user's rubric file, rendered into
the text a judge reads (one response, or every response to a prompt), and the scores read back from
a judge's text answer, with errors that name the completion and quote the judge's raw answer."""
from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from forge.errors import ForgeError

BUILT_IN = Path(__file__).with_name("judge_rubrics.yaml")
_NUMBER = r"(-?\d+(?:\.\d+)?)"


class JudgeError(ForgeError):
    """A judge failed or answered with no readable score; the message names what and where."""


def _short(text: str, n: int = 160) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= n else flat[:n] + "...")


@dataclass(frozen=True)
class Rubric:
    """A named rubric: criteria and inputs, placed in the pointwise and group frames."""

    name: str
    criteria: str
    inputs: str
    pointwise: str
    group: str

    def fields(self) -> list[str]:
        """The prompt-row fields its templates read (beyond prompt, completion and the scale)."""
        text = self.inputs + self.pointwise + self.group + self.criteria
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f]
        own = {"prompt", "completion", "completions", "responses", "low", "high", "criteria", "inputs"}
        return [n for n in dict.fromkeys(names) if n not in own]

    def render(self, prompt: str, completions: list[str], fields: dict[str, Any], scale: tuple[int, int]) -> str:
        """The judge's text for one completion (pointwise) or, given several, for the group."""
        values = {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in fields.items()}
        missing = [f for f in self.fields() if f not in values]
        if missing:
            raise JudgeError(f"rubric {self.name!r} reads the prompt row's field(s) {missing}, which the row lacks "
                             f"(it holds {sorted(values)[:12]}); add them to the data or choose another rubric")
        low, high = scale
        base = {**values, "prompt": prompt, "low": low, "high": high}
        inputs = self.inputs.format(**base)
        criteria = self.criteria.format(**base)
        if len(completions) == 1:
            return self.pointwise.format(**base, criteria=criteria, inputs=inputs, completion=completions[0])
        responses = "\n\n".join(f"Response {i + 1}:\n{c}" for i, c in enumerate(completions))
        return self.group.format(**base, criteria=criteria, inputs=inputs, responses=responses)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ForgeError(f"{path}: cannot read the rubric file: {e}") from None
    if not isinstance(data, dict):
        raise ForgeError(f"{path}: a rubric file is a YAML mapping (criteria, inputs[, pointwise, group])")
    return data


def load_rubric(name: str) -> Rubric:
    """A built-in rubric by name, or a rubric file (`criteria:` and `inputs:`, optionally its own
    `pointwise:` / `group:` frames with the same placeholders)."""
    built = _read(BUILT_IN)
    frames, rubrics = built["frames"], built["rubrics"]
    if name in rubrics:
        raw, label = rubrics[name], name
    elif Path(name).suffix in (".yaml", ".yml") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ForgeError(f"judge rubric {name!r}: no such file")
        raw, label = _read(path), path.stem
        if not ({"criteria", "pointwise"} & set(raw)):
            raise ForgeError(f"{path}: a rubric file needs criteria: (and inputs:), or its own pointwise: template")
    else:
        raise ForgeError(f"judge rubric {name!r}: not a built-in rubric ({sorted(rubrics)}) nor a .yaml file")
    bad = [k for k in ("criteria", "inputs", "pointwise", "group") if k in raw and not isinstance(raw[k], str)]
    if bad:
        raise ForgeError(f"judge rubric {name!r}: {bad} must be text")
    rubric = Rubric(label, raw.get("criteria", ""), raw.get("inputs", "{prompt}"), raw.get("pointwise", frames["pointwise"]),
                    raw.get("group", frames["group"]))
    for text in (rubric.criteria, rubric.inputs, rubric.pointwise, rubric.group):
        try:
            list(string.Formatter().parse(text))
        except ValueError as e:
            raise ForgeError(f"judge rubric {name!r}: a bad placeholder ({e}); write a literal brace as {{{{ or }}}}") from None
    return rubric


def _in_scale(value: float, scale: tuple[int, int]) -> bool:
    return scale[0] <= value <= scale[1]


def parse_score(answer: str, scale: tuple[int, int]) -> float | None:
    """The score in one answer: after 'score' if it says so, else its first number within the scale."""
    tagged = re.findall(r"score\s*(?:is|of)?\s*[:=]?\s*\**\s*" + _NUMBER, answer, re.IGNORECASE)
    numbers = [float(x) for x in (tagged or re.findall(r"(?<![\w.])" + _NUMBER + r"(?![\w.])", answer))]
    inside = [x for x in numbers if _in_scale(x, scale)]
    return inside[-1] if tagged and inside else (inside[0] if inside else None)


def parse_group(answer: str, n: int, scale: tuple[int, int]) -> list[float | None]:
    """One score per response: lines "Response N: SCORE", else a JSON list of n numbers."""
    found: dict[int, float] = {}
    for idx, value in re.findall(r"response\s*#?\s*(\d+)\s*[:=\-]\s*\**\s*" + _NUMBER, answer, re.IGNORECASE):
        if 1 <= int(idx) <= n and _in_scale(float(value), scale):
            found.setdefault(int(idx), float(value))
    if len(found) < n:
        for candidate in re.findall(r"\[[^\[\]]*\]", answer):
            try:
                values = json.loads(candidate)
            except ValueError:
                continue
            if isinstance(values, list) and len(values) == n and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and _in_scale(v, scale) for v in values):
                return [float(v) for v in values]
    return [found.get(i + 1) for i in range(n)]


def unreadable(judge: str, completions: list[str], scores: list[float | None], first: int, answer: str,
               scale: tuple[int, int]) -> JudgeError:
    """The error for an answer without a score for some completion (`first`: its index in the batch)."""
    i = next(j for j, s in enumerate(scores) if s is None)
    which = f"completion {first + i}" + (f" (response {i + 1} of its group of {len(completions)})"
                                         if len(completions) > 1 else "")
    return JudgeError(f"judge {judge}: no score from {scale[0]} to {scale[1]} for {which}, "
                      f"{_short(completions[i], 80)}; the judge answered {_short(answer, 300)}")
