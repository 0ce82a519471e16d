"""The docs a newcomer reads: a README short enough to read in five minutes, links that lead
somewhere, and a recipe reference (docs/RECIPE.md) that matches the schema it is generated from."""
from __future__ import annotations

import re

import pytest

from forge.recipe.reference import COMMAND, reference
from forge_testing import REPO

README_MAX_LINES = 200
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_the_recipe_reference_matches_the_schema():
    written = (REPO / "docs" / "RECIPE.md").read_text()
    assert written == reference(), f"docs/RECIPE.md is out of date with forge/recipe/; regenerate it: {COMMAND}"


def test_the_readme_is_at_most_200_lines():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail "
                                       "into a page under docs/ and link it")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_points_to_a_file_that_exists(page):
    text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)  # code holds no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the page itself
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to files that do not exist: {broken}"
