"""Finding tool calls in a model's turn, strictly.

The form Qwen2.5 / Hermes chat templates teach: one JSON object per call between tags,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 3"}}
    </tool_call>

Rules (docs/agents.md, "How calls are read"):

- A call is read by decoding JSON from just after its opening tag; only whitespace may follow the
  object before ``</tool_call>``. So a ``</tool_call>`` inside a JSON string is text of the string.
- ``<tool_call>`` inside a fenced code block (a line opening with three or more backticks or
  tildes, up to the line closing it, or to the end of the text) is text, not a call.
- The turn is **flagged** (no call of it runs; the model gets one error message) when a call is not
  closed, is not a JSON object, is nested deeper than ``MAX_DEPTH``, has a missing or empty
  ``name``, or has missing or non-object ``arguments`` (a JSON string holding an object is
  accepted), or when a ``</tool_call>`` appears outside any call.
- ``content`` is the text outside real call blocks (before, between and after them), stripped.
- Whatever the input, parsing returns a result or a flag, never an exception, and its time is
  linear in the length of the text: every character is looked at a bounded number of times, and
  JSON is decoded only after an iterative scan found its end and bounded its depth (the standard
  decoder recurses and raises RecursionError on deep nesting).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_DEPTH = 64  # far above any real arguments; far below the decoder's recursion limit
_EVENT = re.compile(r"<tool_call>|</tool_call>|^[ ]{0,3}(`{3,}|~{3,})", re.MULTILINE)
_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any
    error: str = ""  # why the turn's calls could not be read ("" when they could)


@dataclass(frozen=True)
class ParsedTurn:
    content: str  # the text outside call blocks
    calls: tuple[ToolCall, ...] = ()  # empty when flagged
    error: str = ""  # why the turn is flagged; "" when its calls (if any) are all well formed

    @property
    def flagged(self) -> bool:
        return bool(self.error)


class _Malformed(ValueError):
    pass


def parse_turn(text: str) -> ParsedTurn:
    """The calls of one assistant turn, its text outside them, or why it is flagged."""
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    while (event := _EVENT.search(text, pos)) is not None:
        token = event.group()
        if event.group(1):  # a code fence: skip to its closing line, all of it text
            end = _fence_end(text, event)
            content.append(text[pos:end])
            pos = end
            continue
        content.append(text[pos:event.start()])
        if token == CLOSE:
            return _flag(content, f"{CLOSE} without an opening {OPEN}")
        try:
            call, pos = _read_call(text, event.end())
        except _Malformed as exc:
            return _flag(content, str(exc))
        calls.append(call)
    content.append(text[pos:])
    return ParsedTurn("".join(content).strip(), tuple(calls))


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The turn's calls; a flagged turn is one ToolCall holding only the error (answered with one
    error message, none of its calls run)."""
    turn = parse_turn(text)
    return [ToolCall("", None, turn.error)] if turn.flagged else list(turn.calls)


def _flag(content: list[str], error: str) -> ParsedTurn:
    return ParsedTurn("".join(content).strip(), (), f"{error}; no call of this turn ran")


def _fence_end(text: str, opener: re.Match[str]) -> int:
    """Where the fenced block opened by ``opener`` ends: after its closing fence line (same
    character, at least as long, nothing else on the line but spaces), or at the end of the text."""
    fence = opener.group(1)
    line_end = text.find("\n", opener.end())
    if line_end < 0:
        return len(text)
    closing = re.compile(rf"^[ ]{{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
    found = closing.search(text, line_end + 1)
    return found.end() if found else len(text)


def _read_call(text: str, start: int) -> tuple[ToolCall, int]:
    """The call whose JSON begins at ``start`` (after whitespace), and where its block ends."""
    begin = _skip_space(text, start)
    payload, end = _decode_object(text, begin, OPEN)
    after = _skip_space(text, end)
    if not text.startswith(CLOSE, after):
        if after >= len(text):
            raise _Malformed(f"a {OPEN} is not closed with {CLOSE}")
        raise _Malformed(f"text after the JSON object in {OPEN}; expected {CLOSE}")
    return _call_from(payload), after + len(CLOSE)


def _call_from(payload: dict[str, Any]) -> ToolCall:
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Malformed(f'a {OPEN} needs a non-empty string "name"')
    if "arguments" not in payload:
        raise _Malformed(f'the {OPEN} for {name!r} has no "arguments" (an object, {{}} for none)')
    arguments = payload["arguments"]
    if isinstance(arguments, str):  # OpenAI's wire form: the object as a JSON string
        begin = _skip_space(arguments, 0)
        wire = arguments
        arguments, end = _decode_object(wire, begin, f'the "arguments" string of {name!r}')
        if _skip_space(wire, end) != len(wire):
            raise _Malformed(f'the "arguments" string of {name!r} holds more than one JSON object')
    if not isinstance(arguments, dict):
        raise _Malformed(f'the "arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}')
    return ToolCall(name, arguments)


def _decode_object(text: str, begin: int, what: str) -> tuple[dict[str, Any], int]:
    """The JSON object starting at ``begin`` and the index after it."""
    if not text.startswith("{", begin):
        if begin >= len(text):
            raise _Malformed(f"a {OPEN} is not closed with {CLOSE}")
        raise _Malformed(f"expected a JSON object in {what}")
    end = _object_end(text, begin, what)
    try:  # depth bounded by the scan, so the recursive decoder cannot overflow
        value, stop = _DECODER.raw_decode(text, begin)
    except json.JSONDecodeError as exc:
        raise _Malformed(f"malformed JSON in {what}: {exc.msg} at character {exc.pos - begin}") from None
    if stop != end:  # cannot happen for valid JSON; kept so that a disagreement is a flag, not a wrong call
        raise _Malformed(f"malformed JSON in {what} at character {stop - begin}")
    return value, stop


def _object_end(text: str, begin: int, what: str) -> int:
    """Index after the bracket that closes the one at ``begin``, found iteratively (strings skipped,
    escapes honoured); bracket kinds must match and nest at most MAX_DEPTH deep."""
    stack: list[str] = []
    pos = begin
    while (found := _BRACKET_OR_QUOTE.search(text, pos)) is not None:
        char, pos = found.group(), found.end()
        if char == '"':
            pos = _string_end(text, pos, what)
        elif char in "[{":
            stack.append("]" if char == "[" else "}")
            if len(stack) > MAX_DEPTH:
                raise _Malformed(f"the JSON in {what} nests deeper than {MAX_DEPTH} levels")
        elif not stack or stack.pop() != char:
            raise _Malformed(f"malformed JSON in {what}: unbalanced {char!r} at character {pos - 1 - begin}")
        if not stack:
            return pos
    raise _unclosed(text, begin, what, "an object or array is not closed")


def _string_end(text: str, pos: int, what: str) -> int:
    """Index after the quote closing the JSON string whose body starts at ``pos``."""
    while (found := _QUOTE_OR_BACKSLASH.search(text, pos)) is not None:
        if found.group() == '"':
            return found.end()
        pos = found.end() + 1  # skip the escaped character
    raise _unclosed(text, pos, what, "a string is not terminated")


def _unclosed(text: str, begin: int, what: str, why: str) -> _Malformed:
    """The JSON ran to the end of the text: a broken call when a closing tag came after it (the
    model closed the block, not the JSON), an unclosed call when none did."""
    if text.find(CLOSE, begin) >= 0:
        return _Malformed(f"malformed JSON in {what}: {why}")
    return _Malformed(f"a {OPEN} is not closed with {CLOSE}")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
