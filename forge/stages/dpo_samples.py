"""DPO's sample table, every `samples.every` steps: for the first held-out pairs (training pairs when
none are held out), the prompt, the chosen and rejected replies, the policy's own greedy completion,
and the implicit rewards beta * (log pi - log ref) of chosen and rejected, with their margin."""
from __future__ import annotations

import torch

IGNORE = -100


def _split(ids: list[int], labels: list[int]) -> tuple[list[int], list[int]]:
    """(prompt tokens, reply tokens): the reply is the labelled tokens, the prompt what precedes them."""
    first = next((i for i, x in enumerate(labels) if x != IGNORE), len(ids))
    return ids[:first], [t for t, x in zip(ids, labels) if x != IGNORE]


@torch.no_grad()
def log_dpo_samples(tracker, step: int, stage, model, tokenizer, held: list[dict], train: list[dict],
                    ref: dict[str, torch.Tensor] | None, live, pad_id: int, device) -> None:
    """Log the table (samples/step-N.json) of the stage's `samples.prompts` first pairs. `ref` holds the
    cached reference log-probs per split (dpo.cached_reference); with `live` (a reference model) they
    are computed here."""
    from forge.stages.chat import generate_ids, log_samples
    from forge.stages.dpo import collate_pairs, pair_logps

    pairs = (held or train)[:stage.samples.prompts]
    if not pairs:
        return
    was = model.training
    model.eval()
    batch = collate_pairs(pairs, pad_id)
    policy = pair_logps(model, batch, device)[0].float().cpu()
    if live is not None:
        reference = pair_logps(live, batch, device)[0].float().cpu()
    else:
        reference = ref["held" if held else "train"][:len(pairs)].float().cpu()
    model.train(was)
    rewards = stage.beta * (policy - reference)
    prompts, chosen, rejected = [], [], []
    for p in pairs:
        prompt, reply = _split(p["chosen_input_ids"], p["chosen_labels"])
        prompts.append(prompt)
        chosen.append(tokenizer.decode(reply, skip_special_tokens=True))
        rejected.append(tokenizer.decode(_split(p["rejected_input_ids"], p["rejected_labels"])[1],
                                         skip_special_tokens=True))
    completions = generate_ids(model, tokenizer, prompts, stage.samples.max_new_tokens, device)
    texts = tokenizer.batch_decode(prompts, skip_special_tokens=True)
    log_samples(tracker, step, [[{"content": t}] for t in texts], completions,
                {"chosen": chosen, "rejected": rejected, "reward_chosen": rewards[:, 0].tolist(),
                 "reward_rejected": rewards[:, 1].tolist(), "margin": (rewards[:, 0] - rewards[:, 1]).tolist()})
