"""Reinforcement fine-tuning with GRPO (Shao et al. 2024, DeepSeekMath §4.1).

Each rollout: `batch_size` prompts from the data (read as rows: `prompt_field` is the user turn,
the other columns go to the reward functions), `group` completions per prompt sampled with
Hugging Face `generate` or, with `generation: vllm`, vLLM's offline engine (forge.stages.generation),
scored by the recipe's reward sources (forge.stages.rewards; weighted
sum). Advantages are the rewards normalised within each prompt's group. The objective is the
clipped policy ratio against the rollout's log-probs, averaged over completion tokens, plus
`kl_beta` times the k3 KL estimate toward the input checkpoint (Schulman 2020). The policy takes
`updates_per_rollout` optimizer steps per rollout.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from forge.data.formats import ChatEncoder, FormatSpec
from forge.errors import ForgeError
from forge.recipe.settings import RftStage
from forge.stages.chat import log_samples, lora_wrap, mean_over_ranks, save_final, split_rows
from forge.stages.generation import completion_batch, make_generator
from forge.stages.result import StageInputs, StageResult
from forge.stages.rewards import Reward, unique_labels
from forge.train.checkpoint import split_state
from forge.train.meter import Meter
from forge.train.progress import progress
from forge.train.session import load_model, open_session
from forge.train.state import TrainState
from forge.train.step import DivergenceGuard, train_step
from forge.train.stop import GracefulStop, after_step


class PromptStream:
    """Prompt rows, epoch after epoch in file order; its position is part of the resume state."""

    def __init__(self, rows: list[dict]):
        self.rows, self.pos = rows, 0

    def take(self, n: int) -> list[dict]:
        out = [self.rows[(self.pos + i) % len(self.rows)] for i in range(n)]
        self.pos += n
        return out

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def token_logps(model, ids: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """Log-probs of tokens ids[:, start:] given what precedes them (left-padded rows)."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    logits = logits[:, start - 1:-1].float()
    return torch.gather(F.log_softmax(logits, -1), 2, ids[:, start:].unsqueeze(-1)).squeeze(-1)


def advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + 1e-4), rewards ordered prompt by prompt."""
    g = rewards.view(-1, group)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)


def run(stage: RftStage, inputs: StageInputs) -> StageResult:
    where = f"stage {stage.name}"
    rewards = [Reward(r) for r in stage.rewards]  # fails before any model loads on a bad source
    labels = dict(zip((r.source for r in rewards), unique_labels(rewards)))  # metric names, as eval.reward's
    wrap = lora_wrap(stage.lora, where) if stage.lora else None
    s = open_session(stage, inputs.checkpoint, inputs.out_dir, inputs.resume, wrap=wrap)
    tracker, tok = inputs.tracker, s.tokenizer
    if s.rank:  # each rank samples its own completions (rank 0 keeps the recipe's seed)
        torch.manual_seed(stage.seed + s.rank)
    rows = [row for name in stage.data for _, at, row in split_rows(inputs.sources[name], held_out=False)
            if _check_row(row, stage.prompt_field, at)]
    if not rows:
        raise ForgeError(f"{where}: no prompts in {stage.data}")
    encoder = ChatEncoder(tok, FormatSpec("prompt_completion"))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ref = None
    if stage.kl_beta:
        ref, _ = load_model(inputs.checkpoint)
        ref.to(s.device).eval().requires_grad_(False)
    data = PromptStream(rows)
    generator = make_generator(stage, inputs.checkpoint, tok, pad, s.device, stage.seed + s.rank)
    guard = DivergenceGuard(stage.guard, where)
    state = TrainState(s.optimizer, s.scheduler, data, guard)
    if s.restore(state):
        guard.last_good_checkpoint = s.resume_from
    rollout: list[dict] = []
    stats: list[dict] = []

    @torch.no_grad()
    def make_rollout(step: int) -> list[dict]:
        model = s.accelerator.unwrap_model(s.model)
        model.eval()
        generator.sync(model)
        out, table = [], {"prompts": [], "completions": [], "reward": []}
        for _ in range(stage.grad_accum):
            # every rank takes the whole step's prompts and keeps its share, as the other stages do
            batch = data.take(stage.batch_size * s.world)[s.rank * stage.batch_size:(s.rank + 1) * stage.batch_size]
            messages = [[{"role": "user", "content": r[stage.prompt_field]}] for r in batch]
            ids = [tok(encoder.render(m, add_generation_prompt=True), add_special_tokens=False)["input_ids"] for m in messages]
            completions = generator.generate(model, ids)
            seqs, mask, cmask, width = completion_batch(ids, completions, stage.group, pad, s.device)
            texts = tok.batch_decode(completions, skip_special_tokens=True)
            prompts = [m[-1]["content"] for m in messages for _ in range(stage.group)]
            fields = {k: [r.get(k) for r in batch for _ in range(stage.group)]
                      for k in batch[0] if k != stage.prompt_field}
            scores = {rw.source: rw(prompts, texts, fields, step) for rw in rewards}
            total = torch.tensor([sum(rw.weight * scores[rw.source][i] for rw in rewards) for i in range(len(texts))])
            old = token_logps(model, seqs, mask, width)
            kl_ref = token_logps(ref, seqs, mask, width) if ref is not None else None
            out.append({"ids": seqs, "mask": mask, "start": width, "cmask": cmask.float(), "old": old, "ref": kl_ref,
                        "adv": advantages(total, stage.group).to(s.device), "scores": scores, "total": total,
                        "targets": torch.tensor(int(cmask.sum()))})
            table["prompts"] += prompts
            table["completions"] += texts
            table["reward"] += total.tolist()
        model.train()
        return out, table

    def loss_fn(model, b):
        logp = token_logps(model, b["ids"], b["mask"], int(b["start"]))
        ratio = torch.exp(logp - b["old"])
        adv = b["adv"].unsqueeze(1)
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - stage.clip_eps, 1 + stage.clip_eps) * adv)
        per_token = -surrogate
        m = b["cmask"]
        row = {"clip_fraction": (((ratio - 1).abs() > stage.clip_eps).float() * m).sum().item() / max(1.0, m.sum().item())}
        if b.get("ref") is not None:
            d = b["ref"] - logp
            kl = torch.exp(d) - d - 1
            per_token = per_token + stage.kl_beta * kl
            row["kl"] = (kl.detach() * m).sum().item() / max(1.0, m.sum().item())
        stats.append(row)
        return (per_token * m).sum() / m.sum().clamp(min=1)

    meter, loss = Meter(1), float("nan")
    bar = progress(s.total_steps, stage.name, enabled=s.accelerator.is_main_process)
    bar.update(state.step)
    first_reward = None
    with GracefulStop() as stop:
        for step in range(state.step + 1, s.total_steps + 1):
            if (step - 1) % stage.updates_per_rollout == 0 or not rollout:
                with meter.paused():
                    rollout, table = make_rollout(step)
                reward_row = _reward_metrics(rollout, labels, s.accelerator)
                first_reward = reward_row["reward_mean"] if first_reward is None else first_reward
                if stage.samples.every and step % stage.samples.every == 0:
                    n = stage.samples.prompts * stage.group
                    log_samples(tracker, step, [[{"content": p}] for p in table["prompts"][:n]],
                                table["completions"][:n], {"reward": table["reward"][:n]})
            stats.clear()
            batches = [{k: v for k, v in b.items() if k not in ("scores", "total") and v is not None
                        and not isinstance(v, int)} | {"start": torch.tensor(b["start"])} for b in rollout]
            out = train_step(s, batches, loss_fn, guard, step)
            tokens = sum(int(b["targets"]) for b in rollout)
            if s.world > 1:
                tokens = int(s.accelerator.reduce(torch.tensor(tokens, device=s.device), "sum").item())
            state.step, state.tokens, loss = step, state.tokens + tokens, out.loss
            meter.step(tokens)
            row = {"loss": out.loss, "lr": out.lr, **reward_row,
                   "completion_length": tokens / (s.world * sum(len(b["total"]) for b in rollout)),
                   **mean_over_ranks(s.accelerator, {k: sum(x[k] for x in stats) / len(stats) for k in stats[0]})}
            if step % stage.log_every == 0 or step == s.total_steps:
                tracker.log_metrics(row, step=step)
                bar.set_postfix(loss=f"{out.loss:.3f}", reward=f"{row['reward_mean']:.3f}")
            after_step(s, stage, state, guard, stop, meter, step)  # rft's samples come with its rollouts
            bar.update(1)
    bar.close()

    metrics = {**state.metrics, **row, "loss": loss, "tokens": state.tokens, "reward_mean_start": first_reward}
    metrics.update(meter.totals())
    metrics["peak_mem_bytes"] = s.memory.peak_bytes()
    lineage = {"rewards": [r.model_dump() for r in stage.rewards], "reference": str(inputs.checkpoint),
               "generation": stage.generation,
               **({"lora": stage.lora.model_dump()} if stage.lora else {})}
    result = StageResult(inputs.out_dir / "final", metrics, s.total_steps, {n: state.tokens for n in stage.data[:1]},
                         lineage)
    as_json, tensors = split_state(state.state_dict())
    save_final(s, result.checkpoint, {**as_json, "result": result.as_dict()},
               tensors if stage.checkpoint.final_optimizer else None, stage.lora, inputs.checkpoint, encoder.template)
    return result


def _check_row(row, field: str, where: str) -> bool:
    if isinstance(row, Exception):
        raise ForgeError(str(row))
    if not isinstance(row, dict) or not isinstance(row.get(field), str):
        raise ForgeError(f"{where}: a prompt row needs a text field {field!r} (prompt_field)")
    return True


def _reward_metrics(rollout: list[dict], labels: dict[str, str], accelerator) -> dict[str, float]:
    """Mean and std of the weighted reward and of each source's, over every rank's completions."""
    def gathered(values) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=torch.float64)
        return accelerator.gather(t.to(accelerator.device)).cpu() if accelerator.num_processes > 1 else t

    total = gathered(torch.cat([b["total"] for b in rollout]))
    row = {"reward_mean": total.mean().item(), "reward_std": total.std().item() if len(total) > 1 else 0.0}
    for source in rollout[0]["scores"]:
        vals = gathered(list(itertools.chain.from_iterable(b["scores"][source] for b in rollout)))
        key = labels[source]
        row[f"reward.{key}.mean"] = vals.mean().item()
        row[f"reward.{key}.std"] = vals.std().item() if len(vals) > 1 else 0.0
    return row
