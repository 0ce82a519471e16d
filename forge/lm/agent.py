"""Multi-turn rollouts for agentic RFT: the policy talks to an environment over several turns, calling
its tools in the chat template's tool-call form; forge runs the tools, appends their results, and
keeps per trajectory its token ids, which of them the policy wrote (the only tokens with loss) and
its reward (the sum of its step rewards).

The environment (`env: file.py:Class` or `module:Class`, one instance per trajectory, made with no arguments):
- `reset(task) -> messages | str | None`: the opening turns (a str is one user turn; None keeps the
  task's prompt messages); `task` is the prompt row's fields plus its `messages` and `prompt`.
- `step(action) -> (observation, reward, done)`: the policy's turn (its text) when it called no tool;
  the observation is a str (a user turn), a message, a list of messages or None.
- optionally `tools`, a dict of callables: a turn holding `<tool_call>{"name", "arguments"}</tool_call>`
  blocks (forge's default rendering of tool calls, forge.data.chat_render) runs them with their
  arguments and appends each result as a `tool` turn (reward 0, not done) instead of calling `step`;
  an unknown tool, malformed JSON or bad arguments answer with an error text the policy reads.
A trajectory ends when the environment says done, after `max_turns` policy turns, or when `seq_len`
leaves no room for another turn. Generation is Hugging Face `generate`, all open trajectories in one batch.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from forge.data.formats import ChatEncoder
from forge.errors import ForgeError
from forge.lm.generation import Device, Model, Tokenizer, cut_at_eos
from forge.recipe.rft_settings import RftStage
from forge.usercode import load_function

Messages = list[dict[str, Any]]
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def tool_calls(text: str) -> list[tuple[str, dict[str, Any]] | str]:
    """The `<tool_call>` blocks of a turn as (name, arguments), or for a malformed block the error
    text its tool response carries."""
    out: list[tuple[str, dict[str, Any]] | str] = []
    for body in TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            out.append(f"error: the tool call is not JSON ({e.msg})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                or not isinstance(call.get("arguments", {}), dict):
            out.append('error: a tool call is {"name": NAME, "arguments": {...}}')
            continue
        out.append((call["name"], call.get("arguments", {})))
    return out


def as_messages(value: Any, role: str, where: str) -> Messages:
    """An environment's opening or observation as chat messages (see the module doc)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                              and isinstance(m.get("content"), str) for m in items):
        raise ForgeError(f"{where}: expected a str, a {{role, content}} message or a list of them, "
                         f"got {type(value).__name__}")
    return [dict(m) for m in items]


@dataclass
class Trajectory:
    """One episode: the tokens (opening prompt first), 1 where the policy wrote a token, the reward."""

    env: Any
    messages: Messages
    ids: list[int]
    policy: list[int]
    prompt_len: int
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    answers: list[str] = field(default_factory=list)  # the policy's turns, as text


