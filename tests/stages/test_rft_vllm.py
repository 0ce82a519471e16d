"""RFT with `generation: vllm`: without vllm the recipe is refused naming the field; with it, forge
drives vLLM's offline API (LLM(...).generate(prompts, SamplingParams(...))) and loads the policy's
weights into the engine before every rollout. vllm cannot be installed on a CPU machine, so the
test puts a small stand-in `vllm` package on sys.path: it implements that API surface with a
transformers model, so sampling really comes from the weights forge syncs into it."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from pydantic import ValidationError

from forge.errors import ForgeError
from forge_testing import base_recipe, run_stage, write_recipe
from rft_rewards import RewardRows
from test_rft import REWARDS, prompts, rft

FAKE_VLLM = '''
"""A stand-in for vLLM's offline API (LLM, SamplingParams) backed by a transformers model."""
import torch
from transformers import AutoModelForCausalLM

CALLS = {"init": [], "generate": [], "load_weights": [], "reset_prefix_cache": 0}


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, **kw):
        self.n, self.temperature, self.top_p, self.max_tokens = n, temperature, top_p, max_tokens


class _Model:
    def __init__(self, hf):
        self.hf = hf

    def load_weights(self, weights):
        weights = list(weights)
        CALLS["load_weights"].append({name: w.detach().clone() for name, w in weights})
        params = dict(self.hf.named_parameters())
        with torch.no_grad():
            for name, w in weights:
                params[name].copy_(w)  # a KeyError here: forge sent a name vLLM would not know


class _Completion:
    def __init__(self, token_ids, text):
        self.token_ids, self.text = token_ids, text


class _Output:
    def __init__(self, prompt_token_ids, outputs):
        self.prompt_token_ids, self.outputs = prompt_token_ids, outputs


class _NS:
    pass


class LLM:
    def __init__(self, model, **kw):
        CALLS["init"].append({"model": model, **kw})
        self.hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        runner = _NS()
        runner.model = _Model(self.hf)
        worker = _NS()
        worker.model_runner = runner
        executor = _NS()
        executor.driver_worker = worker
        self.llm_engine = _NS()
        self.llm_engine.model_executor = executor
        self.eos = self.hf.generation_config.eos_token_id or self.hf.config.eos_token_id

    def reset_prefix_cache(self):
        CALLS["reset_prefix_cache"] += 1

    @torch.no_grad()
    def generate(self, prompts, sampling_params, use_tqdm=True):
        CALLS["generate"].append(len(prompts))
        out = []
        for p in prompts:
            ids = torch.tensor([p["prompt_token_ids"]])
            seqs = self.hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                    temperature=sampling_params.temperature, top_p=sampling_params.top_p,
                                    max_new_tokens=sampling_params.max_tokens,
                                    num_return_sequences=sampling_params.n, pad_token_id=self.eos,
                                    eos_token_id=self.eos)
            comps = []
            for row in seqs[:, ids.shape[1]:].tolist():
                if self.eos in row:  # vLLM stops at EOS and returns it; no padding after it
                    row = row[:row.index(self.eos) + 1]
                comps.append(_Completion(row, ""))
            out.append(_Output(p["prompt_token_ids"], comps))
        return out
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    (tmp_path / "fakevllm" / "vllm").mkdir(parents=True)
    (tmp_path / "fakevllm" / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    monkeypatch.syspath_prepend(str(tmp_path / "fakevllm"))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    yield importlib.import_module("vllm")
    sys.modules.pop("vllm", None)


def test_vllm_generation_is_refused_naming_the_field_when_vllm_is_absent(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValidationError) as e:
        rft(generation="vllm")
    (err,) = e.value.errors()
    assert err["loc"] == ("generation",) and "pip install vllm" in err["msg"]
    assert rft().generation == "hf"


def test_recipe_with_vllm_generation_fails_validation_with_the_dotted_path(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    from forge.recipe import load_recipe

    recipe = base_recipe(tmp_path, stages=[{"name": "rl", "kind": "rft", "data": ["general"], "max_steps": 1,
                                            "rewards": [{"source": f"{REWARDS}:e_share"}], "generation": "vllm"}])
    with pytest.raises(ForgeError, match=r"stages\[0\]\.generation|stages\.0\.generation|rl.*generation") as e:
        load_recipe(write_recipe(tmp_path / "r.yaml", recipe))
    assert "pip install vllm" in str(e.value)


def test_grpo_with_vllm_generation_syncs_the_policy_each_rollout(tmp_path, tiny_checkpoint, fake_vllm):
    from safetensors.torch import load_file

    t = RewardRows()
    stage = rft(generation="vllm", max_steps=12, updates_per_rollout=2, kl_beta=0.01)
    result = run_stage(stage, tiny_checkpoint, prompts(tmp_path), tmp_path / "o", tracker=t)
    calls = fake_vllm.CALLS
    assert len(calls["init"]) == 1 and calls["init"][0]["model"] == str(tiny_checkpoint)
    rollouts = 12 // 2
    assert len(calls["load_weights"]) == rollouts and calls["reset_prefix_cache"] == rollouts
    assert calls["generate"] == [stage.batch_size] * rollouts  # one request per rollout: the batch's prompts
    base = load_file(str(tiny_checkpoint / "model.safetensors"))
    first, last = calls["load_weights"][0], calls["load_weights"][-1]
    assert set(first) >= {k for k in base if k != "lm_head.weight" or k in first}  # every weight, HF names
    assert all(torch.equal(first[k], base[k]) for k in base if k in first)  # rollout 1 samples the input model
    assert any(not torch.equal(last[k], base[k]) for k in base if k in last)  # later ones the trained policy
    # the rewards are those of what the engine sampled, and training on them raises the reward
    first_r = sum(r["reward_mean"] for r in t.rows[:3]) / 3
    last_r = sum(r["reward_mean"] for r in t.rows[-3:]) / 3
    print(f"vllm-path mean reward: first 3 steps {first_r:.3f} -> last 3 steps {last_r:.3f}")
    assert last_r > first_r + 0.05
    assert result.lineage["generation"] == "vllm"


def test_vllm_generator_refuses_an_engine_it_cannot_sync(tmp_path, tiny_checkpoint, fake_vllm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.lm.generation import VllmGenerator

    gen = VllmGenerator(rft(generation="vllm"), tiny_checkpoint, AutoTokenizer.from_pretrained(tiny_checkpoint), 0)
    del gen.llm.llm_engine.model_executor
    with pytest.raises(ForgeError, match="generation: hf"):
        gen.sync(AutoModelForCausalLM.from_pretrained(tiny_checkpoint))


def test_lora_policy_reaches_the_engine_merged_under_plain_names(tiny_checkpoint):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from forge.lm.generation import _plain_named_parameters

    plain = dict(AutoModelForCausalLM.from_pretrained(tiny_checkpoint).named_parameters())
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_checkpoint),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    sent = {k: v.detach().clone() for k, v in _plain_named_parameters(model)}
    merged = dict(model.merge_and_unload().named_parameters())
    assert set(sent) == set(plain)
    assert all(torch.allclose(sent[k], merged[k], atol=1e-6) for k in sent)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"], plain["model.layers.0.self_attn.q_proj.weight"])
