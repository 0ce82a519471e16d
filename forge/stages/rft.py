"""Reinforcement fine-tuning with GRPO (Shao et al. 2024, DeepSeekMath §4.1).

Each rollout: `batch_size` prompts from the data (read as rows: `prompt_field` is the user turn,
the other columns go to the reward functions; or OpenAI-RFT records, `chat: {kind: openai_rft}`,
whose messages are the prompt and whose id, reference_answer and other fields go to the rewards),
`group` completions per prompt sampled with Hugging Face `generate` or, with `generation: vllm`,
vLLM's offline engine (forge.lm.generation), scored by the recipe's reward sources
(forge.lm.rewards; weighted sum; a Nova-protocol source's metrics_list values are logged as
reward.<source>.<type>.<name>). Advantages are the rewards normalised within each prompt's group
(with `reward_norm: per_reward`, each reward on its own first: GDPO).
The objective is the clipped policy ratio against the rollout's log-probs, averaged over completion
tokens, plus `kl_beta` times the k3 KL estimate toward the input checkpoint (Schulman 2020). The policy takes
`updates_per_rollout` optimizer steps per rollout. Its own part of the loop (forge.train.loop.fit):
the rollouts (made before a step, untimed), the GRPO loss, and the reward figures.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from forge.data.formats import ChatEncoder, FormatSpec, prompt_messages
from forge.errors import ForgeError
from forge.lm.agent import Agent, trajectory_batch
from forge.lm.generation import completion_batch, make_generator
from forge.lm.rewards import Reward, unique_labels
from forge.recipe.rft_settings import RftStage
from forge.stages.async_rollout import Ahead
from forge.stages.post_data import epoch_generator, split_rows
from forge.stages.result import StageInputs, StageResult
from forge.stages.samples import log_samples
from forge.track.protocol import StageTracker
from forge.train.loop import fit
from forge.train.losses import Loss
from forge.train.session import Session, open_session
from forge.train.state import TrainState
from forge.train.step import Record, StepResult
from forge.train.task import Outcome, Task

Prompt = tuple[list[dict[str, Any]], dict[str, Any]]  # (chat messages, the fields rewards receive)


class PromptStream:
    """Prompts, epoch after epoch, each epoch in an order shuffled by the seed (a file sorted by topic
    would otherwise give every step one topic's prompts); its position is part of the resume state."""

    def __init__(self, rows: list[Prompt], records: list[Record] | None = None, seed: int = 0):
        self.rows, self.pos, self.records = rows, 0, records or []  # records: each row's (source, record number)
        self.seed = seed
        self._order: tuple[int, list[int]] = (-1, [])  # (epoch, its order)
        self.last: list[Record] = []  # the records of the last take

    def _at(self, k: int) -> int:
        """The row handed out `k`-th since the start."""
        epoch = k // len(self.rows)
        if self._order[0] != epoch:
            self._order = (epoch, torch.randperm(len(self.rows), generator=epoch_generator(self.seed, epoch)).tolist())
        return self._order[1][k % len(self.rows)]

    def take(self, n: int) -> list[Prompt]:
        at = [self._at(self.pos + i) for i in range(n)]
        self.pos += n
        self.last = [self.records[i] for i in at] if self.records else []
        return [self.rows[i] for i in at]

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]


