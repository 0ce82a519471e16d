"""What the post-training stages (SFT, DPO, RFT) share: reading a source's chat records with the
held-out split, LoRA wrapping and saving (merged, or a PEFT adapter beside its base), and the
table of sample generations logged every `samples.every` steps."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch

from forge.data.formats import ChatEncoder, FormatSpec
from forge.data.mixing import in_holdout
from forge.errors import ForgeError
from forge.train.checkpoint import save_checkpoint


def chat_spec(source, where: str, loss_on: str | None = None) -> FormatSpec:
    """The FormatSpec of a chat source (its `chat:` block), with the stage's loss choice."""
    spec = getattr(source, "chat", None)
    if spec is None:
        raise ForgeError(f"{where}: data source {source.name!r} holds plain text; give it a chat: mapping "
                         "(kind: messages | instruction | prompt_completion | preference | hh)")
    return replace(spec, loss_on=loss_on) if loss_on else spec


def split_rows(source, held_out: bool) -> Iterator[tuple[int, str, object]]:
    """The source's rows in the training split (or the held-out one): the same stable, hash-based
    split the pretraining stages use, so no stage evaluates on what another trained on."""
    for number, where, row in source.rows():
        if in_holdout(source.name, number, source.holdout) == held_out:
            yield number, where, row


# ------------------------------------------------------------------------------------- LoRA
def lora_wrap(lora, where: str):
    """A function model -> PeftModel with the recipe's adapters (only they train)."""

    def wrap(model):
        from peft import LoraConfig, get_peft_model

        have = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = sorted(set(lora.target_modules) - have)
        if missing:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
            raise ForgeError(f"{where}: lora.target_modules {missing} are not modules of "
                             f"{type(model).__name__}; its linear layers: {linear}")
        cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                         target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)

    return wrap


def save_final(session, path: Path, state: dict, training: dict | None, lora, base: Path, template: str | None) -> Path:
    """The stage's final checkpoint, with the chat template in the tokenizer: the full model (LoRA
    merged into it), or with `lora.merge: false` the PEFT adapter (adapter_config.json names the
    base checkpoint) beside the tokenizer."""
    acc, tokenizer = session.accelerator, session.tokenizer
    if template is not None:
        tokenizer.chat_template = template
    if lora is None or not lora.merge:
        if lora is not None:
            acc.unwrap_model(session.model).peft_config["default"].base_model_name_or_path = str(Path(base).resolve())
            training = None  # adapter optimizer moments do not carry over to a full model
        return session.save(path, state, training)
    acc.wait_for_everyone()
    if acc.is_main_process:
        merged = acc.unwrap_model(session.model).merge_and_unload()
        save_checkpoint(merged, tokenizer, path, state=state)
    acc.wait_for_everyone()
    return path


# ---------------------------------------------------------------------------------- samples
@torch.no_grad()
def generate(model, tokenizer, encoder: ChatEncoder, prompts: list[list[dict]], max_new_tokens: int, device,
             sample: bool = False, num_return_sequences: int = 1) -> list[str]:
    """Completions of chat prompts (greedy unless `sample`), decoded without special tokens; with
    num_return_sequences the completions of one prompt are consecutive."""
    was_training = model.training
    model.eval()
    texts = [encoder.render(p, add_generation_prompt=True) for p in prompts]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)  # left padding
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    out = model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=sample,
                         num_return_sequences=num_return_sequences, pad_token_id=pad,
                         eos_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    return tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)


def log_samples(tracker, step: int, prompts: list[list[dict]], completions: list[str],
                extra: dict[str, list] | None = None) -> None:
    """One MLflow table (samples/step-N.json): prompt, completion and any extra columns (rewards)."""
    table = {"step": [step] * len(completions),
             "prompt": [p[-1]["content"] for p in prompts],
             "completion": list(completions), **(extra or {})}
    tracker.log_table(table, f"samples/step-{step:07d}.json")
