"""What each stage kind asks of the hardware, reduced to one shape the planner understands.

A Workload is a training loop (sequences of seq_len, global_batch per step, `steps` steps) plus
extra work: forward passes of frozen models (DPO reference, RL reference/reward), a one-off
pre-pass (cached DPO reference log-probs), and per-step generation (RL rollouts). A Builder makes
one from a recipe stage's typed settings or from `forge plan --stage` arguments; the kinds table
(forge/kinds.py) names each kind's builder (LM, SFT, DPO, RFT below).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from forge.errors import ForgeError
from forge.kinds import KINDS

# Other names `forge plan --stage` accepts for a kind of the table.
KIND_ALIASES = {"mid-train": "midtrain", "cpt": "pretrain", "continued-pretraining": "pretrain",
                "grpo": "rft", "rl": "rft"}


@dataclass(frozen=True)
class Generation:
    """RL rollouts per step: prompts x group completions of gen_len tokens after prompt_len."""

    prompts: int
    group: int
    prompt_len: int
    gen_len: int

    @property
    def sequences(self) -> int:
        return self.prompts * self.group


@dataclass(frozen=True)
class Examples:
    """How SFT examples fill the sequences: packed into full blocks, or each padded to seq_len, with
    a mean length of mean_len tokens (None: seq_len/2 assumed)."""

    packed: bool = True
    mean_len: float | None = None


@dataclass(frozen=True)
class Pairs:
    """DPO preference data: `count` pairs, seen `epochs` times."""

    count: float
    epochs: int = 1


@dataclass(frozen=True)
class Workload:
    kind: str
    name: str
    seq_len: int
    global_batch: int             # sequences per optimizer step
    steps: int
    tokens_trained: float         # tokens the stage is about (loss tokens for pretraining)
    tokens_processed: float       # tokens through the trained model, padding included
    precision: str = "bf16"
    frozen_forwards: float = 0.0  # forward passes of frozen models per trained sequence
    frozen_copies: int = 0        # frozen models resident in memory while training
    pre_pass_sequences: float = 0.0  # sequences run forward once before training (cached ref)
    generation: Generation | None = None
    notes: tuple[str, ...] = ()


def planned_kinds() -> list[str]:
    """The kinds of the table that train, so the planner can model them."""
    return [name for name, row in KINDS.items() if row.workload is not None]


def normalize_kind(kind: str) -> str:
    k = KIND_ALIASES.get(kind.lower(), kind.lower())
    if k not in planned_kinds():
        raise ForgeError(f"unknown stage kind {kind!r}; the planner knows {', '.join(planned_kinds())}")
    return k


def _steps(tokens: float | None, steps: int | None, tokens_per_step: float, what: str) -> int:
    if steps:
        return int(steps)
    if tokens:
        return max(1, math.ceil(tokens / tokens_per_step))
    raise ForgeError(f"{what}: give max_tokens or max_steps so the planner knows how long it runs")


def pretrain(name: str, seq_len: int, global_batch: int, tokens: float | None = None,
             steps: int | None = None, precision: str = "bf16", kind: str = "pretrain") -> Workload:
    """Pretraining / continued pretraining / mid-training: every token is trained (packed)."""
    n = _steps(tokens, steps, global_batch * seq_len, f"stage {name!r}")
    processed = n * global_batch * seq_len
    return Workload(kind, name, seq_len, global_batch, n, tokens or processed, processed, precision)


def sft(name: str, seq_len: int, global_batch: int, tokens: float | None = None, steps: int | None = None,
        precision: str = "bf16", examples: Examples = Examples()) -> Workload:
    """SFT. `tokens` are real (unpadded) tokens; unpacked examples are padded to seq_len, so the
    model processes tokens * seq_len / examples.mean_len of them."""
    notes: tuple[str, ...] = ()
    if tokens and not examples.packed:
        mean = examples.mean_len or seq_len / 2
        if not examples.mean_len:
            notes = (f"unpacked SFT: assumed mean example length {mean:.0f} (seq_len/2); padding included",)
        processed = tokens * seq_len / min(mean, seq_len)
        n = _steps(processed, steps, global_batch * seq_len, f"stage {name!r}")
    else:
        n = _steps(tokens, steps, global_batch * seq_len, f"stage {name!r}")
        processed = n * global_batch * seq_len
        tokens = tokens or processed
    return Workload("sft", name, seq_len, global_batch, n, tokens, n * global_batch * seq_len, precision, notes=notes)


def dpo(name: str, seq_len: int, pairs_per_step: int, pairs: Pairs | None = None, steps: int | None = None,
        precision: str = "bf16", cached_reference: bool = True) -> Workload:
    """DPO (Rafailov et al. 2023): the policy runs forward+backward on chosen and rejected; the
    frozen reference runs forward on both, every step, or once up front when its log-probs are
    cached (then it need not stay in memory). Without `pairs`, `steps` says how long it runs."""
    count, epochs = (pairs.count, pairs.epochs) if pairs is not None else (None, 1)
    batch = 2 * pairs_per_step
    total_pairs = count * epochs if count else None
    n = _steps(total_pairs, steps, pairs_per_step, f"stage {name!r}")
    processed = n * batch * seq_len
    unique_seqs = 2 * (count if count else n * pairs_per_step / max(epochs, 1))
    return Workload(
        "dpo", name, seq_len, batch, n, processed, processed, precision,
        frozen_forwards=0.0 if cached_reference else 1.0, frozen_copies=0 if cached_reference else 1,
        pre_pass_sequences=unique_seqs if cached_reference else 0.0,
    )


def rft(name: str, gen: Generation, steps: int, precision: str = "bf16", reward_model: bool = False) -> Workload:
    """GRPO-style RL fine-tuning (Shao et al. 2024): each step generates `gen.group` completions per
    prompt, scores them with the frozen reference (for the KL term) and the reward (a reward model
    costs one more forward; reward functions cost nothing here), then updates the policy once on
    the prompt+completion sequences."""
    seq = gen.prompt_len + gen.gen_len
    frozen = 1 + (1 if reward_model else 0)
    return Workload(
        "rft", name, seq, gen.sequences, steps, steps * gen.sequences * gen.gen_len,
        steps * gen.sequences * seq, precision, frozen_forwards=float(frozen), frozen_copies=frozen,
        generation=gen,
        notes=("rollouts run on the same chips as training, with training states offloaded meanwhile; "
               "decode modelled as HBM-bandwidth bound",),
    )


# ------------------------------------------------------------------------ builders per kind
@dataclass(frozen=True)
class Builder:
    """How the planner turns a kind into a Workload: `from_stage(stage, dp_world, precision)` from a
    recipe stage's typed settings (global batch = batch_size * grad_accum * dp_world), and
    `from_args(kind, args, batch, precision)` from `forge plan --stage KIND` arguments."""

    from_stage: Callable[[Any, int, str | None], Workload]
    from_args: Callable[[str, Any, int, str], Workload]


def _batch(stage, dp_world: int) -> int:
    return stage.batch_size * stage.grad_accum * max(1, dp_world)


def _lm_stage(stage, dp_world: int, precision: str | None) -> Workload:
    return pretrain(stage.name, stage.seq_len, _batch(stage, dp_world), stage.max_tokens, stage.max_steps,
                    precision or stage.precision, kind=stage.kind)


def _lm_args(kind: str, args, batch: int, precision: str) -> Workload:
    return pretrain(kind, args.seq_len, batch, args.tokens, args.steps, precision, kind=kind)


def _sft_stage(stage, dp_world: int, precision: str | None) -> Workload:
    return sft(stage.name, stage.seq_len, _batch(stage, dp_world), stage.max_tokens, stage.max_steps,
               precision or stage.precision, Examples(packed=stage.packing == "best_fit"))


def _sft_args(kind: str, args, batch: int, precision: str) -> Workload:
    return sft(kind, args.seq_len, batch, args.tokens, args.steps, precision,
               Examples(packed=not args.unpacked, mean_len=args.mean_example_len))


def _dpo_stage(stage, dp_world: int, precision: str | None) -> Workload:
    return dpo(stage.name, stage.seq_len, _batch(stage, dp_world), steps=stage.total_steps(max(1, dp_world)),
               precision=precision or stage.precision, cached_reference=stage.reference == "cached")


def _dpo_args(kind: str, args, batch: int, precision: str) -> Workload:
    pairs = Pairs(args.tokens / (2 * args.seq_len)) if args.tokens else None
    return dpo(kind, args.seq_len, batch, pairs, args.steps, precision, cached_reference=not args.no_cached_reference)


def _rft_stage(stage, dp_world: int, precision: str | None) -> Workload:
    gen = Generation(_batch(stage, dp_world), stage.group, stage.seq_len, stage.max_new_tokens)
    return rft(stage.name, gen, stage.total_steps(max(1, dp_world)), precision or stage.precision)


def _rft_args(kind: str, args, batch: int, precision: str) -> Workload:
    seq = args.seq_len
    prompt = args.prompt_len or seq // 4
    steps = args.steps or (int(args.tokens // (batch * args.group * (seq - prompt))) if args.tokens else None)
    if not steps:
        raise ForgeError(f"{kind} planning needs --steps (or --tokens of generated text)")
    return rft(kind, Generation(batch, args.group, prompt, seq - prompt), max(1, steps), precision, args.reward_model)


LM = Builder(_lm_stage, _lm_args)     # causal-LM over packed blocks, every token trained (pretrain, midtrain)
SFT = Builder(_sft_stage, _sft_args)  # packed blocks, or batches padded per batch
DPO = Builder(_dpo_stage, _dpo_args)  # chosen and rejected through the policy; the reference cached or live
RFT = Builder(_rft_stage, _rft_args)  # GRPO: `group` completions per prompt each step, then an update