def token_logps(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int,
                temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of tokens ids[:, start:] given what precedes them (left-padded rows), under the
    distribution the rollouts sample from (logits / temperature, as TRL and verl score them): with
    temperature-1 log-probs the policy gradient of completions sampled at 0.7 is biased."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    logits = logits[:, start - 1:-1].float() / temperature
    return torch.gather(F.log_softmax(logits, -1), 2, ids[:, start:].unsqueeze(-1)).squeeze(-1)


def advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + 1e-4), rewards ordered prompt by prompt."""
    g = rewards.view(-1, group)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)


def decoupled_advantages(rewards: list[torch.Tensor], weights: list[float], group: int) -> torch.Tensor:
    """GDPO (Liu et al. 2026, arXiv:2601.05242 §3): each reward normalised within its group, the
    weighted sum of those, normalised over the batch; several rewards keep their own resolution
    instead of collapsing into one sum."""
    summed = sum((w * advantages(r, group) for r, w in zip(rewards, weights)), torch.zeros_like(rewards[0]))
    return (summed - summed.mean()) / (summed.std() + 1e-4) if len(summed) > 1 else summed - summed.mean()


class Rollouts:
    """The current rollout: `group` completions of each prompt with their rewards, advantages and
    log-probs (rollout policy and KL reference), made anew every `updates_per_rollout` steps."""

    def __init__(self, stage: RftStage, s: Session, data: PromptStream, rewards: list[Reward],
                 ref: torch.nn.Module | None, tracker: StageTracker):
        self.stage, self.s, self.data, self.rewards, self.ref, self.tracker = stage, s, data, rewards, ref, tracker
        self.labels = dict(zip((r.source for r in rewards), unique_labels(rewards)))  # metric names, as eval.reward's
        self.encoder = ChatEncoder(s.tokenizer, FormatSpec("prompt_completion"))
        self.generator = make_generator(stage, s.place.checkpoint, s.tokenizer, s.pad_id, s.device, stage.seed + s.rank)
        self.micro: list[dict[str, torch.Tensor]] = []  # the loss's micro-batches
        self.records: list[Record] = []  # (source, record number) of the prompts the current rollout holds
        self.scores: list[dict[str, Any]] = []  # per micro-batch: reward source -> scores, and "total"
        self.table: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[float]] = {}  # a Nova source's metrics_list values in this rollout
        self.first: list[dict[str, Any]] | None = None
        self.agent = Agent(stage, s.tokenizer, self.encoder, s.pad_id, s.device) if stage.env else None
        self.heldout: list[Prompt] = []  # env: the held-out tasks evaluate() plays
        if self.agent is not None:
            self.labels = {"env": "env", **self.labels}
        self.ahead = Ahead(self._produce, s.unwrapped(), stage.rollout.max_age) \
            if stage.rollout.mode == "off_policy_async" else None

    def before_step(self, step: int) -> None:
        if (step - 1) % self.stage.updates_per_rollout == 0 or not self.micro:
            self._make(step)

    @torch.no_grad()
    def _make(self, step: int) -> None:
        model = self.s.unwrapped()
        model.eval()
        rollout, age = self.ahead.take(model, step, step - 1) if self.ahead else (self._produce(model, step), 0)
        self._consume(model, rollout, age)
        after = step + self.stage.updates_per_rollout
        if self.ahead is not None and after <= self.s.total_steps:  # the next rollout, while this step trains
            self.ahead.start(model, after, step - 1)
        model.train()

    @torch.no_grad()
    def _produce(self, model: torch.nn.Module, step: int) -> list[dict[str, Any]]:
        """One rollout with `model` (the policy, or rollout.mode's copy of it): per micro-batch the
        sequences, scores, advantages and the sampling policy's log-probs (`behav`)."""
        stage, s = self.stage, self.s
        with s.gathered():  # under fsdp the whole weights, gathered from every rank
            self.generator.sync(model)
        out = []
        for _ in range(stage.grad_accum):
            # every rank takes the whole step's prompts and keeps its share, as the other stages do
            batch = self.data.take(stage.batch_size * s.world)[s.rank * stage.batch_size:(s.rank + 1) * stage.batch_size]
            records = self.data.last[s.rank * stage.batch_size:(s.rank + 1) * stage.batch_size]
            messages = [m for m, _ in batch]
            seqs, mask, cmask, width, texts, shown, scores = self._sample(model, batch)
            prompts = [m[-1]["content"] for m in messages for _ in range(stage.group)]
            fields = {k: [f.get(k) for _, f in batch for _ in range(stage.group)] for k in batch[0][1]}
            chats = [m for m in messages for _ in range(stage.group)]
            scores.update({rw.source: rw(prompts, texts, fields, step, chats) for rw in self.rewards})
            metrics: dict[str, list[float]] = {}
            for rw in self.rewards:  # a Nova source's metrics_list values, logged with the rewards
                for name, values in rw.metrics.items():
                    metrics.setdefault(f"reward.{self.labels[rw.source]}.{name}", []).extend(
                        v for v in values if v is not None)
            weights = {**{k: 1.0 for k in scores}, **{rw.source: rw.weight for rw in self.rewards}}
            total = torch.tensor([sum(w * scores[k][i] for k, w in weights.items()) for i in range(len(texts))])
            adv = advantages(total, stage.group) if stage.reward_norm == "sum" else decoupled_advantages(
                [torch.tensor(scores[k]) for k in weights], list(weights.values()), stage.group)
            behav = token_logps(model, seqs, mask, width, stage.temperature)
            out.append({"seqs": seqs, "mask": mask, "cmask": cmask, "width": width, "scores": scores, "total": total,
                        "adv": adv, "behav": behav, "prompts": prompts,
                        "shown": shown, "metrics": metrics, "records": records})
        return out

    def _consume(self, model: torch.nn.Module, rollout: list[dict[str, Any]], age: int) -> None:
        """The loss's micro-batches of a rollout; one made by older weights (age > 0) keeps the sampling
        policy's log-probs for the importance weights and takes the current policy's as `old`."""
        self.micro, self.scores, self.table = [], [], {"prompts": [], "completions": [], "reward": []}
        self.metrics = {}
        self.records = [x for r in rollout for x in r.get("records", [])]  # what the steps on it train on
        t = self.stage.temperature
        for r in rollout:
            seqs, mask, width = r["seqs"], r["mask"], r["width"]
            micro = {"ids": seqs, "mask": mask, "start": torch.tensor(width), "cmask": r["cmask"].float(),
                     "old": token_logps(model, seqs, mask, width, t) if age else r["behav"],
                     "adv": r["adv"].to(self.s.device), "targets": torch.tensor(int(r["cmask"].sum()))}
            if age:
                micro["behav"] = r["behav"]
            if self.ref is not None:
                micro["ref"] = token_logps(self.ref, seqs, mask, width, t)
            self.micro.append(micro)
            self.scores.append({**r["scores"], "total": r["total"]})
            for k, v in r["metrics"].items():
                self.metrics.setdefault(k, []).extend(v)
            self.table["prompts"] += r["prompts"]
            self.table["completions"] += r["shown"]
            self.table["reward"] += r["total"].tolist()
        self.first = self.first or self.scores

    def _sample(self, model: torch.nn.Module, batch: list[Prompt]) -> tuple[Any, ...]:
        """(sequences, mask, completion mask, prompt width, completions, their shown text, scores so far):
        `group` completions per prompt, or with an env `group` trajectories per task (scored by it)."""
        stage, tok = self.stage, self.s.tokenizer
        if self.agent is not None:
            trajs = self.agent.run(model, [task(m, f) for m, f in batch], stage.group)
            seqs, mask, cmask, width = trajectory_batch(trajs, self.s.pad_id, self.s.device)
            shown = [tok.decode(t.ids[t.prompt_len:], skip_special_tokens=True) for t in trajs]
            return seqs, mask, cmask, width, [t.answers[-1] for t in trajs], shown, {"env": [t.reward for t in trajs]}
        ids = [tok(self.encoder.render(m, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for m, _ in batch]
        completions = self.generator.generate(model, ids)
        seqs, mask, cmask, width = completion_batch(ids, completions, stage.group, self.s.pad_id, self.s.device)
        texts = tok.batch_decode(completions, skip_special_tokens=True)
        return seqs, mask, cmask, width, texts, texts, {}

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """The mean greedy trajectory reward (and turns) on the first `eval_tasks` held-out tasks."""
        if self.agent is None or not self.heldout:
            return {}
        model = self.s.unwrapped()
        model.eval()
        trajs = self.agent.run(model, [task(m, f) for m, f in self.heldout], 1, greedy=True)
        model.train()
        return {"env.heldout.reward": sum(t.reward for t in trajs) / len(trajs),
                "env.heldout.turns": sum(t.turns for t in trajs) / len(trajs)}

    def samples(self, step: int) -> None:
        if self.s.is_main and self.table:
            n = self.stage.samples.prompts * self.stage.group
            log_samples(self.tracker, step, [[{"content": p}] for p in self.table["prompts"][:n]],
                        self.table["completions"][:n], {"reward": self.table["reward"][:n]})

    def row(self, out: StepResult | None = None) -> dict[str, float]:
        """The rollout's reward figures over every rank's completions, and the mean completion length
        (a collective: the loop calls it on every rank, at the log interval)."""
        figures = reward_figures(self.scores, self.labels, self.s.accelerator)
        n = torch.tensor([float(sum(int(m["targets"]) for m in self.micro)), float(sum(len(x["total"]) for x in self.scores))],
                         dtype=torch.float64)
        if self.s.world > 1:
            n = self.s.accelerator.reduce(n.to(self.s.device), "sum").cpu()
        metrics = {k: sum(v) / len(v) for k, v in self.metrics.items() if v}  # this rank's (the Lambda's own figures)
        ahead = self.ahead.figures() if self.ahead is not None else {}
        return {**figures, **metrics, **ahead, "completion_length": n[0].item() / max(n[1].item(), 1.0)}

    def finish(self, state: TrainState) -> Outcome:
        stage = self.stage
        start = reward_figures(self.first or self.scores, self.labels, self.s.accelerator)["reward_mean"]
        lineage = {"rewards": [r.model_dump() for r in stage.rewards], "reference": str(self.s.place.checkpoint),
                   "generation": stage.generation, **({"lora": stage.lora.model_dump()} if stage.lora else {})}
        return Outcome({**self.row(), "reward_mean_start": start}, {n: state.tokens for n in stage.data[:1]}, lineage)


def task(messages: list[dict[str, Any]], fields: dict[str, Any]) -> dict[str, Any]:
    """What an environment's reset receives: the prompt row's fields, its messages and its user turn."""
    return {**fields, "messages": messages, "prompt": messages[-1]["content"]}


def grpo_loss(stage: RftStage, model: torch.nn.Module, b: dict[str, torch.Tensor]) -> Loss:
    """The clipped policy-ratio objective over completion tokens, plus kl_beta x the k3 KL estimate."""
    logp = token_logps(model, b["ids"], b["mask"], int(b["start"]), stage.temperature)
    ratio = torch.exp(logp - b["old"])
    adv = b["adv"].unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - stage.clip_eps, 1 + stage.clip_eps) * adv)
    m = b["cmask"]
    count = m.sum().clamp(min=1)  # statistics stay tensors: the step reads nothing to the host
    stats = {"clip_fraction": (((ratio - 1).abs() > stage.clip_eps).float() * m).sum().detach() / count}
    if "behav" in b:  # a rollout of older weights: truncated importance weights (IMPALA, Espeholt et al. 2018)
        w = torch.exp(b["old"] - b["behav"]).clamp(max=stage.rollout.is_cap)
        per_token = per_token * w
        stats["is_weight"] = (w * m).sum().detach() / count
    if "ref" in b:
        d = b["ref"] - logp
        kl = torch.exp(d) - d - 1
        per_token = per_token + stage.kl_beta * kl
        stats["kl"] = (kl.detach() * m).sum() / count
    return Loss((per_token * m).sum() / m.sum().clamp(min=1), stats)


def prompt_rows(stage: RftStage, inputs: StageInputs, held_out: bool = False) -> list[Prompt]:
    return [prompt_messages(row, getattr(inputs.sources[name], "chat", None), stage.prompt_field, at)
            for name in stage.data for _, at, row in split_rows(inputs.sources[name], held_out=held_out)]


def run(stage: RftStage, inputs: StageInputs) -> StageResult:
    rows = prompt_rows(stage, inputs)
    # a bad or empty prompt has failed before anything starts
    if not rows:
        raise ForgeError(f"stage {stage.name}: no prompts in {stage.data}")
    rewards: list[Reward] = []
    try:  # the Python rewards' worker processes live as long as the stage
        for spec in stage.rewards:
            rewards.append(Reward(spec, cache_dir=inputs.out_dir / "judge"))  # fails before any model loads on a bad source
        return _train(stage, inputs, rows, rewards)
    finally:
        for reward in rewards:
            reward.close()


def _train(stage: RftStage, inputs: StageInputs, rows: list[Prompt], rewards: list[Reward]) -> StageResult:
    s = open_session(stage, inputs, lora=stage.lora)
    if s.rank:  # each rank samples its own completions (rank 0 keeps the recipe's seed)
        torch.manual_seed(stage.seed + s.rank)
    ref = None
    if stage.kl_beta:
        ref = s.frozen_input()
    data = PromptStream(rows, [(n, k) for n in stage.data for k, _, _ in split_rows(inputs.sources[n], held_out=False)],
                        stage.seed)
    if stage.rollout.mode == "off_policy_async" and s.world > 1:
        raise ForgeError(f"stage {stage.name}: rollout: off_policy_async runs in one process; this launch has {s.world}")
    roll = Rollouts(stage, s, data, rewards, ref, inputs.tracker)
    if stage.env and stage.eval_tasks:  # held-out tasks of the environment, played greedily
        roll.heldout = prompt_rows(stage, inputs, held_out=True)[:stage.eval_tasks]
    try:
        return fit(s, RftTask(stage, roll, inputs.sources), inputs.tracker)
    finally:
        if roll.ahead is not None:
            roll.ahead.close()


class RftTask(Task[dict[str, torch.Tensor]]):
    """RFT's part of the loop: each step trains on the current rollout's micro-batches (a rollout is
    made before the step, untimed, every `updates_per_rollout` steps) with the GRPO loss; the reward
    figures in the log, greedy play of held-out tasks as the evaluation."""

    evaluates = True
    postfix = "reward_mean"

    def __init__(self, stage: RftStage, roll: Rollouts, sources: dict[str, Any]):
        super().__init__(roll.data, sources)
        self.stage, self.roll = stage, roll
        self.samples_every, self.chat_template = stage.samples.every, roll.encoder.template

    def before_step(self, step: int) -> None:
        self.roll.before_step(step)

    def batches(self) -> list[dict[str, torch.Tensor]]:
        return self.roll.micro

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor | Loss:
        return grpo_loss(self.stage, model, batch)

    def tokens(self, batches: list[dict[str, torch.Tensor]]) -> int:
        return sum(int(b["targets"]) for b in batches)

    def records(self) -> list[Record]:
        return self.roll.records

    def evaluate(self, step: int) -> dict[str, float]:
        return self.roll.evaluate(step)

    def samples(self, step: int) -> None:
        self.roll.samples(step)

    def row(self, out: StepResult) -> dict[str, float]:
        return self.roll.row(out)

    def finish(self, state: TrainState) -> Outcome:
        return self.roll.finish(state)


def reward_figures(scores: list[dict[str, Any]], labels: dict[str, str], accelerator: Any) -> dict[str, float]:
    """Mean and std of the weighted reward and of each source's, over every rank's completions."""
    def gathered(values: torch.Tensor) -> torch.Tensor:
        t = values.to(torch.float64)
        return accelerator.gather(t.to(accelerator.device)).cpu() if accelerator.num_processes > 1 else t

    total = gathered(torch.cat([x["total"] for x in scores]))
    row = {"reward_mean": total.mean().item(), "reward_std": total.std().item() if len(total) > 1 else 0.0}
    for source, key in labels.items():
        vals = gathered(torch.tensor([v for x in scores for v in x[source]], dtype=torch.float64))
        row[f"reward.{key}.mean"] = vals.mean().item()
        row[f"reward.{key}.std"] = vals.std().item() if len(vals) > 1 else 0.0
    return row
