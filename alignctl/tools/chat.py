"""Chat-template plumbing for tool use, in token ids (nothing is decoded and re-encoded).

- :func:`render_prompt`: the prompt's ids with the tool list. A template that knows tools
  (it mentions ``tools``, as Qwen2.5's and Hermes' do) renders them itself; for one that does not
  (SmolLM2's, the tiny models'), a system message describes the tools and the call format.
- :class:`ToolTurns`: the ids the template puts between the end of a sampled assistant turn and
  the next assistant turn: the rest of the assistant turn's closing (e.g. ``\\n`` after
  ``<|im_end|>``), the tool messages, and the next assistant header. Computed on a fixed dummy
  conversation, so they never depend on how the sampled text would re-tokenize.
"""

from __future__ import annotations

import json
from typing import Any

from alignctl.models.compat import chat_token_ids
from alignctl.tools.tool import ToolResult

CALL_FORMAT = ('To call a tool, write <tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}'
               '</tool_call> and end your turn; the result comes back as a message from the tool.')
_DUMMY = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def template_knows_tools(tokenizer: Any) -> bool:
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def tools_system_text(schemas: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(s["function"], sort_keys=True) for s in schemas)
    return f"You can use these tools:\n{listing}\n{CALL_FORMAT}"


def with_tools(messages: list[dict[str, Any]], schemas: list[dict[str, Any]], tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra apply_chat_template kwargs) that present ``schemas`` to the model."""
    if not schemas:
        return messages, {}
    if template_knows_tools(tokenizer):
        return messages, {"tools": schemas}
    text = tools_system_text(schemas)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]], {}
    return [{"role": "system", "content": text}, *messages], {}


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[int]:
    messages, extra = with_tools(messages, schemas, tokenizer)
    return chat_token_ids(tokenizer, messages, add_generation_prompt=True, **extra)


class ToolTurns:
    """Token ids inserted after a sampled assistant turn that called tools."""

    def __init__(self, tokenizer: Any, stop_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        closed = chat_token_ids(tokenizer, _DUMMY)
        # The model's turn ends at its stop token; whatever the template writes after it (a newline)
        # belongs to the inserted part.
        ends = [i for i, t in enumerate(closed) if t in stop_ids]
        if not ends:
            raise ValueError("the chat template does not end an assistant turn with the stop token; "
                             "multi-turn rollouts need one")
        self.after_stop = closed[ends[-1] + 1:]
        self._closed = closed

    def ids(self, results: list[ToolResult]) -> list[int]:
        messages = [*_DUMMY, *({"role": "tool", "name": r.name, "content": r.content} for r in results)]
        opened = chat_token_ids(self.tokenizer, messages, add_generation_prompt=True)
        if opened[:len(self._closed)] != self._closed:
            raise ValueError("the chat template renders earlier turns differently once a tool message follows; "
                             "token-exact multi-turn needs a template that only appends")
        return self.after_stop + opened[len(self._closed):]
