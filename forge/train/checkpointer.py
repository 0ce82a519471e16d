"""The one checkpoint interface: every save and load of weights, optimizer and training state
(resume points, stage outputs, LoRA merges, merge-back and souping) goes through a `Checkpointer`.

`FullCheckpointer` is the data-parallel implementation: every process holds the whole model,
process 0 writes Hugging Face folders (forge.train.checkpoint: atomic, hashed) and the others wait.
The sharded one (torch.distributed.checkpoint, FSDP2) is forge.train.sharded.ShardedCheckpointer,
with the same methods; the parallelism strategy picks one (forge.train.parallel).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, cast

import torch
from torch.optim.optimizer import StateDict

from forge.errors import ForgeError
from forge.train import attention, checkpoint as files
from forge.train.checkpoint import HfModel
from forge.train.settings import LoraSettings

if TYPE_CHECKING:  # the libraries load with a checkpoint, not with the module
    from peft import PeftModel
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

Configure = Callable[["PretrainedConfig"], "PretrainedConfig"]  # changes a model's config before its weights load


class Process(Protocol):
    """This process's place in the launch: an accelerate Accelerator or PartialState."""

    @property
    def is_main_process(self) -> bool: ...

    def wait_for_everyone(self) -> None: ...


class Checkpointer(Protocol):
    def bind(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None: ...
    def weights(self, resume_from: Path | None, start: Path) -> Path: ...
    def load_model(self, path: Path,
                   configure: Configure | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]: ...
    def latest(self, folder: Path, run_id: str | None) -> Path | None: ...
    def load_state(self, path: Path) -> StateDict: ...
    def load_optimizer(self, path: Path) -> StateDict | None: ...
    def clear(self, folder: Path) -> None: ...
    def save(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
             training: StateDict | None = None) -> Path: ...
    def save_resumable(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                       keep_last: int | None) -> Path: ...
    def save_final(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                   final: FinalSave) -> Path: ...
    def merge_back(self, trained: Path, start: Path, weight: float, out: Path) -> Path: ...
    def average(self, folders: list[Path], weights: list[float], out: Path, extra: dict[str, str]) -> Path: ...


class FinalSave:
    """How a stage's output is written: with its optimizer state or not, and for a LoRA stage merged
    into the base (default) or as a PEFT adapter beside it (`lora.merge: false`)."""

    def __init__(self, training: StateDict | None, lora: LoraSettings | None = None, base: Path | None = None):
        self.training, self.lora, self.base = training, lora, base


class FullCheckpointer:
    """Whole-model checkpoints written by process 0 (data parallelism: every rank has the same weights)."""

    def __init__(self, process: Process):
        self.process = process

    def _on_main(self, write: Callable[[], object]) -> None:
        self.process.wait_for_everyone()
        if self.process.is_main_process:
            write()
        self.process.wait_for_everyone()

    def load_model(self, path: Path,
                   configure: Configure | None = None) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
        """(model, tokenizer) in fp32 from a Hugging Face folder; `configure(config)` may change the
        config first (context extension), the weights then load into the changed model."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            config = AutoConfig.from_pretrained(path)
            if configure is not None:
                config = configure(config)
            model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32, use_safetensors=True)
        except (OSError, ValueError) as e:
            raise ForgeError(f"cannot load checkpoint {path}: {e}") from None
        attention.use_packed_attention(model)  # packed SFT rows: one causal row per example
        return model, tokenizer

    def bind(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to keep: resume points are written from what each save is given."""

    def weights(self, resume_from: Path | None, start: Path) -> Path:
        """Where the session's model loads from: the resume point (a whole Hugging Face folder), else the input."""
        return Path(resume_from or start)

    def latest(self, folder: Path, run_id: str | None) -> Path | None:
        path = files.latest_checkpoint(folder, run_id)
        if path is not None and (path / "dcp").is_dir():
            raise ForgeError(f"{path}: a sharded resume point (parallelism.strategy fsdp); resume it with "
                             "parallelism.strategy=fsdp, or start the stage over (forge run --restart)")
        return path

    def load_state(self, path: Path) -> StateDict:
        return files.load_state(path)

    def load_optimizer(self, path: Path) -> StateDict | None:
        return files.load_optimizer_state(path)

    def clear(self, folder: Path) -> None:
        """Remove resume points an earlier run left (they must never be taken for this run's)."""
        import shutil

        self._on_main(lambda: shutil.rmtree(folder, ignore_errors=True))

    def save(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
             training: StateDict | None = None) -> Path:
        self._on_main(lambda: files.save_checkpoint(model, tokenizer, path, state=state, training=training))
        return Path(path)

    def save_resumable(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                       keep_last: int | None) -> Path:
        """A resume point (`state` holds the JSON part and the tensors under "training"), then the
        oldest ones beyond `keep_last` are pruned (only once the new one is whole)."""
        json_part = {k: v for k, v in state.items() if k != "training"}

        def write() -> None:
            files.save_checkpoint(model, tokenizer, path, state=json_part, training=state["training"])
            if keep_last:
                files.prune_checkpoints(Path(path).parent, keep_last)

        self._on_main(write)
        return Path(path)

    def save_final(self, model: HfModel, tokenizer: PreTrainedTokenizerBase, path: Path, state: StateDict,
                   final: FinalSave) -> Path:
        lora = final.lora
        if lora is None:
            return self.save(model, tokenizer, path, state, final.training)
        peft_model = cast("PeftModel", model)  # a stage with a lora: block trains a PeftModel (forge.train.lora)
        if not lora.merge:  # the adapter alone: its optimizer moments do not carry over to a full model
            peft_model.peft_config["default"].base_model_name_or_path = str(Path(final.base or "").resolve())
            return self.save(model, tokenizer, path, state)
        self._on_main(lambda: files.save_checkpoint(peft_model.merge_and_unload(), tokenizer, path, state=state))
        return Path(path)

    def merge_back(self, trained: Path, start: Path, weight: float, out: Path) -> Path:
        from forge.train.merge import merge_back

        self._on_main(lambda: merge_back(trained, start, weight, out))
        return Path(out)

    def average(self, folders: list[Path], weights: list[float], out: Path, extra: dict[str, str]) -> Path:
        from forge.train.merge import save_averaged

        self._on_main(lambda: save_averaged(folders, weights, out, extra=extra))
        return Path(out)
