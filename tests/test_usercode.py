"""The one loader of `file.py:function` / `module:function` (rewards and custom evaluators)."""
from __future__ import annotations

import pytest

from forge.errors import ForgeError
from forge.eval.evaluators import load_custom
from forge.lm.rewards import Reward
from forge.recipe.rft_settings import RewardSource
from forge.usercode import load_function


def test_files_modules_and_errors_naming_field_and_spec(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "score.py").write_text("def f(*a, **k):\n    return 'a'\n")
    (tmp_path / "b" / "score.py").write_text("def f(*a, **k):\n    return 'b'\n")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    # two files with one stem stay two modules
    assert load_function("a/score.py:f", tmp_path)() == "a" and load_function("b/score.py:f", tmp_path)() == "b"
    assert load_function("json:dumps") is __import__("json").dumps
    with pytest.raises(ForgeError, match=r"^reward 'broken.py:f': importing .*broken.py failed: ModuleNotFoundError"):
        load_function("broken.py:f", tmp_path, "reward")
    with pytest.raises(ForgeError, match=r"^reward 'no_such_mod:f': cannot import module 'no_such_mod'"):
        load_function("no_such_mod:f", what="reward")
    with pytest.raises(ForgeError, match=r"^eval.custom 'json:dumps': expected 'file.py:function'$"):
        load_custom("json:dumps")
    # both users go through it: the same file, the same function
    with Reward(RewardSource(source=str(tmp_path / "a" / "score.py") + ":f")) as reward:  # loaded in its worker
        with pytest.raises(ForgeError, match=r"got str$"):  # a/score.py's f answered 'a'
            reward(["p"], ["c"], {}, batch=0)
    assert load_custom("a/score.py:f", tmp_path)() == "a"
