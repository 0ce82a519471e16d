"""Model-written augmentation end to end (forge.inputs -> forge.lm.rewrite -> forge.data.rewrite):
a forge-tiny post-trained-like checkpoint as the generator through `forge run` (the plumbing, the
grounding check, the counts and the generator in the lineage and MLflow; quality is not the point),
an OpenAI-compatible endpoint on 127.0.0.1 answering canned grounded and ungrounded outputs (the
ungrounded dropped, hygiene redacting what is kept), and the errors naming the recipe field."""
from __future__ import annotations

import json

import pytest

from catalog_testing import write_tiny_foundation
from forge.cli import main
from forge.data.chat_render import DEFAULT_CHAT_TEMPLATE
from forge.data.mixing import in_holdout
from forge.data.rewrite import found_in
from forge.errors import ForgeError
from forge.inputs import prepare_inputs
from forge.recipe import load_recipe
from forge_testing import pretrain_stage, write_recipe
from servers import free_port, json_server

GENERATOR = "catalog://forge-tiny@post-trained"


def _docs(tmp_path, n=24):
    path = tmp_path / "manual.jsonl"
    path.write_text("".join(json.dumps({"text": f"The Zorblax X{i} kettle holds {i + 10} cups. It is made in Tallinn by "
                                                "Nordvik."}) + "\n" for i in range(n)))
    return path


def _recipe(tmp_path, rewrite, stages=None):
    data = {"manual": {"path": str(_docs(tmp_path)), "proprietary": True, "holdout": 0.15,
                       "augment": {"rewrite": rewrite}}}
    return write_recipe(tmp_path / "r.yaml", {
        "name": "rewrite", "base": str(tmp_path / "base"), "data": data,
        "stages": stages or [pretrain_stage(mixture={"manual": 1.0}, max_steps=2)], "output": str(tmp_path / "out")})


@pytest.fixture
def post_trained(tiny_checkpoint, tmp_path, monkeypatch):
    """forge-tiny built in a temporary home, its post-trained phase with a chat template (as SFT
    saves it); the recipe's base is a copy of the same tiny checkpoint."""
    import shutil

    home = tmp_path / "forge-home"
    monkeypatch.setenv("FORGE_HOME", str(home))
    root = write_tiny_foundation(home, tiny_checkpoint)
    config = root / "post-trained" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": DEFAULT_CHAT_TEMPLATE}))
    shutil.copytree(tiny_checkpoint, tmp_path / "base")
    return root / "post-trained"


def _kept_answers_are_grounded(path, documents):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        if row["text"].startswith("Question:"):
            assert found_in(row["text"].split("\nAnswer: ", 1)[1], documents[row["document"]]), row
    return rows


@pytest.mark.slow
def test_forge_tiny_post_trained_writes_grounded_augmentation_recorded_in_the_lineage(post_trained, tmp_path,
                                                                                     monkeypatch):
    import forge.lm.rewrite as rw

    answers: list[list[str]] = []
    real = rw.generate_ids
    monkeypatch.setattr(rw, "generate_ids", lambda *a: answers.append(real(*a)) or answers[-1])
    rewrite = {"model": GENERATOR, "paraphrases": 1, "questions": 2, "max_new_tokens": 16, "seed": 5}
    assert main(["run", str(_recipe(tmp_path, rewrite))]) == 0
    first, answers[:] = [a for batch in answers for a in batch], []
    lineage = json.loads((tmp_path / "out" / "novella" / "lineage.json").read_text())
    record = lineage["data"]["manual"]["augment"]
    assert record["generator"] == GENERATOR and record["identity"].startswith(f"local:{GENERATOR}:")
    held = sum(in_holdout("manual", n, 0.15) for n in range(1, 25))
    assert record["documents"] == 24 - held
    assert record["paraphrases_kept"] + record["paraphrases_dropped"] == record["documents"]
    assert record["qa_kept"] + record["qa_dropped"] == 2 * record["documents"]
    documents = {n: json.loads(line)["text"] for n, line in enumerate(_docs(tmp_path).read_text().splitlines(), 1)}
    rows = _kept_answers_are_grounded(tmp_path / "out" / "data" / record["file"].rsplit("/", 1)[1], documents)
    assert len(rows) == record["paraphrases_kept"] + record["qa_kept"] - record["removed_by_hygiene"]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run = mlflow.search_runs(experiment_names=["rewrite"], filter_string="tags.`forge.pipeline` = 'novella'",
                             output_format="list")[0]
    assert run.data.params["data.manual.rewrite.generator"] == GENERATOR
    assert run.data.params["data.manual.rewrite.qa_dropped"] == str(record["qa_dropped"])
    # one answer per paraphrase and per QA ask (a random tiny model writes mostly blanks)
    assert len(first) == 2 * record["documents"]
    prepare_inputs(load_recipe(tmp_path / "r.yaml"), tmp_path / "out2")  # no cache there: asked again
    assert [a for batch in answers for a in batch] == first  # greedy: the same answers
    # a second preparation reads the cached file: the generator is not loaded again
    from unittest import mock

    with mock.patch("forge.lm.rewrite.LocalWriter", side_effect=AssertionError("generator loaded again")):
        again = prepare_inputs(load_recipe(tmp_path / "r.yaml"), tmp_path / "out")
    assert again.augmented["manual"]["qa_kept"] == record["qa_kept"]


