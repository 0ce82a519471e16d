"""Mixture weights that add to neither 1 nor 100 are accepted (the mixture trains on their shares)
with a warning at validate time that shows those shares; a Nova mixture still must add to 100."""
from __future__ import annotations

import pytest

from forge import cli
from forge.recipe import load_recipe
from forge.recipe.settings import mixture_warnings
from forge_testing import base_recipe, pretrain_stage, write_recipe


def _recipe(tmp_path, mixture):
    stages = [pretrain_stage("general"), pretrain_stage("domain", mixture=mixture)]
    return write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, stages=stages))


def test_shares_off_one_are_warned_with_the_normalized_shares(tmp_path, capsys):
    path = _recipe(tmp_path, {"domain": 0.7, "general": 0.5})
    assert mixture_warnings(load_recipe(path).stages) == [
        "stages[1].mixture: weights add to 1.2, not 1 (or 100 as percentages); they are used as shares: "
        "domain 58.3%, general 41.7%"]
    assert cli.main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "forge: warning: stages[1].mixture: weights add to 1.2" in err and "domain 58.3%, general 41.7%" in err


@pytest.mark.parametrize("mixture", [{"domain": 0.7, "general": 0.3}, {"domain": 70, "general": 30},
                                     {"customer": {"domain": 70}, "curated": {"general": 30}}],
                         ids=["ones", "percent", "nova"])
def test_whole_mixtures_are_quiet(tmp_path, capsys, mixture):
    path = _recipe(tmp_path, mixture)
    assert mixture_warnings(load_recipe(path).stages) == []
    assert cli.main(["validate", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_nova_percentages_still_must_add_to_100(tmp_path, capsys):
    path = _recipe(tmp_path, {"customer": {"domain": 70}, "curated": {"general": 50}})
    assert cli.main(["validate", str(path)]) == 2
    assert "stages[1].mixture: customer and curated percentages must add to 100, they add to 120" in capsys.readouterr().err
