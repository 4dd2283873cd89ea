"""The strict tool-call parser (alignctl/tools/parsing.py): each rule, texts from vLLM's and TRL's own
parser tests, and properties over generated text (no input raises; time grows linearly)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignctl.tools.parsing import MAX_DEPTH, ParsedTurn, ToolCall, parse_tool_calls, parse_turn

CALC = '{"name": "calculator", "arguments": {"expression": "1+1"}}'


def calls(turn: ParsedTurn) -> list[tuple[str, object]]:
    return [(c.name, c.arguments) for c in turn.calls]


# ------------------------------------------------------------------------------ the rules


def test_calls_in_order_and_the_text_around_them_is_the_content():
    turn = parse_turn(f"First <tool_call>{CALC}</tool_call> then\n<tool_call>\n"
                      '{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}\n</tool_call> end')
    assert not turn.flagged
    assert calls(turn) == [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2*3"})]
    assert turn.content == "First  then\n end"
    assert parse_turn("no call here, #### 5") == ParsedTurn("no call here, #### 5")


def test_a_closing_tag_inside_a_json_string_is_part_of_the_string():
    turn = parse_turn('<tool_call>{"name": "python", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>')
    assert calls(turn) == [("python", {"code": "print('</tool_call>')"})]
    # escaped quotes and backslashes before the tag do not end the string early
    turn = parse_turn('<tool_call>{"name": "p", "arguments": {"s": "a\\\\\\"</tool_call>"}}</tool_call>')
    assert calls(turn) == [("p", {"s": 'a\\"</tool_call>'})]


@pytest.mark.parametrize("fence", ["```", "````", "~~~", "```json", "  ```python"])
def test_a_call_in_a_fenced_code_block_is_text(fence):
    text = f"Call it like this:\n{fence}\n<tool_call>{CALC}</tool_call>\n{fence.strip()[:3] * 2}\nThat is all."
    turn = parse_turn(text)
    assert turn == ParsedTurn(text.strip())
    # an unclosed fence runs to the end of the text
    assert parse_turn(f"x\n{fence}\n<tool_call>{CALC}</tool_call>").calls == ()
    # and a real call after a closed fence still runs
    after = parse_turn(f"```\n<tool_call>{{}}</tool_call>\n```\n<tool_call>{CALC}</tool_call>")
    assert calls(after) == [("calculator", {"expression": "1+1"})] and after.content == "```\n<tool_call>{}</tool_call>\n```"


def test_a_fence_marker_in_the_middle_of_a_line_opens_nothing():
    turn = parse_turn(f"use ``` quotes <tool_call>{CALC}</tool_call>")
    assert calls(turn) == [("calculator", {"expression": "1+1"})]


@pytest.mark.parametrize(("text", "why"), [
    (f"<tool_call>{CALC}", "is not closed"),  # the final call without its closing tag
    (f"<tool_call>{CALC[:-1]}", "is not closed"),
    ('<tool_call>{"name": "c", "arguments": {"x": "a</tool_call>', "malformed JSON in <tool_call>: a string is not terminated"),
    ('<tool_call>{"name": "c", "arguments": {</tool_call>', "malformed JSON in <tool_call>: an object or array is not closed"),
    ("<tool_call>", "is not closed"),
    ("<tool_call>[1, 2]</tool_call>", "expected a JSON object in <tool_call>"),
    ("<tool_call>calculator(1+1)</tool_call>", "expected a JSON object"),
    ('<tool_call>{"name": "c", "arguments": {}]</tool_call>', "unbalanced"),
    ('<tool_call>{"name": "c", "arguments": {},}</tool_call>', "malformed JSON"),
    ('<tool_call>{"name": "c", "arguments": {}} trailing</tool_call>', "text after the JSON object"),
    ('<tool_call>{"name": "c", "arguments": {}}{"name": "d", "arguments": {}}</tool_call>', "text after"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": "  ", "arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', 'non-empty string "name"'),
    ('<tool_call>{"name": "calculator"}</tool_call>', 'has no "arguments"'),
    ('<tool_call>{"name": "c", "arguments": [1]}</tool_call>', "must be a JSON object, got list"),
    ('<tool_call>{"name": "c", "arguments": null}</tool_call>', "must be a JSON object, got NoneType"),
    ('<tool_call>{"name": "c", "arguments": "1+1"}</tool_call>', 'expected a JSON object in the "arguments" string of \'c\''),
    ('<tool_call>{"name": "c", "arguments": "{\\"a\\": 1} {}"}</tool_call>', "more than one JSON object"),
    ('<tool_call>{"name": "c", "arguments": "[1]"}</tool_call>', "expected a JSON object"),
    ("before </tool_call> after", "without an opening"),
    ("<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>", "expected a JSON object"),
    ('<tool_call>{"name": "c", "arguments": {"a": ' + "[" * 1000 + "]" * 1000 + "}}</tool_call>",
     f"nests deeper than {MAX_DEPTH}"),
    ('<tool_call>{"name": "c", "arguments": "{\\"a\\": ' + "[" * 1000 + "]" * 1000 + '}"}</tool_call>',
     f"nests deeper than {MAX_DEPTH}"),
])
def test_a_malformed_call_flags_the_turn(text, why):
    turn = parse_turn(text)
    assert turn.flagged and turn.calls == ()
    assert why in turn.error and turn.error.endswith("no call of this turn ran")


def test_one_bad_call_among_good_ones_flags_the_whole_turn():
    text = (f"<tool_call>{CALC}</tool_call><tool_call>{{\"name\": \"calculator\"}}</tool_call>"
            f"<tool_call>{CALC}</tool_call>")
    assert parse_turn(text).flagged and parse_turn(text).calls == ()
    # parse_tool_calls (what the rollout and the trace checks read) answers it with one error, runs none
    assert parse_tool_calls(text) == [ToolCall("", None, parse_turn(text).error)]


def test_nesting_up_to_the_limit_is_accepted():
    deep = "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)  # inside the call object and its arguments object
    turn = parse_turn(f'<tool_call>{{"name": "c", "arguments": {{"a": {deep}}}}}</tool_call>')
    assert not turn.flagged and calls(turn)[0][1] == {"a": json.loads(deep)}


# ------------------------------------------------------------------------------ texts from vLLM's and TRL's tests

# vllm-project/vllm, tests/tool_parsers/test_hermes_tool_parser.py
# (test_hermes_parser_non_streaming_tool_call_between_tags / _until_eos / _invalid_json / _no_tool_call)
VLLM_BETWEEN_TAGS = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
VLLM_UNTIL_EOS = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}'
VLLM_INVALID_JSON = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}'
VLLM_NO_CALL = "This is not a tool call."
# vllm-project/vllm, tests/entrypoints/openai/tool_parsers/test_hermes_tool_parser.py (NO_STREAM_FUNCTION_OUTPUT,
# its reasoning shortened to its first sentence): the call after a closed </think>, with non-ASCII arguments
VLLM_AFTER_THINK = ("好的，用户现在要研发一个5MW的燃气轮机，需要确定总体参数。\n</think>\n\n<tool_call>\n"
                    '{"name": "internet_search", "arguments": {"question": "5MW燃气轮机设计参数 空气流量 压气机'
                    '压比 转速 燃烧室出口温度 压气机级数 支点布局"}}\n</tool_call>\n\n ')
# vllm-project/vllm, same file as the first ones (test_hermes_parser_streaming), joined into one text
VLLM_STREAMED = ('<tool_call>{"name": "get_current_temperature","arguments": {"location":"San Francisco, '
                 'California, United States", "unit": "celsius"}}</tool_call>')


def test_vllm_hermes_texts():
    assert calls(parse_turn(VLLM_BETWEEN_TAGS)) == [("final_answer", {"trigger": True})]
    assert parse_turn(VLLM_NO_CALL) == ParsedTurn(VLLM_NO_CALL)
    assert parse_turn(VLLM_INVALID_JSON).flagged  # vLLM: no call, the text becomes content
    # where we differ from vLLM: it runs a call whose closing tag never came; we flag the turn
    until_eos = parse_turn(VLLM_UNTIL_EOS)
    assert until_eos.flagged and "is not closed" in until_eos.error
    thought = parse_turn(VLLM_AFTER_THINK)
    assert calls(thought) == [("internet_search", {"question": "5MW燃气轮机设计参数 空气流量 压气机压比 转速 "
                                                               "燃烧室出口温度 压气机级数 支点布局"})]
    assert thought.content.endswith("</think>")
    assert calls(parse_turn(VLLM_STREAMED)) == [
        ("get_current_temperature", {"location": "San Francisco, California, United States", "unit": "celsius"})]


# huggingface/trl, tests/test_chat_template_utils.py (TestParseResponse: test_parse_response_tool_call,
# _tool_call_with_content, _tool_call_without_arguments, _multiple_tool_calls) renders these conversations with
# Qwen3's template and parses them back; here is the rendered assistant text (special tokens skipped, as the
# rollout decodes), the call form also in the docstring of trl.chat_template_utils.parse_response.
TRL_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
TRL_WITH_CONTENT = "Let's call the tool.\n" + TRL_CALL
TRL_NO_ARGUMENTS = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
TRL_MULTIPLE = TRL_CALL + '\n<tool_call>\n{"name": "addition", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


def test_trl_texts():
    assert parse_turn(TRL_CALL) == ParsedTurn("", (ToolCall("multiply", {"a": 3, "b": 4}),))
    assert parse_turn(TRL_WITH_CONTENT) == ParsedTurn("Let's call the tool.", (ToolCall("multiply", {"a": 3, "b": 4}),))
    assert parse_turn(TRL_NO_ARGUMENTS) == ParsedTurn("", (ToolCall("ping", {}),))
    assert calls(parse_turn(TRL_MULTIPLE)) == [("multiply", {"a": 3, "b": 4}), ("addition", {"a": 3, "b": 4})]
    # where we differ from TRL: without its closing tag TRL reads the whole turn as content (a final
    # answer); we flag it, so the model is told its call did not run
    assert parse_turn(TRL_CALL.removesuffix("</tool_call>")).flagged


# ------------------------------------------------------------------------------ properties

PIECES = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', "\\", ":", ",", "\n", "```", "~~~", " ",
          '"name"', '"arguments"', '"calculator"', "1", "null", "a"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), max_size=200) | st.text(max_size=400))
def test_no_input_raises(text_or_pieces):
    text = "".join(text_or_pieces) if isinstance(text_or_pieces, list) else text_or_pieces
    turn = parse_turn(text)
    assert isinstance(turn, ParsedTurn)
    assert not (turn.flagged and turn.calls)
    for call in turn.calls:
        assert call.name.strip() and isinstance(call.arguments, dict)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=12))
def test_time_grows_linearly(unit_pieces):
    """A repeated unit at 1x and 4x the length: the 4x text may take at most 4 x 3 (noise on shared
    cores) the time of the 1x one, plus 20 ms. A quadratic parser takes ~16x (the lazy-regex one did
    on repeated unclosed tags)."""
    unit = "".join(unit_pieces)
    small = unit * max(1, 20_000 // len(unit))
    big = small * 4
    parse_turn(small)  # warm the regex cache
    t_small = min(_seconds(small) for _ in range(3))
    t_big = min(_seconds(big) for _ in range(3))
    assert t_big <= 12 * t_small + 0.02, (unit, t_small, t_big)


@pytest.mark.parametrize("unit", ["<tool_call>", "<tool_call>{", '<tool_call>{"a": "', "```\n", "[",
                                  f"<tool_call>{CALC}</tool_call>", "</tool_call>", "<tool_call>{\"a\": \"\\\\\"}"])
def test_time_grows_linearly_on_known_worst_cases(unit):
    small, big = unit * 5000, unit * 20000
    parse_turn(small)
    t_small = min(_seconds(small) for _ in range(3))
    t_big = min(_seconds(big) for _ in range(3))
    assert t_big <= 12 * t_small + 0.02, (unit, t_small, t_big)


def _seconds(text: str) -> float:
    start = time.perf_counter()
    parse_turn(text)
    return time.perf_counter() - start
