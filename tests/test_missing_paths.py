"""A recipe path that does not exist is said not to exist (not to be a bad checkpoint), naming the
field and its line; one under a `shared/data` folder says whether that folder itself is missing and
points to the README's setup section ("Two commands")."""
from __future__ import annotations

import pytest

from forge import cli
from forge.errors import ForgeError
from forge.recipe import load_recipe
from forge_testing import write_recipe

STAGE = {"name": "cpt", "kind": "pretrain", "mixture": {"general": 1.0}, "max_steps": 2, "seq_len": 32,
         "batch_size": 2, "optim": {"lr": 1e-3}}


def _recipe(tmp_path, base: str, data: str):
    (tmp_path / "checkout" / "recipes").mkdir(parents=True)
    recipe = {"name": "m", "base": base, "data": {"general": {"path": data}}, "stages": [STAGE],
              "output": str(tmp_path / "out")}
    return write_recipe(tmp_path / "checkout" / "recipes" / "r.yaml", recipe)


def _error(path) -> list[str]:
    with pytest.raises(ForgeError) as e:
        load_recipe(path)
    return str(e.value).splitlines()


def test_a_missing_shared_data_folder_is_named_with_the_readme_setup(tmp_path, capsys):
    path = _recipe(tmp_path, "../../shared/data/models/stories260K", "../../shared/data/general/tinyshakespeare.txt")
    base, data = _error(path)
    shared = tmp_path / "shared" / "data"
    assert base == (f"{path}:line 2: base: '{shared}/models/stories260K' does not exist: the shared/data folder "
                    f"{shared} is missing (the real model and data some recipes use, kept beside the checkout as "
                    "../shared/data; README.md, section \"Two commands\", says how to set it up)")
    assert data.startswith(f"{path}:line 5: data.general.path: '{shared}/general/tinyshakespeare.txt' does not exist: "
                           f"the shared/data folder {shared} is missing")
    assert "not a Hugging Face checkpoint folder" not in base
    assert cli.main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"forge: error: {base}")


def test_a_missing_file_inside_shared_data_and_a_missing_path_elsewhere(tmp_path):
    (tmp_path / "shared" / "data" / "models").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "models" / "empty").mkdir()  # there, but not a checkpoint
    path = _recipe(tmp_path, "../../shared/data/models/stories260K", str(tmp_path / "nowhere" / "*.txt"))
    base, data = _error(path)
    shared = tmp_path / "shared" / "data"
    assert base.endswith(f"base: '{shared}/models/stories260K' does not exist in {shared} (its README.md lists what "
                         "that folder holds; README.md, \"Two commands\")")
    assert data.endswith(f"data.general.path: '{tmp_path}/nowhere/*.txt' matches no file or folder")

    path.write_text(path.read_text().replace("shared/data/models/stories260K", "shared/data/models/empty"))
    assert _error(path)[0].endswith(f"base: '{shared}/models/empty' is not a Hugging Face checkpoint folder "
                                    "(expected a directory holding config.json)")
    path.write_text(path.read_text().replace("../../shared/data/models/empty", str(tmp_path / "gone")))
    assert _error(path)[0] == f"{path}:line 2: base: '{tmp_path}/gone' does not exist"


# ------------------------------------------------------------------------ issue 34: symlink loops
from forge_testing import base_recipe, refusal  # noqa: E402


def _loop(folder):
    """a -> b -> a: every use of either is ELOOP ("Too many levels of symbolic links")."""
    (folder / "a").symlink_to(folder / "b")
    (folder / "b").symlink_to(folder / "a")
    return folder / "a"


def _one_line(capsys, loop) -> str:
    err = refusal(capsys.readouterr().err)  # after the command's first line, if it has one
    assert str(loop) in err and "symbolic link loop" in err and "unexpected" not in err, err
    return err


@pytest.mark.parametrize("field", ["data", "relative data", "relative output"])
def test_a_symlink_loop_in_a_recipe_is_one_line_naming_it(tmp_path, capsys, field):
    loop = _loop(tmp_path)
    recipe = base_recipe(tmp_path)
    if field == "data":
        recipe["data"]["general"] = {"path": str(loop)}
    elif field == "relative data":
        recipe["data"]["general"] = {"path": "a/texts"}
    else:
        recipe["output"] = "a/out"
    path = write_recipe(tmp_path / "r.yaml", recipe)
    assert cli.main(["validate", str(path)]) == 2
    _one_line(capsys, loop)


def test_a_symlink_loop_as_the_recipe_or_an_eval_path_is_one_line(tmp_path, capsys):
    loop = _loop(tmp_path)
    assert cli.main(["validate", str(loop)]) == 2
    _one_line(capsys, loop)
    suite = write_recipe(tmp_path / "s.yaml", {"data": {"g": {"generate": {"kind": "stories", "documents": 5}}}})
    for flags in (["--suite", str(loop), "--models", str(tmp_path)], ["--suite", str(suite), "--models", str(loop)],
                  ["--suite", str(suite), "--models", str(tmp_path), "--json", str(loop / "e.json")]):
        assert cli.main(["eval", *flags]) == 2
        _one_line(capsys, loop)
