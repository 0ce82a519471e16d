"""forge's DPO and RFT stages vs the same training written bare (bench_pretrain.py and bench_sft.py do
pretraining and SFT), side by side, on a scratch Llama (random weights) and generated stories.

    python bench/bench_kinds.py [--kinds dpo,rft] [--repeats 3] [--quick]

DPO: forge's whole stage (cached reference, accelerate, clipping, schedule, the guard) ÷ a bare loop
over the very pair batches forge trains on (PairStream's order) with the reference's log-probs
computed beforehand, as forge caches them: forward on chosen+rejected, summed reply log-probs,
-logsigmoid(beta x margin), backward, clip, AdamW. Real (non-pad) tokens per second of training time.

RFT (GRPO): (a) the update: forge's optimizer steps (its training time: rollouts are made before a
step, untimed) ÷ a bare clipped policy-gradient step on the very rollouts forge made (captured);
(b) the whole loop: forge's rollouts + steps ÷ the same generation (Hugging Face `generate`, same
sampling), reward, group advantages, old log-probs and update written bare; completion tokens per
second. Every bare loop flushes denormals in every thread, as forge's loop does on a CPU
(forge/train/denormals.py), so the ratios stay forge's machinery against none. Contenders
alternate, the median of `--repeats` counts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from benchlib import REPO, machine_line, median, print_table, quiet_libraries, runs, scratch_base  # noqa: E402
from forge.train.denormals import flush_denormals  # noqa: E402

REWARD = REPO / "tests" / "stages" / "rft_rewards.py"


# ------------------------------------------------------------------ DPO
def write_pairs(src, path: Path, n: int) -> Path:
    """Preference pairs from the generated stories: continue a story's opening with its own text
    (chosen) or another story's (rejected)."""
    texts = [t for _, t in src.records()][: n + 1]
    rows = [{"prompt": f"Continue the story: {a.split('.')[0]}.", "chosen": a, "rejected": b}
            for a, b in zip(texts, texts[1:])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dpo_stage(args):
    from forge.recipe import DpoStage

    return DpoStage(name="dpo", kind="dpo", data=["prefs"], max_steps=args.steps, seq_len=args.seq_len,
                    batch_size=args.batch, beta=0.1, optim={"lr": 1e-4}, schedule={"kind": "constant"},
                    eval={"max_blocks": 1}, checkpoint={"final_optimizer": False}, log_every=args.steps)


def forge_dpo(base: Path, sources: dict, out: Path, args) -> float:
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    r = KINDS["dpo"].runner()(dpo_stage(args), StageInputs(base, sources, out, null_tracker(), log=lambda *_: None))
    return r.metrics["tokens"] / r.metrics["train_seconds"]


def reply_logps(model, batch: dict) -> torch.Tensor:
    """(pairs, 2) summed log-probs of the labelled tokens: chosen rows first, then rejected."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    target = batch["labels"][:, 1:]
    mask = target != -100
    logp = torch.gather(F.log_softmax(logits[:, :-1].float(), -1), 2, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.stack(((logp * mask).sum(1)).chunk(2), dim=1)


def bare_dpo(base: Path, sources: dict, args) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.packing import pad_token_id
    from forge.stages.dpo import PairStream, collate_pairs, load_pairs

    stage, tok = dpo_stage(args), AutoTokenizer.from_pretrained(base)
    pairs, _ = load_pairs(stage, sources, tok, held_out=False)
    order = PairStream(len(pairs), stage.batch_size, stage.seed)
    batches = [collate_pairs([pairs[i] for i in order.next_indices()], pad_token_id(tok)) for _ in range(args.steps)]
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.no_grad():
        refs = [reply_logps(ref, b) for b in batches]
    del ref
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with flush_denormals():  # as forge's loop on a CPU
        start = time.perf_counter()
        for b, r in zip(batches, refs):
            pol = reply_logps(model, b)
            margin = (pol[:, 0] - r[:, 0]) - (pol[:, 1] - r[:, 1])
            (-F.logsigmoid(stage.beta * margin).mean()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
    return sum(int(b["attention_mask"].sum()) for b in batches) / seconds


def bench_dpo(tmp: Path, base: Path, src, args) -> list[list]:
    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    path = write_pairs(src, tmp / "prefs.jsonl", args.pairs)
    sources = {"prefs": resolve_source("prefs", DataSource(path=str(path), holdout=0.0, chat={"kind": "preference"}),
                                       tmp)}
    got: dict[str, list[float]] = {"bare": [], "forge": []}
    for r in range(args.repeats):  # alternating, the first of each round rotating
        order = ["bare", "forge"] if r % 2 == 0 else ["forge", "bare"]
        for name in order:
            got[name].append(bare_dpo(base, sources, args) if name == "bare" else
                             forge_dpo(base, sources, tmp / f"dpo-{r}", args))
    bare = median(got["bare"])
    return [[f"DPO: {name}", median(v), median(v) / bare, runs(v, "{:,.0f}")] for name, v in
            (("bare loop (same pair batches, reference log-probs beforehand)", got["bare"]),
             ("forge DPO stage", got["forge"]))]


# ------------------------------------------------------------------ RFT
def rft_stage(args):
    from forge.recipe import RftStage

    return RftStage(name="rft", kind="rft", data=["p"], rewards=[{"source": f"{REWARD}:e_share"}],
                    max_steps=args.rft_steps, seq_len=args.seq_len, batch_size=args.rft_batch, group=args.group,
                    max_new_tokens=args.new_tokens, optim={"lr": 1e-4}, schedule={"kind": "constant"},
                    log_every=args.rft_steps, checkpoint={"final_optimizer": False})


def forge_rft(base: Path, sources: dict, out: Path, args) -> tuple[dict, list[list[dict]]]:
    """forge's stage with its rollouts timed and captured: (figures, each step's micro-batches)."""
    import forge.stages.rft as rft
    from forge.kinds import KINDS
    from forge.stages.result import StageInputs
    from forge.track import null_tracker

    spent, captured = [0.0], []
    make, consume = rft.Rollouts._make, rft.Rollouts._consume

    def timed_make(self, step):
        t0 = time.perf_counter()
        try:
            return make(self, step)
        finally:
            spent[0] += time.perf_counter() - t0

    def keep(self, model, rollout, age):
        consume(self, model, rollout, age)
        captured.append([{k: v.clone() if torch.is_tensor(v) else v for k, v in m.items()} for m in self.micro])

    rft.Rollouts._make, rft.Rollouts._consume = timed_make, keep
    try:
        r = KINDS["rft"].runner()(rft_stage(args), StageInputs(base, sources, out, null_tracker(), log=lambda *_: None))
    finally:
        rft.Rollouts._make, rft.Rollouts._consume = make, consume
    m = r.metrics
    return {"tokens": m["tokens"], "update_s": m["train_seconds"], "loop_s": m["train_seconds"] + spent[0]}, captured


def grpo_step(model, opt, b: dict, clip_eps: float) -> int:
    """One clipped policy-ratio step over completion tokens (GRPO, no KL term); its completion tokens."""
    ids, mask, start = b["ids"], b["mask"], int(b["start"])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, start - 1:-1]
    logp = torch.gather(F.log_softmax(logits.float(), -1), 2, ids[:, start:].unsqueeze(-1)).squeeze(-1)
    ratio, adv, m = torch.exp(logp - b["old"]), b["adv"].unsqueeze(1), b["cmask"]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    ((per_token * m).sum() / m.sum().clamp(min=1)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return int(m.sum())


def bare_update(base: Path, captured: list[list[dict]], clip_eps: float) -> float:
    """Seconds of the bare steps on forge's own rollouts."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.no_grad():  # forge's policy has run the rollout's forward passes before its first step: so has this
        b = captured[0][0]
        model(input_ids=b["ids"], attention_mask=b["mask"], use_cache=False)
    with flush_denormals():  # as forge's loop on a CPU
        start = time.perf_counter()
        for micro in captured:
            for b in micro:
                grpo_step(model, opt, b, clip_eps)
        return time.perf_counter() - start


