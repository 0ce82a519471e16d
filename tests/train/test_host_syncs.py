"""No host sync between log steps: a step leaves its loss, token counts and statistics on the device,
and the loop reads them at `log_every`, at checkpoints and at the end. A read is a call of a tensor's
`item`, `tolist`, `__float__`, `__int__` or `__bool__`; each one waits for the device's queue to drain
on a GPU. Making the batches (the data stream, on the host by nature) is not counted.

Two reads by libraries are allowed and named: torch's optimizers read their step count, a tensor
they keep on the host by design (`capturable=False`), so it costs a GPU nothing; and transformers
checks `position_ids` for packed sequences with `.all()` in eager mode (skipped under torch.compile).
Any other read, forge's or a library's, fails the test."""
from __future__ import annotations

import json
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from forge.inputs import resolve_source
from forge.recipe import DataSource, Guard, Optim, PretrainStage, SftStage
from forge.train import loop
from forge.train.losses import Loss, masked_lm_loss_sum
from forge.train.ranks import Halt
from forge.train.step import DivergenceGuard, train_step
from forge_testing import pretrain_stage, run_stage

READS = ("item", "tolist", "__float__", "__int__", "__bool__")


class HostReads:
    """Counts reads per training step: from the start of step k's `train_step` to the start of step
    k+1's, outside the task's data callables."""

    ALLOWED = ("/torch/optim/", "/transformers/masking_utils.py")

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.per_step: Counter[int] = Counter()
        self.where: dict[int, Counter[str]] = {}
        self.step, self.paused = 0, 0
        for name in READS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(real))

    def _counted(self, real):
        def read(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not self.paused and not any(part in caller for part in self.ALLOWED):
                self.per_step[self.step] += 1
                self.where.setdefault(self.step, Counter())[f"{real.__name__} in {caller}:{sys._getframe(1).f_lineno}"] += 1
            return real(tensor, *args, **kwargs)
        return read

    def quiet(self, fn):
        if fn is None:
            return None

        def call(*args, **kwargs):
            self.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused -= 1
        return call

    def watch_loop(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_step, real_fit = loop.train_step, loop._fit

        def step(s, batches, loss, guard, at):
            self.step = at
            return real_step(s, batches, loss, guard, at)

        def fit(s, task, tracker):
            self.step = 0  # restoring and evaluating the start
            for f in ("batches", "records", "tokens", "before_step"):  # the data's own work: not counted
                setattr(task, f, self.quiet(getattr(task, f)))
            return real_fit(s, task, tracker)

        monkeypatch.setattr(loop, "train_step", step)
        monkeypatch.setattr(loop, "_fit", fit)


def _assert_reads_only_at(reads: HostReads, steps: int, log_steps: set[int]) -> None:
    quiet_steps = {k: reads.per_step[k] for k in range(1, steps + 1) if k not in log_steps}
    where = {k: dict(reads.where.get(k, {})) for k in quiet_steps if quiet_steps[k]}
    assert quiet_steps == dict.fromkeys(quiet_steps, 0), f"host reads on steps that log nothing: {where}"
    assert all(reads.per_step[k] > 0 for k in log_steps), reads.per_step  # the counter sees the log steps' reads


def test_a_pretrain_step_reads_nothing_to_the_host_between_log_steps(tmp_path, monkeypatch, tiny_checkpoint,
                                                                     generated_sources):
    stage = PretrainStage(**pretrain_stage(max_steps=6, log_every=3, eval={"max_blocks": 2},
                                           optim={"lr": 3e-3, "grad_clip": 1.0}))
    reads = HostReads(monkeypatch)
    reads.watch_loop(monkeypatch)
    result = run_stage(stage, tiny_checkpoint, generated_sources, tmp_path / "out")
    assert result.metrics["loss"] > 0 and result.metrics["tokens"] == 6 * 4 * 32
    _assert_reads_only_at(reads, 6, {3, 6})


def test_an_sft_step_reads_nothing_to_the_host_between_log_steps(tmp_path, monkeypatch, tiny_checkpoint):
    rows = [{"prompt": f"What is {i} plus one?", "completion": f"It is {i + 1}."} for i in range(40)]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qa = resolve_source("qa", DataSource(path=str(path), holdout=0.0, chat={"kind": "prompt_completion"}), tmp_path)
    stage = SftStage(name="sft", kind="sft", data=["qa"], max_steps=8, seq_len=64, batch_size=2, grad_accum=2,
                     log_every=4)
    reads = HostReads(monkeypatch)
    reads.watch_loop(monkeypatch)
    result = run_stage(stage, tiny_checkpoint, {"qa": qa}, tmp_path / "out")
    assert result.metrics["loss"] > 0
    _assert_reads_only_at(reads, 8, {4, 8})


def test_a_step_with_statistics_reads_nothing_and_the_figures_are_the_same(monkeypatch):
    """The kind's statistics (a `Loss` with figures) ride the step as tensors: no read, and the
    figures equal those read eagerly, micro-batch by micro-batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from forge.train.accel import new_accelerator

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                         max_position_embeddings=32))
    acc = new_accelerator("fp32", "test")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    session = SimpleNamespace(accelerator=acc, model=model, optimizer=opt,
                              scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                              settings=SimpleNamespace(optim=Optim(grad_clip=1.0)))
    gen = torch.Generator().manual_seed(1)
    batches = []
    for keep in (3, 9):
        ids = torch.randint(0, 64, (2, 16), generator=gen)
        labels = ids.clone()
        labels[:, :16 - keep] = -100
        batches.append({"input_ids": ids, "labels": labels})
    seen: list[tuple[float, int]] = []

    def loss(m, batch):
        total, n = masked_lm_loss_sum(m, batch)
        mean = total / n.clamp(min=1)
        seen.append((mean.detach().clone(), n.clone()))  # read after the step, not during it
        return Loss(mean, {"share": mean.detach() * 2})

    reads = HostReads(monkeypatch)
    reads.step = 1
    out = train_step(session, batches, loss, DivergenceGuard(Guard(), "test"), step=1)
    assert reads.per_step[1] == 0, reads.per_step
    reads.paused += 1
    expected = sum(float(m) * 2 * int(n) for m, n in seen)
    assert abs(float(out.stat_sums["share"]) - expected) < 1e-4
    assert int(out.targets) == sum(int(n) for _, n in seen) == 2 * (3 + 9)


def test_ranks_agree_on_a_stop_at_read_points_and_about_once_a_second():
    """Several ranks check the stop flag through an all-reduce (a host sync) only at read points and
    every `every` steps; `every` comes from the step time averaged over ranks (the same on each), so
    every rank checks at the same steps and stops at the same one."""
    calls = []

    class Acc:
        def reduce(self, t, op):
            calls.append(op)
            return t * 2 if op == "sum" else t

    flag = SimpleNamespace(requested=False)
    halt = Halt(SimpleNamespace(world=2, device=torch.device("cpu"), accelerator=Acc()), flag, log_every=50)
    assert [halt.check(step, read_point=False) for step in range(1, 50)] == [False] * 49 and calls == []
    halt.pace(0.25)  # 4 steps a second
    assert calls == ["mean"] and halt.every == 4
    flag.requested = True
    assert [halt.check(step, read_point=False) for step in (53, 54, 55)] == [False] * 3  # not due: no collective
    assert halt.check(53, read_point=True) and halt.check(56, read_point=False) and calls.count("sum") == 2
    halt.pace(3.0)  # slower than a second a step: every step
    assert halt.every == 1
    one = Halt(SimpleNamespace(world=1), flag, log_every=50)
    assert one.check(7, read_point=False)  # one process reads its own flag every step, no collective
