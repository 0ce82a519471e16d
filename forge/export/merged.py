"""A LoRA checkpoint merged into its base as a plain Hugging Face folder, in the base's own dtypes:
what the model registry stores for a served checkpoint, since its consumers (mlflow.transformers,
`forge export models:/...`) load whole models. The merge is the export's (forge.export.source:
merge_lora, a tied head the adapter adapts written untied); the export itself writes bf16/fp16 for
a runtime, this folder keeps the base's dtypes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from forge.export.source import Source, adapter_base, source_tensors, untied_head

KEPT = ("generation_config.json",)  # the base's files the merged model keeps beside its config
CARRIED = ("lineage.json",)         # the checkpoint's files it carries


def write_merged(adapter: Path, out: Path) -> Path:
    """`out` (a new folder): model.safetensors (the base's weights with the adapter merged), the
    base's config.json (`tie_word_embeddings: false` where the merge unties the head), the
    checkpoint's tokenizer and lineage.json."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    folder = Path(adapter).resolve()
    src = Source(str(adapter), folder, base=adapter_base(folder))
    base = src.model_folder
    out = Path(out)
    out.mkdir(parents=True)
    config = json.loads((base / "config.json").read_text())
    if untied_head(src):
        config["tie_word_embeddings"] = False
    save_file({name: t.contiguous() for name, t in source_tensors(src)}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = folder if (folder / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out)
    for name, where in [*((n, base) for n in KEPT), *((n, folder) for n in CARRIED)]:
        if (where / name).is_file():
            shutil.copy2(where / name, out / name)
    return out
