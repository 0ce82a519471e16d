"""Test helpers for the catalog: a built forge-tiny home as pipelines/foundation.py leaves it."""
from __future__ import annotations

import json
import shutil


def write_tiny_foundation(home, checkpoint, holdout=0.1, texts=200):
    """A built forge-tiny home as pipelines/foundation.py leaves it: foundation.json, phase folders
    (copies of a tiny checkpoint) and curated sets."""
    root = home / "foundations" / "forge-tiny"
    (root / "curated").mkdir(parents=True)
    phases = {"pretrained": ["general"], "ramped-down": ["general", "highquality"],
              "mid-trained": ["general", "highquality"], "post-trained": ["general", "highquality", "instructions"]}
    points = {"pretrained": "pretrained", "ramped-down": "pretrained", "mid-trained": "mid-trained",
              "post-trained": "post-trained"}
    for p in phases:
        shutil.copytree(checkpoint, root / p)
    words = "river stone lamp garden window copper market".split()
    with open(root / "curated" / "general.jsonl", "w") as f:
        for i in range(texts):
            f.write(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(30))}) + "\n")
    shutil.copy(root / "curated" / "general.jsonl", root / "curated" / "highquality.jsonl")
    with open(root / "curated" / "instructions.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"say {words[i % 7]}"},
                                             {"role": "assistant", "content": words[i % 7]}]}) + "\n")
    curated = {"general": {"purpose": "pretraining", "path": "curated/general.jsonl", "holdout": holdout,
                           "format": "jsonl", "text_field": "text", "chat": None},
               "highquality": {"purpose": "pretraining", "path": "curated/highquality.jsonl", "holdout": holdout,
                               "format": "jsonl", "text_field": "text", "chat": None},
               "instructions": {"purpose": "sft", "path": "curated/instructions.jsonl", "holdout": holdout,
                                "format": "jsonl", "text_field": None, "chat": {"kind": "messages"}}}
    manifest = {"family": "forge-tiny", "recipe": "recipes/foundation-tiny.yaml", "built": "2025-01-01T00:00:00Z",
                "phases": {p: {"path": p, "point": points[p], "curated": c} for p, c in phases.items()},
                "curated": curated}
    (root / "foundation.json").write_text(json.dumps(manifest))
    return root


def write_header_only_checkpoint(folder, header_length=None, weights=True):
    """A checkpoint folder `forge catalog add` accepts, made without torch: a Llama config.json, one
    tiny safetensors file (`header_length` overrides the 8-byte length its header declares) and a
    tokenizer file. `weights=False` leaves model.safetensors out (for a test to put a FIFO there)."""
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "max_position_embeddings": 128}))
    (folder / "tokenizer.json").write_text("{}")
    if weights:
        header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
        size = len(header) if header_length is None else header_length
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", size) + header + bytes(8))
    return folder
