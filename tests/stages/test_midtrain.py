"""Mid-training: optimizer carry-over, context extension, checkpoint souping."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from forge.errors import ForgeError
from forge.recipe import MidtrainStage, PretrainStage, SoupStage
from forge.stages.result import StageInputs
from forge.train.checkpoint import load_optimizer_state
from forge.train.session import open_session
from forge_testing import pretrain_stage, run_stage


def _midtrain(**kw) -> MidtrainStage:
    stage = pretrain_stage(name="mid", **kw)
    stage["kind"] = "midtrain"
    stage.pop("schedule")  # midtrain's own default: anneal to 0
    return MidtrainStage(**stage)


def test_carry_over_starts_from_the_input_moments(tmp_path, tiny_checkpoint, generated_sources):
    first = run_stage(PretrainStage(**pretrain_stage(max_steps=3)), tiny_checkpoint, generated_sources, tmp_path / "a")
    saved = load_optimizer_state(first.checkpoint)
    assert saved is not None and saved["state"]
    stage = _midtrain(max_steps=2, optim={"lr": 1e-3, "carry_over": True})
    assert stage.schedule.kind == "anneal"
    s = open_session(stage, StageInputs(first.checkpoint, {}, tmp_path / "b", None))
    state = s.optimizer.state_dict()
    for key, moments in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state["state"][key][name], moments[name])
    assert all(g["lr"] == 1e-3 for g in s.optimizer.param_groups)  # this stage's hyper-parameters


def test_carry_over_from_a_base_without_optimizer_state_is_refused(tmp_path, tiny_checkpoint):
    with pytest.raises(ForgeError, match="has no optimizer state"):
        open_session(_midtrain(optim={"carry_over": True}), StageInputs(tiny_checkpoint, {}, tmp_path, None))


def test_soup_is_the_elementwise_mean(tmp_path, tiny_checkpoint, generated_sources):
    a = run_stage(PretrainStage(**pretrain_stage("a", max_steps=2)), tiny_checkpoint, generated_sources, tmp_path / "a")
    b = run_stage(PretrainStage(**pretrain_stage("b", max_steps=2, seed=7, mixture={"domain": 1.0})),
                  tiny_checkpoint, generated_sources, tmp_path / "b")
    soup = SoupStage(kind="soup", name="soup", ingredients=["a", "b"])
    result = run_stage(soup, a.checkpoint, generated_sources, tmp_path / "soup",
                       outputs={"a": a.checkpoint, "b": b.checkpoint})
    wa, wb, ws = (load_file(p / "model.safetensors") for p in (a.checkpoint, b.checkpoint, result.checkpoint))
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
    for k in wa:
        assert torch.equal(ws[k], ((wa[k].double() + wb[k].double()) / 2).float()), k
    weighted = SoupStage(kind="soup", name="w", ingredients=[str(a.checkpoint), str(b.checkpoint)], weights=[3, 1])
    ww = load_file(run_stage(weighted, a.checkpoint, {}, tmp_path / "w").checkpoint / "model.safetensors")
    k = next(iter(wa))
    assert torch.allclose(ww[k], 0.75 * wa[k] + 0.25 * wb[k], atol=1e-6)


def test_soup_of_different_architectures_is_refused(tmp_path, tiny_checkpoint):
    other = tmp_path / "other"
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    config.update(hidden_size=64, intermediate_size=128)
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",)})).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(other)
    soup = SoupStage(kind="soup", name="s", ingredients=[str(tiny_checkpoint), str(other)])
    with pytest.raises(ForgeError, match=r"architectures differ in hidden_size \(32 vs 64\)"):
        run_stage(soup, tiny_checkpoint, {}, tmp_path / "s")


@pytest.mark.slow
def test_context_extension_128_to_512(tmp_path, tiny_checkpoint):
    """Pretrain at 128, extend to 512 by raising RoPE's base frequency (ABF, as Llama 3 and Code
    Llama's long-context stages do): the new config loads with plain transformers, 512-token loss
    beats the 128-token model's plain position extrapolation, and 128-token loss stays within 10%.
    Measured: short model 0.615 @128 / 0.934 @512; extended 0.561 @128 / 0.534 @512."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.mixing import eval_blocks
    from forge.inputs import resolve_source
    from forge.lm.perplexity import heldout_loss
    from forge.recipe import DataSource, GeneratedText

    src = {"general": resolve_source("general", DataSource(generate=GeneratedText(kind="stories", documents=4000),
                                                           holdout=0.1), tmp_path)}
    short = run_stage(PretrainStage(**pretrain_stage(max_steps=120, seq_len=128, batch_size=8, optim={"lr": 1e-2},
                                                     schedule={"kind": "cosine", "warmup_steps": 10})),
                      tiny_checkpoint, src, tmp_path / "short")
    stage = _midtrain(max_steps=40, seq_len=512, batch_size=2, optim={"lr": 3e-3},
                      context={"rope_theta": 40000.0})
    long = run_stage(stage, short.checkpoint, src, tmp_path / "long")
    config = json.loads((long.checkpoint / "config.json").read_text())
    assert config["max_position_embeddings"] == 512
    assert config["rope_parameters"]["rope_theta"] == 40000.0

    tok = AutoTokenizer.from_pretrained(short.checkpoint)
    losses = {}
    for name, ckpt in (("short", short.checkpoint), ("long", long.checkpoint)):
        model = AutoModelForCausalLM.from_pretrained(ckpt)  # plain transformers, no forge code
        for seq in (128, 512):
            blocks = eval_blocks(src, {"general": 1.0}, tok, seq, "eos", 16)
            losses[name, seq] = heldout_loss(model, blocks, 4, "cpu")
    print("context extension losses:", {f"{k[0]}@{k[1]}": round(v, 4) for k, v in losses.items()})
    assert losses["long", 512] < losses["short", 512]
    assert losses["long", 128] <= 1.10 * losses["short", 128]


def test_rope_scaling_is_written_in_the_installed_transformers_form(tmp_path, tiny_checkpoint, generated_sources):
    from transformers import AutoConfig

    stage = _midtrain(max_steps=1, seq_len=256, batch_size=1,
                      context={"rope_scaling": {"type": "yarn", "factor": 2.0}})
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path)
    config = AutoConfig.from_pretrained(result.checkpoint)
    assert config.max_position_embeddings == 256
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 2.0
    assert config.rope_parameters["original_max_position_embeddings"] == 128
    assert result.lineage["context"]["max_position"] == 256
