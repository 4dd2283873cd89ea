"""A written tool-use conversation -> the token ids a multi-turn rollout would hold for it.

SFT on tool-use traces (teaching the call format before RL) must train on the same token layout
the multi-turn rollout produces and the RL update sees, or the policy learns one layout and is
rolled out in another. So a trace is assembled from the rollout's own pieces, never from one
``apply_chat_template`` call over the whole conversation:

- the prompt: :func:`alignctl.tools.chat.render_prompt` with the tool list;
- each assistant turn: its text tokenized alone, then the stop token that ends a sampled turn;
- each group of tool messages: :meth:`alignctl.tools.chat.ToolTurns.ids` (the closing of the
  assistant turn, the tool messages, the next assistant header), with each tool message named
  after the call it answers (read from the assistant turn before it).

The loss mask is 1 on the assistant turns (text and stop token) and 0 on everything inserted,
exactly as the rollout's mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alignctl.tools.tool import ToolResult
from alignctl.tools.chat import ToolTurns, render_prompt
from alignctl.tools.parsing import parse_tool_calls


class TraceError(ValueError):
    """A conversation that is not a well-formed tool-use trace (the message says why)."""


@dataclass
class TraceIds:
    prompt: list[int]
    response: list[int]
    loss_mask: list[int]  # per response token: 1 where the model wrote it


def is_tool_trace(completion: Any) -> bool:
    """Whether a completion column value is meant as a tool-use trace: more than one message, or a
    tool message (a single final reply is the plain SFT form)."""
    return isinstance(completion, (list, tuple)) and (len(completion) > 1 or any(
        isinstance(m, dict) and m.get("role") == "tool" for m in completion))


def check_trace(completion: list[dict[str, Any]]) -> None:
    """Assistant first and last; every run of tool messages answers the calls of the assistant turn
    before it, one message per call; no two assistant turns in a row (the rollout would have ended
    the trajectory after a turn without calls)."""
    if not completion or completion[0].get("role") != "assistant" or completion[-1].get("role") != "assistant":
        raise TraceError("a tool-use trace starts and ends with an assistant turn")
    i = 0
    while i < len(completion):
        message = completion[i]
        if message.get("role") != "assistant":
            raise TraceError(f"message {i}: expected an assistant turn, got role {message.get('role')!r}")
        calls = parse_tool_calls(str(message.get("content", "")))
        answers = 0
        while i + 1 + answers < len(completion) and completion[i + 1 + answers].get("role") == "tool":
            answers += 1
        last = i + 1 + answers >= len(completion)
        if calls and last:
            raise TraceError(f"message {i}: the last assistant turn calls a tool; a trace ends with the answer")
        if not calls and not last:
            raise TraceError(f"message {i}: an assistant turn without a <tool_call> must be the last one")
        if answers != len(calls):
            raise TraceError(f"message {i}: {len(calls)} tool call(s) but {answers} tool message(s) after it")
        bad = [c for c in calls if c.error]
        if bad:
            raise TraceError(f"message {i}: {bad[0].error}")
        i += 1 + answers


def trace_ids(tokenizer: Any, prompt: list[dict[str, Any]], completion: list[dict[str, Any]],
              schemas: list[dict[str, Any]], stop_id: int, turns: ToolTurns | None = None) -> TraceIds:
    """The ids of ``prompt`` (with the tools of ``schemas``) and of the trace ``completion``.
    ``turns``: the tokenizer's ToolTurns for ``stop_id``, built once by callers that convert many rows
    (it renders the template to find the turn closing)."""
    check_trace(completion)
    turns = turns or ToolTurns(tokenizer, (stop_id,))
    response: list[int] = []
    mask: list[int] = []
    pending: list[ToolResult] = []
    names: list[str] = []
    for message in completion:
        content = str(message["content"])
        if message["role"] == "tool":
            pending.append(ToolResult(names[len(pending)], content, True, 0.0))
            continue
        if pending:
            inserted = turns.ids(pending)
            response += inserted
            mask += [0] * len(inserted)
            pending = []
        written = list(tokenizer(content, add_special_tokens=False)["input_ids"]) + [stop_id]
        response += written
        mask += [1] * len(written)
        names = [call.name for call in parse_tool_calls(content)]
    return TraceIds(render_prompt(tokenizer, prompt, schemas), response, mask)
