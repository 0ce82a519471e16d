"""Every recipe in recipes/ says in its header comment how long it took, measured on 2 cores: a
`# measured: <N> <s|min|h> ... on 2 ... cores` line (or `2-core`), so nobody learns the cost of a
recipe by running it. The header is the comment block before the first YAML line."""
from __future__ import annotations

import re

import pytest

from forge_testing import REPO

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
MEASURED = re.compile(r"^# measured: (about |~)?\d+(\.\d+)? ?(s|min|h)\b.*\bon (the )?(shared )?2[ -](shared )?"
                      r"(CPU )?core", re.IGNORECASE)


def header(path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def test_the_pattern_reads_the_forms_recipes_use():
    for good in ("# measured: 90 s (1.5 min) on 2 shared cores under load 1.1-2.3",
                 "# measured: 28.5 min (1711 s) on the shared 2-core machine under load 4-6",
                 "# measured: about 6 min on 2 cores (commit 038da5e)"):
        assert MEASURED.match(good), good
    for bad in ("# A few minutes on a 2-core CPU.", "# measured: a minute on 2 cores", "# measured: 6 min",
                "#   measured: 6 min on 2 cores"):
        assert not MEASURED.match(bad), bad


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_header_states_its_measured_time_on_2_cores(path):
    lines = header(path)
    assert lines and lines[0].startswith("# forge run recipes/"), f"{path.name}: the header starts with its command"
    assert any(MEASURED.match(line) for line in lines), (
        f"{path.name}: its header has no '# measured: <N> <s|min|h> on 2 cores ...' line (the time one run took "
        "on 2 cores, with the load average when the machine was shared)")
