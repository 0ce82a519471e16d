"""The SDK's protobuf messages: the forward_backward request it sends (Content-Type
application/x-protobuf), and the ForwardBackwardOutput and SampleResponse it accepts in return (it
accepts no JSON for those types). The schema is the subset of the SDK's `tinker_public.proto` that forge serves, with the
SDK's field numbers, built in code into a private descriptor pool: no generated module, and no
clash with the SDK's own classes when both live in one process (the tests). Fields left out
(provenance spans, image details) are kept by protobuf as unknown fields and ignored.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "tinker_public"
DTYPES = ("DTYPE_UNSPECIFIED", "DTYPE_FLOAT32", "DTYPE_INT64", "DTYPE_INT32", "DTYPE_BFLOAT16")
FLOAT32, INT64, INT32 = 1, 2, 3
STOP_REASONS = ("STOP_REASON_STOP", "STOP_REASON_LENGTH")  # a sequence ended at a stop sequence, or at max_tokens
ENUMS = {"DType": DTYPES, "StopReason": STOP_REASONS}

# message -> (field, number, type); a type is a scalar, a message name, "repeated T" or "map T"
# (map keys are strings)
SCHEMA: dict[str, list[tuple[str, int, str]]] = {
    "SparseCsr": [("values", 1, "bytes"), ("crow_indices", 2, "bytes"), ("col_indices", 3, "bytes")],
    "Tensor": [("dense", 1, "bytes"), ("sparse_csr", 2, "SparseCsr"), ("dtype", 3, "DType"),
               ("shape", 4, "repeated int64")],
    "EncodedTextChunk": [("tokens", 1, "bytes")],
    "Opaque": [],  # an image or audio chunk: refused, read only to say which it was
    "Chunk": [("encoded_text", 1, "EncodedTextChunk"), ("image", 2, "Opaque"), ("dmel", 3, "Opaque")],
    "Datum": [("model_input", 1, "repeated Chunk"), ("loss_fn_inputs", 2, "map Tensor")],
    "LossConfigValue": [("number", 1, "double"), ("text", 2, "string")],
    "ForwardBackwardRequest": [("model_id", 1, "string"), ("seq_id", 2, "int32"), ("data", 3, "repeated Datum"),
                               ("loss_fn", 4, "string"), ("loss_fn_config", 5, "map double"),
                               ("forward_only", 6, "bool"), ("loss_fn_config_v2", 7, "map LossConfigValue")],
    "BatchedTensor": [("data", 1, "bytes"), ("offsets", 2, "bytes"), ("dtype", 3, "DType"),
                      ("trailing_shape", 4, "repeated int64")],
    "ArrayRecord": [("type_tag", 1, "string"), ("fields", 2, "map BatchedTensor"), ("num_datums", 3, "int64")],
    "ForwardBackwardOutput": [("loss_fn_output_type", 1, "string"), ("loss_fn_outputs", 2, "repeated ArrayRecord"),
                              ("metrics", 3, "map double")],
    # the SDK's fields are proto3-optional: the same numbers and wire types, read alike when present
    "SampledSequence": [("stop_reason", 1, "StopReason"), ("tokens", 2, "bytes"), ("logprobs", 3, "bytes")],
    "SampleResponse": [("sequences", 1, "repeated SampledSequence"), ("prompt_logprobs", 2, "bytes"),
                       ("prompt_cache_hit_tokens", 4, "int32")],
}

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"bytes": _F.TYPE_BYTES, "string": _F.TYPE_STRING, "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64,
            "bool": _F.TYPE_BOOL, "double": _F.TYPE_DOUBLE}


def _field(msg: Any, name: str, number: int, kind: str, repeated: bool) -> None:
    f = msg.field.add(name=name, number=number, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if kind in _SCALARS:
        f.type = _SCALARS[kind]
    elif kind in ENUMS:
        f.type, f.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{kind}"
    else:
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="forge_serve_tinker_public.proto", package=PACKAGE, syntax="proto3")
    for enum_name, values in ENUMS.items():
        enum = fd.enum_type.add(name=enum_name)
        for number, name in enumerate(values):
            enum.value.add(name=name, number=number)
    for name, fields in SCHEMA.items():
        msg = fd.message_type.add(name=name)
        for field, number, kind in fields:
            if kind.startswith("map "):
                entry = msg.nested_type.add(name=f"{''.join(p.title() for p in field.split('_'))}Entry")
                entry.options.map_entry = True
                _field(entry, "key", 1, "string", repeated=False)
                _field(entry, "value", 2, kind.split()[1], repeated=False)
                f = msg.field.add(name=field, number=number, label=_F.LABEL_REPEATED, type=_F.TYPE_MESSAGE)
                f.type_name = f".{PACKAGE}.{name}.{entry.name}"
            else:
                _field(msg, field, number, kind.removeprefix("repeated "), kind.startswith("repeated "))
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
MESSAGES: dict[str, Any] = {name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
                            for name in SCHEMA}


def parse_request(body: bytes) -> Any:
    """A ForwardBackwardRequest message (raises google.protobuf.message.DecodeError on bad bytes)."""
    msg = MESSAGES["ForwardBackwardRequest"]()
    msg.ParseFromString(body)
    return msg


def encode_output(per_datum: dict[str, list[np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ForwardBackwardOutput of one ArrayRecord: each field's per-datum float32 vectors laid end
    to end with their byte offsets, as the SDK's response_conv reads them back into TensorData."""
    out = MESSAGES["ForwardBackwardOutput"](loss_fn_output_type="ArrayRecord")
    record = out.loss_fn_outputs.add(type_tag="ArrayRecord")
    for name, arrays in per_datum.items():
        parts = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays]
        record.num_datums = len(parts)
        offsets = np.cumsum([0] + [p.nbytes for p in parts], dtype=np.int64)
        bt = record.fields[name]
        bt.data = b"".join(p.tobytes() for p in parts)
        bt.offsets = offsets.tobytes()
        bt.dtype = FLOAT32
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    data: bytes = out.SerializeToString()
    return data


def encode_sample(sequences: list[tuple[bool, list[int], list[float]]], prompt_logprobs: list[float] | None) -> bytes:
    """A SampleResponse: each sequence as (stopped at a stop sequence, its tokens, their log-probs),
    as int32 and float32 bytes; the prompt's log-probs (NaN where none) when asked for."""
    out = MESSAGES["SampleResponse"]()
    for stopped, tokens, logprobs in sequences:
        seq = out.sequences.add()
        seq.stop_reason = 0 if stopped else 1
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    data: bytes = out.SerializeToString()
    return data
