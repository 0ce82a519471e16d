"""`forge export --verify`: reload the export with transformers and check it is the source model.

First the config's declared size against the files (a config that claims more is not loaded), then
the same token ids from both tokenizers, logits within the export dtype's precision of the source's
(fp32) on a few prompts, the chat template renders, and greedy generation produces text.
"""
from __future__ import annotations

from pathlib import Path

import torch

from forge.errors import ForgeError
from forge.export.shapes import declared_parameters
from forge.export.source import Source, source_tensors, tensor_specs, untied_head
from forge.scrub import first_line

PROMPTS = ["Once upon a time", "The Zephyr-3 valve is rated for", "Question: what does the model know?\nAnswer:"]
# relative logit error allowed: a few units of the format's rounding (bf16 keeps 8 significant
# bits, fp16 11), which two layers of rounded weights stay well inside
TOLERANCE = {"bf16": 2 ** -4, "fp16": 2 ** -7}


def verify(src: Source, export_dir: Path, dtype: str, prompts: list[str] | None = None,
           max_new_tokens: int = 16, log=print) -> dict:
    """Compare the export with the source; raise ForgeError if it differs, else return the figures."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    prompts = prompts or PROMPTS
    _fits_the_files(src, export_dir)
    seq2seq = bool(getattr(AutoConfig.from_pretrained(export_dir), "is_encoder_decoder", False))
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    reference = _reference_model(src, auto)
    exported = auto.from_pretrained(export_dir, dtype=torch.float32).eval()
    tok_src = AutoTokenizer.from_pretrained(src.folder if (src.folder / "tokenizer_config.json").is_file()
                                            else src.model_folder)
    tok_out = AutoTokenizer.from_pretrained(export_dir)
    worst, agree, total = 0.0, 0, 0
    for prompt in prompts:
        ids = tok_src(prompt, return_tensors="pt").input_ids
        if tok_out(prompt, return_tensors="pt").input_ids.tolist() != ids.tolist():
            raise ForgeError(f"verify: the exported tokenizer encodes {prompt!r} differently from the source's")
        with torch.no_grad():
            kw = {"decoder_input_ids": ids} if seq2seq else {}
            a, b = reference(input_ids=ids, **kw).logits, exported(input_ids=ids, **kw).logits
        rel = ((a - b).norm() / a.norm().clamp_min(1e-12)).item()
        worst = max(worst, rel)
        agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
        total += a.shape[0] * a.shape[1]
    if worst > TOLERANCE[dtype]:
        raise ForgeError(f"verify: exported logits differ from the source by {worst:.3g} (relative), more than "
                         f"{dtype} precision allows ({TOLERANCE[dtype]:.3g})")
    rendered = tok_out.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                           add_generation_prompt=True) if tok_out.chat_template else None
    ids = tok_out(prompts[0], return_tensors="pt").input_ids
    with torch.no_grad():
        gen = exported.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=tok_out.pad_token_id or tok_out.eos_token_id or 0)
    new = gen[0, ids.shape[1]:] if not seq2seq else gen[0]
    if new.numel() == 0:
        raise ForgeError("verify: the exported model generated no tokens")
    text = tok_out.decode(new, skip_special_tokens=True)
    result = {"prompts": len(prompts), "max_relative_logit_error": worst, "tolerance": TOLERANCE[dtype],
              "top1_agreement": agree / total, "chat_template_renders": rendered is not None,
              "generated": {"prompt": prompts[0], "text": text, "tokens": int(new.numel())}}
    log(f"verify: logits within {dtype} precision (max relative error {worst:.2e}, top-1 agreement "
        f"{agree / total:.0%}); generated: {prompts[0]!r} -> {text!r}")
    return result


def _fits_the_files(src: Source, export_dir: Path) -> None:
    """Refuse to load a model whose config declares more parameters than the files hold (counted on
    the meta device: no memory), so a wrong config cannot make loading allocate what is not there."""
    try:
        declared = declared_parameters(export_dir)
    except Exception as e:  # transformers' own validation of the config
        raise ForgeError(f"verify: {src.model_folder / 'config.json'} does not load in transformers: "
                         f"{type(e).__name__}: {first_line(e, 200)}") from None
    held = sum(torch.Size(shape).numel() for _, shape in tensor_specs(export_dir).values())
    if declared > held:
        raise ForgeError(f"verify: {src.model_folder / 'config.json'} declares {declared:,} parameters but the "
                         f"safetensors files hold {held:,}: refusing to load it")


def _reference_model(src: Source, auto):
    """The source in fp32: the checkpoint itself, or the base with the LoRA adapter merged."""
    untie = {"tie_word_embeddings": False} if untied_head(src) else {}  # else the head would load into the embedding
    model = auto.from_pretrained(src.model_folder, dtype=torch.float32, **untie).eval()
    if src.base is not None:
        merged = {n: t.float() for n, t in source_tensors(src)}
        missing, unexpected = model.load_state_dict(merged, strict=False)
        if unexpected:
            raise ForgeError(f"verify: merged weights the model does not have: {', '.join(unexpected[:5])}")
    return model
