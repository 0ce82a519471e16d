"""Reward functions for the RFT tests (named by file path in the stages under test), and a tracker
that keeps their reward rows."""
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


def hangs_forever(prompts, completions, **fields):
    time.sleep(10**6)


def exits(prompts, completions, **fields):
    import sys
    sys.exit(3)


def hard_exit(prompts, completions, **fields):
    import os
    os._exit(3)


def segfault(prompts, completions, **fields):
    import ctypes
    ctypes.string_at(0)


def numpy_scores(prompts, completions, **fields):
    import numpy as np
    return np.array([0.5] * len(completions), dtype=np.float32)


def numpy_scalars(prompts, completions, **fields):
    import numpy as np
    return [np.float32(0.5) if i % 2 else np.int64(1) for i in range(len(completions))]


def numpy_bools(prompts, completions, **fields):
    import numpy as np
    return [np.bool_(True)] * len(completions)


def chaos(prompts, completions, mode, **fields):
    """The fuzz test's reward: each call misbehaves as its `mode` field says."""
    import os
    import sys
    n, how = len(completions), mode[0]
    if how == "hang":
        time.sleep(10**6)
    if how == "exit":
        sys.exit(3)
    if how == "hard_exit":
        os._exit(4)
    if how == "raise":
        raise ValueError("chaos")
    if how == "type":
        return {"scores": [0.0] * n}
    if how == "length":
        return [0.0] * (n + 1)
    if how == "nan":
        return [math.nan] * n
    if how == "string":
        return ["0.5"] * n
    if how == "huge":
        return [0.0] * (n + 3_000_000)
    return [0.0] * n


class RewardRows:
    """A tracker that keeps the RFT stage's logged rows holding a mean reward (and ignores the rest)."""

    def __init__(self):
        self.rows = []

    def log_metrics(self, m, step=None):
        if "reward_mean" in m:
            self.rows.append(m)

    def __getattr__(self, name):
        return lambda *a, **k: None
