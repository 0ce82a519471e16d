"""Amazon Bedrock Custom Model Import rules: what is checked before an export is written
(architecture, size, context, tokenizer, names) and the `CreateModelImportJob` request, validated
against botocore's own service model for `bedrock`.

The supported lists and limits are data: forge/export/bedrock.yaml.
"""
from __future__ import annotations

import datetime as dt
import re

from forge.errors import ForgeError
from forge.export.compat import rules
from forge.export.formats import Planned
from forge.lineage import Lineage

# A chat template for a model that has none, so Bedrock's Converse API can still format turns.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and bos_token %}{{ bos_token }}{% endif %}"
    "{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
TAG_CHARS = re.compile(r"[^a-zA-Z0-9\s._:/=+@-]")  # Bedrock's tag key/value pattern, negated


def problems(planned: Planned) -> list[str]:
    """Everything that stops this export from importing, each saying what is supported: architecture,
    weight size and context are Bedrock's rules, the tokenizer class the runtime's, the names the API's."""
    r = rules()
    config, out = planned.config, []
    archs = config.get("architectures") or []
    supported = r["architectures"]
    if not archs or archs[0] not in supported:
        listed = "; ".join(f"{a} ({family})" for a, family in supported.items())
        out.append(f"architecture {archs[0] if archs else 'unknown'!s} is not supported by Bedrock Custom Model "
                   f"Import; supported: {listed}")
    if planned.weight_bytes >= r["max_weight_bytes"]:
        out.append(f"weights are {planned.weight_bytes / 1e9:.1f} GB; Bedrock imports under "
                   f"{r['max_weight_bytes'] / 1e9:.0f} GB")
    context = config.get("max_position_embeddings") or config.get("n_positions")
    if context is not None and context > r["max_context"]:
        out.append(f"max_position_embeddings is {context}; Bedrock supports contexts up to {r['max_context']} "
                   f"({r['max_context'] // 1024}K)")
    tokenizer_class = planned.tokenizer.get("tokenizer_class")
    if tokenizer_class is not None and tokenizer_class not in r["tokenizer_classes"]:
        out.append(f"tokenizer class {tokenizer_class} is not one the runtime (transformers "
                   f"{r['runtime_transformers']}) loads for these models; supported: {', '.join(r['tokenizer_classes'])}")
    return out + name_problems(importedModelName=planned.name, jobName=planned.job)


def name_problems(**names: str) -> list[str]:
    """jobName / importedModelName against Bedrock's length and pattern rules."""
    out = []
    for field, value in names.items():
        rule = rules()["name_rules"][field]
        if not 1 <= len(value) <= rule["max"] or not re.fullmatch(rule["pattern"], value):
            out.append(f"{field} {value!r} is invalid: 1-{rule['max']} characters matching {rule['pattern']}"
                       + (" (letters, digits and single '-' or '_' between them)" if field == "importedModelName"
                          else " (starts with a letter or digit; then letters, digits, '-', '+', '.')"))
    return out


def model_name(raw: str) -> str:
    """An importedModelName from a recipe or folder name: 'acme med/v2' -> 'acme-med-v2'."""
    name = re.sub(r"[^0-9a-zA-Z]+", "-", raw).strip("-_")[:63].rstrip("-_")
    return name or "novella"


def job_name(model: str, now: dt.datetime | None = None) -> str:
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{model[:63 - len(stamp) - 1].rstrip('-_')}-{stamp}".replace("_", "-")


def lineage_tags(lineage: Lineage | None, extra: dict[str, str] | None = None) -> list[dict]:
    """Bedrock tags (key <= 128, value <= 256 characters, Bedrock's character set) carrying the lineage."""
    tags: dict[str, str] = {}
    if lineage:
        base = lineage.base.spec
        tags["forge:recipe"] = lineage.name
        tags["forge:base"] = base if isinstance(base, str) else "scratch"
        tags["forge:stages"] = ",".join(f"{s.name}/{s.kind}" for s in lineage.stages)
        tags["forge:created"] = lineage.created
        for name, data in sorted(lineage.data.items()):
            tags[f"forge:data:{name}"] = data.sha256[:16]
    tags.update(extra or {})
    return [{"key": TAG_CHARS.sub("_", k)[:128], "value": TAG_CHARS.sub("_", v)[:256]}
            for k, v in list(tags.items())[:50]]


def import_request(names: dict[str, str], role_arn: str, s3_uri: str, lineage: Lineage | None,
                   extra_tags: dict[str, str]) -> dict:
    """The bedrock format's import-job request (forge.export.formats): its tags carry the lineage."""
    return job_request(names["jobName"], names["importedModelName"], role_arn, s3_uri, lineage_tags(lineage, extra_tags))


def job_request(job: str, model: str, role_arn: str, s3_uri: str, tags: list[dict]) -> dict:
    """The CreateModelImportJob request; raises ForgeError unless botocore's model accepts it."""
    request = {"jobName": job, "importedModelName": model, "roleArn": role_arn,
               "modelDataSource": {"s3DataSource": {"s3Uri": s3_uri}},
               "jobTags": tags, "importedModelTags": tags}
    errors = request_problems(request)
    if errors:
        raise ForgeError("bedrock-import-job.json: " + "; ".join(errors))
    return request


def request_problems(request: dict) -> list[str]:
    """Check a CreateModelImportJob request against botocore's service model for `bedrock`:
    required members, types and lengths (botocore's own validator), and each string's pattern."""
    import botocore.session
    from botocore.validate import ParamValidator

    shape = botocore.session.get_session().get_service_model("bedrock") \
        .operation_model("CreateModelImportJob").input_shape
    report = ParamValidator().validate(request, shape)
    errors = [line.strip() for line in report.generate_report().splitlines() if line.strip()] \
        if report.has_errors() else []
    return errors + _pattern_problems(request, shape, "")


def _pattern_problems(value, shape, path: str) -> list[str]:
    """botocore's validator skips the `pattern` and `max` traits; Bedrock's API enforces them."""
    kind = shape.type_name
    limit = shape.metadata.get("max")
    if limit is not None and isinstance(value, (str, list)) and len(value) > limit:
        return [f"{path} is {len(value)} long; at most {limit} allowed"]
    if kind == "structure" and isinstance(value, dict):
        return [p for k, v in value.items() if k in shape.members
                for p in _pattern_problems(v, shape.members[k], f"{path}.{k}" if path else k)]
    if kind == "list" and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _pattern_problems(v, shape.member, f"{path}[{i}]")]
    pattern = shape.metadata.get("pattern")
    if kind == "string" and isinstance(value, str) and pattern and not re.fullmatch(pattern, value):
        return [f"{path} {value!r} does not match {pattern}"]
    return []
