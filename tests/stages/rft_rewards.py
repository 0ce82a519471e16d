"""Reward functions for the RFT tests (named by file path in the stages under test)."""
import asyncio
import math
import time


def e_share(prompts, completions, **fields):
    """A verifiable toy task: the share of the completion's characters that are the letter 'e'."""
    return [sum(ch == "e" for ch in c) / max(1, len(c)) for c in completions]


async def e_share_async(prompts, completions, **fields):
    await asyncio.sleep(0)
    return e_share(prompts, completions)


def raises(prompts, completions, **fields):
    raise RuntimeError("grader crashed")


def hangs(prompts, completions, **fields):
    time.sleep(5)
    return [0.0] * len(completions)


def nan(prompts, completions, **fields):
    return [math.nan] * len(completions)


def short(prompts, completions, **fields):
    return [0.0] * (len(completions) - 1)


def with_fields(prompts, completions, answer, **fields):
    return [float(a == "x") for a in answer]