def bare_loop(base: Path, prompts: list[str], args) -> tuple[float, int]:
    """Generation, reward, advantages, old log-probs and the step, written bare: (seconds, completion
    tokens); denormals flushed throughout, as forge's loop does on a CPU."""
    with flush_denormals():
        return bare_rft(base, prompts, args)


def bare_rft(base: Path, prompts: list[str], args) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.data.formats import ChatEncoder, FormatSpec
    from forge.data.packing import pad_token_id

    sys.path.insert(0, str(REWARD.parent))
    from rft_rewards import e_share

    stage, tok = rft_stage(args), AutoTokenizer.from_pretrained(base)
    enc, pad, eos = ChatEncoder(tok, FormatSpec("prompt_completion")), pad_token_id(tok), tok.eos_token_id
    ids = [tok(enc.render([{"role": "user", "content": p}], add_generation_prompt=True), add_special_tokens=False)
           ["input_ids"] for p in prompts]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    opt, g, n, tokens = torch.optim.AdamW(model.parameters(), lr=1e-4), stage.group, stage.batch_size, 0
    start = time.perf_counter()
    for step in range(stage.max_steps):
        batch = [ids[(step * n + i) % len(ids)] for i in range(n)]
        w = max(map(len, batch))
        x = torch.tensor([[pad] * (w - len(p)) + p for p in batch])
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=(x != pad).long() if pad != eos else None, do_sample=True,
                                 temperature=stage.temperature, top_p=stage.top_p, max_new_tokens=stage.max_new_tokens,
                                 num_return_sequences=g, pad_token_id=pad, eos_token_id=eos)[:, w:].tolist()
            comps = [row[:row.index(eos) + 1] if eos in row else row for row in out]
            rewards = torch.tensor(e_share(None, tok.batch_decode(comps, skip_special_tokens=True)))
            r = rewards.view(-1, g)
            adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
            width = max(map(len, comps))
            prompt = [batch[i // g] for i in range(len(comps))]
            seqs = torch.tensor([[pad] * (w - len(p)) + p + c + [pad] * (width - len(c)) for p, c in zip(prompt, comps)])
            mask = torch.tensor([[0] * (w - len(p)) + [1] * (len(p) + len(c)) + [0] * (width - len(c))
                                 for p, c in zip(prompt, comps)])
            cmask = mask[:, w:].float()
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=seqs, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, w - 1:-1]
            old = torch.gather(F.log_softmax(logits.float(), -1), 2, seqs[:, w:].unsqueeze(-1)).squeeze(-1)
        model.train()
        tokens += grpo_step(model, opt, {"ids": seqs, "mask": mask, "start": w, "cmask": cmask, "old": old,
                                         "adv": adv}, stage.clip_eps)
    return time.perf_counter() - start, tokens


def bench_rft(tmp: Path, base: Path, args) -> list[list]:
    from forge.inputs import resolve_source
    from forge.recipe import DataSource

    prompts = [f"Tell me about thing {i}." for i in range(64)]
    path = tmp / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    sources = {"p": resolve_source("p", DataSource(path=str(path), holdout=0.0), tmp)}
    got: dict[str, list[float]] = {k: [] for k in ("forge update", "bare update", "forge loop", "bare loop")}
    for r in range(args.repeats):
        first_bare = r % 2 == 1
        if first_bare:
            s, n = bare_loop(base, prompts, args)
            got["bare loop"].append(n / s)
        f, captured = forge_rft(base, sources, tmp / f"rft-{r}", args)
        got["forge update"].append(f["tokens"] / f["update_s"])
        got["forge loop"].append(f["tokens"] / f["loop_s"])
        got["bare update"].append(f["tokens"] / bare_update(base, captured, rft_stage(args).clip_eps))
        if not first_bare:
            s, n = bare_loop(base, prompts, args)
            got["bare loop"].append(n / s)
    rows = []
    for part, bare_name in (("update", "bare update"), ("loop", "bare loop")):
        bare = median(got[bare_name])
        what = {"update": "the steps on forge's rollouts", "loop": "rollouts + steps"}[part]
        rows += [[f"RFT {what}: bare", bare, 1.0, runs(got[bare_name], "{:,.0f}")],
                 [f"RFT {what}: forge", median(got[f"forge {part}"]), median(got[f"forge {part}"]) / bare,
                  runs(got[f"forge {part}"], "{:,.0f}")]]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="dpo,rft")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="DPO steps")
    ap.add_argument("--batch", type=int, default=8, help="DPO pairs per step")
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--rft-steps", type=int, default=8)
    ap.add_argument("--rft-batch", type=int, default=4, help="RFT prompts per step")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-64 model, a few steps, one repeat (CI)")
    args = ap.parse_args()
    if args.quick:
        args.__dict__.update(repeats=1, hidden=64, layers=2, seq_len=128, steps=3, batch=2, pairs=40, rft_steps=2,
                             rft_batch=2, group=2, new_tokens=8)
    quiet_libraries()
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-kinds-"))
    base, src = scratch_base(tmp, args.hidden, args.layers, args.seq_len, 300 if args.quick else 2000)
    kinds = args.kinds.split(",")
    rows = (bench_dpo(tmp, base, src, args) if "dpo" in kinds else []) + (bench_rft(tmp, base, args) if "rft" in kinds else [])
    print(machine_line())
    print(f"model: scratch llama {args.layers} layers, hidden {args.hidden}; DPO {args.steps} steps x {args.batch} pairs, "
          f"seq_len {args.seq_len}; RFT {args.rft_steps} steps x {args.rft_batch} prompts x {args.group}, "
          f"{args.new_tokens} new tokens; median of {args.repeats}")
    print_table("bench_kinds", ["tokens/s", "÷ bare", "runs (tokens/s)"], rows)


if __name__ == "__main__":
    main()
