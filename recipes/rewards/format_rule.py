"""Example reward: a format rule — one line, ending with a full stop, at most `max_chars` characters
(1.0 when all hold, minus 1/3 for each rule broken)."""


def one_sentence(prompts, completions, max_chars=120, **fields):
    out = []
    for c in completions:
        text = c.strip()
        broken = ("\n" in text) + (not text.endswith(".")) + (len(text) > max_chars)
        out.append(1.0 - broken / 3)
    return out
