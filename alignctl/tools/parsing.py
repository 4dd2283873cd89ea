"""Finding tool calls in a model's turn.

The form Qwen2.5 / Hermes chat templates teach: one JSON object per call between tags,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 3"}}
    </tool_call>

``arguments`` may also be a JSON string holding the object (OpenAI's wire form). A block that is
not valid JSON, or lacks ``name``, is returned as a malformed call with the reason, so the rollout
can answer it with an error message and the metrics can count it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any
    error: str = ""  # why the block could not be read as a call ("" when it could)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order."""
    return [_parse_block(block) for block in CALL_RE.findall(text)]


def _parse_block(block: str) -> ToolCall:
    try:
        payload = json.loads(block.strip())
    except json.JSONDecodeError as exc:
        return ToolCall("", None, f"malformed JSON in <tool_call>: {exc.msg} at character {exc.pos}")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall("", None, 'a <tool_call> must hold {"name": ..., "arguments": {...}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(payload["name"], None, "arguments is a string that is not JSON")
    return ToolCall(payload["name"], arguments)
