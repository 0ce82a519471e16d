"""Bedrock rules as data, the 4.51.3 config translation, and the CreateModelImportJob request
checked against botocore's real service model."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.export import bedrock, compat
from forge.lineage import Lineage

ROLE = "arn:aws:iam::123456789012:role/BedrockImport"


def test_rules_are_data_and_list_the_families():
    archs = bedrock.rules()["architectures"]
    assert {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
            "Qwen3ForCausalLM", "GPTBigCodeForCausalLM", "T5ForConditionalGeneration"} == set(archs)
    assert bedrock.rules()["max_context"] == 128 * 1024


def test_rope_parameters_become_rope_theta_and_scaling():
    v5 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "dtype": "float32", "hidden_size": 8,
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                              "original_max_position_embeddings": 4096},
          "some_v5_only_key": 1}
    out, changes = compat.translate_config(v5, "bf16")
    assert out["rope_theta"] == 1e6
    assert out["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    assert out["torch_dtype"] == "bfloat16" and "dtype" not in out and "rope_parameters" not in out
    assert changes["dropped"] == ["some_v5_only_key"] and "some_v5_only_key" not in out
    assert v5["rope_parameters"]["rope_theta"] == 1e6  # the input is not modified
    default, _ = compat.translate_config({"model_type": "qwen2", "rope_parameters": {"rope_theta": 1e4,
                                                                                     "rope_type": "default"}}, "fp16")
    assert default["rope_theta"] == 1e4 and default["rope_scaling"] is None and default["torch_dtype"] == "float16"


def test_rope_settings_4513_cannot_express_are_refused():
    with pytest.raises(ForgeError, match="mistral in transformers 4.51.3 has no RoPE scaling"):
        compat.translate_config({"model_type": "mistral", "rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                                                              "rope_theta": 1e4}}, "bf16")
    with pytest.raises(ForgeError, match="rope_type 'proportional' is not implemented"):
        compat.translate_config({"model_type": "llama", "rope_parameters": {"rope_type": "proportional"}}, "bf16")
    with pytest.raises(ForgeError, match="per-layer-type"):
        compat.translate_config({"model_type": "llama", "rope_parameters": {
            "full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}}, "bf16")


def test_tokenizer_config_translation():
    v5 = {"backend": "tokenizers", "is_local": True, "tokenizer_class": "TokenizersBackend", "bos_token": "<s>",
          "eos_token": "</s>", "extra_special_tokens": ["<s>", "<tool>"]}
    out, changes = compat.translate_tokenizer_config(v5, "{{ messages }}")
    assert out == {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "additional_special_tokens": ["<tool>"], "chat_template": "{{ messages }}"}
    assert changes["dropped"] == ["backend", "is_local"]


def _tags():
    lineage = {"name": "acme", "created": "2026-01-01T00:00:00+00:00", "base": {"spec": "/models/base (v1)"},
               "stages": [{"name": "cpt", "kind": "pretrain"}], "data": {"crm": {"sha256": "ab" * 32}}}
    return bedrock.lineage_tags(Lineage.model_validate(lineage), {"forge:manifest_sha256": "cd" * 32})


def test_job_request_validates_against_botocore():
    request = bedrock.job_request("acme-import-1", "acme", ROLE, "s3://my-bucket/models/acme/", _tags())
    assert request["modelDataSource"] == {"s3DataSource": {"s3Uri": "s3://my-bucket/models/acme/"}}
    tags = {t["key"]: t["value"] for t in request["jobTags"]}
    assert tags["forge:recipe"] == "acme" and tags["forge:data:crm"] == "ab" * 8
    assert tags["forge:base"] == "/models/base _v1_"  # parentheses are outside Bedrock's tag characters
    assert request["importedModelTags"] == request["jobTags"]
    assert bedrock.request_problems(request) == []
    json.dumps(request)  # what bedrock-import-job.json holds


@pytest.mark.parametrize("change, expected", [
    ({"roleArn": "not-an-arn"}, "roleArn 'not-an-arn' does not match"),
    ({"jobName": "x" * 64}, "jobName"),
    ({"modelDataSource": {"s3DataSource": {"s3Uri": "https://bucket/x"}}}, "s3Uri"),
    ({"jobTags": [{"key": "k", "value": "bad;value"}]}, "jobTags[0].value"),
    ({"unexpectedField": 1}, "Unknown parameter"),
])
def test_botocore_model_catches_bad_requests(change, expected):
    request = {"jobName": "j", "importedModelName": "m", "roleArn": ROLE,
               "modelDataSource": {"s3DataSource": {"s3Uri": "s3://my-bucket/m/"}}, **change}
    problems = bedrock.request_problems(request)
    assert problems and any(expected in p for p in problems), problems
    missing = {k: v for k, v in request.items() if k != "roleArn"}
    assert any("roleArn" in p for p in bedrock.request_problems(missing))


def test_default_names_are_valid():
    name = bedrock.model_name("acme med/v2__final")
    assert name == "acme-med-v2-final" and not bedrock.name_problems(importedModelName=name)
    job = bedrock.job_name("m" * 63)
    assert len(job) <= 63 and not bedrock.name_problems(jobName=job)
