"""Example reward: 1.0 when the completion, trimmed and case-folded, equals the row's `answer` field.

Use in a recipe as  rewards: [{source: rewards/exact_match.py:exact_answer}]  (path relative to the recipe)."""


def exact_answer(prompts, completions, answer, **fields):
    return [float(c.strip().casefold() == str(a).strip().casefold()) for c, a in zip(completions, answer)]