def _canned(body, path):
    """Paraphrases: grounded for even cup counts, an invented number for odd ones, and an e-mail
    address (hygiene redacts it); QA: a grounded pair and one whose answer is not in the passage."""
    prompt = body["messages"][-1]["content"]
    passage = prompt.split("Passage:\n", 1)[1].split("\n\n", 1)[0]
    cups = int(passage.split(" holds ")[1].split(" ")[0])
    if "Rewrite the passage" in prompt:
        reply = (f"Nordvik makes this kettle in Tallinn; it holds {cups} cups. Write to sales@nordvik-example.com."
                 if cups % 2 == 0 else f"Nordvik makes this kettle in Tallinn; it holds {cups + 1} cups.")
    else:
        reply = f"Question: How many cups does it hold?\nAnswer: {cups} cups.\nQuestion: Who sells it?\nAnswer: Acme Ltd"
    return {"id": "x", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]}


def test_an_endpoint_generator_has_its_ungrounded_outputs_dropped_and_its_output_cleaned(tiny_checkpoint, tmp_path):
    import shutil

    shutil.copytree(tiny_checkpoint, tmp_path / "base")
    with json_server(_canned) as url:
        rewrite = {"model": f"{url}/v1", "served_model": "canned", "paraphrases": 2, "questions": 2}
        inputs = prepare_inputs(load_recipe(_recipe(tmp_path, rewrite)), tmp_path / "out")
    record = inputs.augmented["manual"]
    docs = record["documents"]
    even = sum(1 for n in range(1, 25) if not in_holdout("manual", n, 0.15) and (n - 1 + 10) % 2 == 0)
    assert record["identity"] == f"openai:{url}/v1:canned"
    assert (record["paraphrases_kept"], record["paraphrases_dropped"]) == (2 * even, 2 * (docs - even))
    assert (record["qa_kept"], record["qa_dropped"]) == (docs, docs)  # "Acme Ltd" is not in any passage
    documents = {n: json.loads(line)["text"] for n, line in enumerate(_docs(tmp_path).read_text().splitlines(), 1)}
    rows = _kept_answers_are_grounded(tmp_path / "out" / "data" / record["file"].rsplit("/", 1)[1], documents)
    assert rows and not any("Acme" in r["text"] or "sales@" in r["text"] for r in rows)
    assert any("Write to <" in r["text"] for r in rows)  # the address redacted by the recipe's hygiene
    # the paraphrases repeat per document (greedy endpoint): exact duplicates are removed by hygiene
    assert record["removed_by_hygiene"] == even
    trained = [json.loads(line)["text"] for line in inputs.sources["manual"].files[0].read_text().splitlines()]
    assert sum(t.startswith("Question:") for t in trained) == docs  # added to the training documents


def test_an_unreachable_endpoint_or_unknown_model_names_the_field(tiny_checkpoint, tmp_path):
    import shutil

    shutil.copytree(tiny_checkpoint, tmp_path / "base")
    rewrite = {"model": f"http://127.0.0.1:{free_port()}/v1", "served_model": "m", "timeout_s": 2}
    with pytest.raises(ForgeError, match=r"data\.manual\.augment\.rewrite\.model: the generator failed: .*request failed"):
        prepare_inputs(load_recipe(_recipe(tmp_path, rewrite)), tmp_path / "out")
    with pytest.raises(ForgeError, match=r"data\.manual\.augment\.rewrite\.model.*generator 'catalog://nope@x'"):
        load_recipe(_recipe(tmp_path, {"model": "catalog://nope@x"}))