class Agent:
    """Runs trajectories of the stage's environment with a model (see the module doc)."""

    def __init__(self, stage: RftStage, tokenizer: Tokenizer, encoder: ChatEncoder, pad_id: int, device: Device,
                 root: Path | None = None):
        assert stage.env is not None
        self.stage, self.tok, self.encoder, self.pad, self.device = stage, tokenizer, encoder, pad_id, device
        self.where = f"stage {stage.name}: env {stage.env!r}"
        self.make: Callable[[], Any] = load_function(stage.env, root, what=f"stage {stage.name}: env")
        probe = self.make()
        missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
        if missing:
            raise ForgeError(f"{self.where}: the environment has no {' or '.join(missing)} method "
                             "(reset(task) -> messages, step(action) -> (observation, reward, done))")

    def run(self, model: Model, tasks: list[dict[str, Any]], n: int, greedy: bool = False) -> list[Trajectory]:
        """`n` trajectories of each task (those of one task consecutive), all turns played."""
        trajs = [self._open(task) for task in tasks for _ in range(n)]
        while active := [t for t in trajs if not t.done]:
            for t, out in zip(active, self._generate(model, [t.ids for t in active], greedy)):
                self._act(t, out)
        return trajs

    def _open(self, task: dict[str, Any]) -> Trajectory:
        env = self.make()
        messages = as_messages(env.reset(task), "user", f"{self.where}: reset") or [dict(m) for m in task["messages"]]
        ids = self._ids(self.encoder.render(messages, add_generation_prompt=True))
        if len(ids) + self.stage.max_new_tokens > self.stage.seq_len:
            raise ForgeError(f"{self.where}: the opening prompt has {len(ids)} tokens, no room for a turn of "
                             f"max_new_tokens ({self.stage.max_new_tokens}) within seq_len ({self.stage.seq_len})")
        return Trajectory(env, messages, ids, [0] * len(ids), len(ids))

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self.tok(text, add_special_tokens=False)["input_ids"]
        return ids

    @torch.no_grad()
    def _generate(self, model: Model, prompts: list[list[int]], greedy: bool) -> list[list[int]]:
        st, width = self.stage, max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(x)) + x for x in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=self.device)
        sampling = {"do_sample": False} if greedy else \
            {"do_sample": True, "temperature": st.temperature, "top_p": st.top_p, "top_k": st.top_k}
        seqs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=st.max_new_tokens,
                              pad_token_id=self.pad, eos_token_id=self.tok.eos_token_id, **sampling)
        return [cut_at_eos(row, self.tok.eos_token_id) for row in seqs[:, width:].tolist()]

    def _act(self, t: Trajectory, out: list[int]) -> None:
        """Append the policy's turn, then the tools' results or the environment's answer."""
        eos = self.tok.eos_token_id
        t.ids += out
        t.policy += [1] * len(out)
        if eos is not None and (not out or out[-1] != eos):  # cut at max_new_tokens: the turn is closed for it
            t.ids.append(eos)
            t.policy.append(0)
        t.turns += 1
        text = self.tok.decode(out, skip_special_tokens=True)
        t.answers.append(text)
        t.messages.append({"role": "assistant", "content": text})
        tools = getattr(t.env, "tools", None)
        calls = tool_calls(text) if isinstance(tools, dict) else []
        if calls:
            obs = [{"role": "tool", "content": self._tool(tools or {}, c), "tool_call_id": f"call_{t.turns}_{k}"}
                   for k, c in enumerate(calls)]  # the id: rendered as an OpenAI tool answer (chat_render.adapt)
            reward, done = 0.0, False
        else:
            answer = t.env.step(text)
            if not (isinstance(answer, tuple) and len(answer) == 3):
                raise ForgeError(f"{self.where}: step must return (observation, reward, done), got {answer!r:.80}")
            obs, reward, done = as_messages(answer[0], "user", f"{self.where}: step"), answer[1], bool(answer[2])
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ForgeError(f"{self.where}: step's reward must be a finite number, got {reward!r}")
        t.reward += float(reward)
        if done or t.turns >= self.stage.max_turns or not obs:
            t.done = True
            return
        self._observe(t, obs)

    def _tool(self, tools: dict[str, Any], call: tuple[str, dict[str, Any]] | str) -> str:
        if isinstance(call, str):
            return call
        name, args = call
        if not callable(tools.get(name)):
            return f"error: no tool {name!r} (tools: {', '.join(sorted(tools))})"
        try:
            result = tools[name](**args)
        except TypeError as e:
            return f"error: bad arguments for {name}: {e}"
        return result if isinstance(result, str) else json.dumps(result, default=str)

    def _observe(self, t: Trajectory, obs: Messages) -> None:
        """The observation's tokens: the text its rendering adds after the trajectory's (a prefix of it)."""
        before = self.encoder.render(t.messages)
        after = self.encoder.render(t.messages + obs, add_generation_prompt=True)
        if not after.startswith(before):
            raise ForgeError(f"{self.where}: the chat template renders the conversation differently once a turn is "
                             "added; multi-turn rollouts need a template whose renderings extend each other")
        add = self._ids(after[len(before):])
        if len(t.ids) + len(add) + self.stage.max_new_tokens > self.stage.seq_len:
            t.done = True  # no room for another turn: the trajectory ends (truncated)
            return
        t.ids += add
        t.policy += [0] * len(add)
        t.messages += obs


def trajectory_batch(trajs: list[Trajectory], pad_id: int, device: Device
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(sequences, attention mask, policy-token mask, prompt width) as rft's loss reads them: the
    opening prompts left-padded to one width, the rest of each trajectory right-padded; the mask
    covers the tokens the policy wrote (never the prompt, the tool results or the environment's turns)."""
    width = max(t.prompt_len for t in trajs)
    span = max(1, max(len(t.ids) - t.prompt_len for t in trajs))
    rows, masks, cmasks = [], [], []
    for t in trajs:
        rest = len(t.ids) - t.prompt_len
        rows.append([pad_id] * (width - t.prompt_len) + t.ids + [pad_id] * (span - rest))
        masks.append([0] * (width - t.prompt_len) + [1] * len(t.ids) + [0] * (span - rest))
        cmasks.append(t.policy[t.prompt_len:] + [0] * (span - rest))

    def tensor(x: list[list[int]]) -> torch.Tensor:
        return torch.tensor(x, device=device)

    return tensor(rows), tensor(masks), tensor(cmasks), width
