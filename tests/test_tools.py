"""Tools and tool-using rollouts (issue 18): the calculator, call parsing, argument checks, timeouts
and crashes, the python sandbox's limits, chat templates with tools, and the multi-turn rollout's
token accounting on a tiny model fitted to tool-use traces (tests/tool_helpers.py)."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import pytest
import torch

from alignctl.tools import TOOLS, ToolResult, parse_tool_calls, register_tool, run_tool, tool_schemas
from alignctl.tools.calculator import CalculatorError, evaluate, format_number
from alignctl.tools.python_sandbox import run_python
from sandbox_helpers import bwrap_or_skip
from tool_helpers import TRACES, trace_ids


# ------------------------------------------------------------------------------ calculator


@pytest.mark.parametrize(("expression", "value"), [("12*34", "408"), ("(12 + 7) * 3", "57"), ("7/2", "3.5"),
                                                   ("-2**3", "-8"), ("10 // 3 + 10 % 3", "4"), ("1e3 + 1", "1001"),
                                                   ("2**0.5", "1.41421356237")])
def test_calculator_values(expression, value):
    assert format_number(evaluate(expression)) == value


@pytest.mark.parametrize(("expression", "why"), [
    ("__import__('os').system('ls')", "Call is not allowed"), ("x + 1", "Name is not allowed"),
    ("(1).real", "Attribute is not allowed"), ("'a' * 3", "Constant is not allowed"), ("1 < 2", "Compare"),
    ("9**9**9", "power too large"), ("1/0", "division by zero"), ("2 +", "not an arithmetic expression"),
    ("1" * 600, "longer than 500"),
])
def test_calculator_refuses_everything_but_arithmetic(expression, why):
    with pytest.raises(CalculatorError, match=why):
        evaluate(expression)


# ------------------------------------------------------------------------------ calls and arguments


def test_parsing_valid_malformed_and_string_arguments():
    """What the rollout reads (tests/test_tool_parsing.py covers every rule): the calls in order, or
    for a turn with any malformed call one error and no call."""
    text = ('First <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call> then '
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "1+1"}, ""), ("calculator", {"expression": "2*3"}, "")]
    bad = parse_tool_calls(text + '<tool_call>{"name": "calculator", "arguments": {</tool_call><tool_call>[1, 2]</tool_call>')
    assert [(c.name, c.arguments) for c in bad] == [("", None)]
    assert bad[0].error == "malformed JSON in <tool_call>: an object or array is not closed; no call of this turn ran"
    assert parse_tool_calls("no call here, #### 5") == []


def test_arguments_are_checked_against_the_schema():
    calc = TOOLS.get("calculator")
    assert calc.check_arguments({"expression": "1+1"}) is None
    assert calc.check_arguments({"expression": 30}) == "argument 'expression' must be a string, got int"
    assert calc.check_arguments({}) == "missing argument(s) expression"
    assert calc.check_arguments({"expression": "1", "x": 1}) == "unknown argument 'x'; expected expression"
    assert calc.check_arguments(["1+1"]) == "arguments must be a JSON object, got list"
    # a config setting of a tool is never an argument the model may pass
    python = TOOLS.get("python").configured({"isolation": "none"})
    assert python.check_arguments({"code": "1", "isolation": "none"}) == "unknown argument 'isolation'; expected code"
    counter = register_tool("count_test", "count", {"type": "object", "properties": {"n": {"type": "integer"}},
                                                    "required": ["n"]})(lambda n: str(n))
    try:
        tool = TOOLS.get("count_test")
        assert tool.check_arguments({"n": 3}) is None and counter(n=3) == "3"
        assert tool.check_arguments({"n": True}) == "argument 'n' must be a integer, got bool"  # JSON true is not 1
        assert tool.check_arguments({"n": 1.5}) == "argument 'n' must be a integer, got float"
    finally:
        TOOLS.unregister("count_test")


def test_a_slow_or_crashing_tool_becomes_a_message():
    register_tool("slow_test", "sleeps", {"type": "object", "properties": {}}, timeout_s=0.2)(
        lambda: time.sleep(3) or "late")
    register_tool("crash_test", "raises", {"type": "object", "properties": {}})(lambda: 1 / 0)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            start = time.perf_counter()
            slow = run_tool(TOOLS.get("slow_test"), "slow_test", {}, pool)
            waited = time.perf_counter() - start
            crash = run_tool(TOOLS.get("crash_test"), "crash_test", {}, pool)
            unknown = run_tool(None, "abacus", {}, pool)
            ok = run_tool(TOOLS.get("calculator"), "calculator", {"expression": "6*7"}, pool)
    finally:
        TOOLS.unregister("slow_test")
        TOOLS.unregister("crash_test")
    assert (slow.ok, slow.error, slow.content) == (False, "timeout", "error: slow_test timed out after 0.2 s")
    assert waited < 1.0  # the rollout waited the timeout, not the tool
    assert (crash.error, crash.content) == ("exception", "error: ZeroDivisionError: division by zero")
    assert (unknown.error, unknown.content) == ("unknown_tool", "error: unknown tool 'abacus'")
    assert (ok.ok, ok.content) == (True, "42")


# ------------------------------------------------------------------------------ the python sandbox


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_python_tool_runs_code_and_cuts_long_output(isolation):
    if isolation == "bwrap":
        bwrap_or_skip()
    assert run_python("print(sum(range(10)))", isolation_mode=isolation) == "45\n"
    assert run_python("open('scratch.txt', 'w').write('ok'); print(open('scratch.txt').read())",
                      isolation_mode=isolation) == "ok\n"
    assert run_python("print('x' * 100000)", isolation_mode=isolation).endswith("[output cut]")


@pytest.mark.parametrize(("code", "needle"), [
    ("import os\nwhile True:\n    os.fork()", "sandbox: os.fork is not allowed"),  # a fork bomb
    ("x = bytearray(10 * 1024**3)", "MemoryError"),  # a 10 GB allocation
    ("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)", "is not allowed"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", "is not allowed"),
    ("import subprocess\nsubprocess.run(['ls', '/'])", "sandbox: subprocess.Popen is not allowed"),
    ("import os\nos.system('touch /tmp/alignctl_escape')", "is not allowed"),
    ("import ctypes", "sandbox: import is not allowed"),
    ("while True:\n    pass", "killed by signal"),  # CPU limit
])
def test_python_tool_contains(code, needle, tmp_path):
    """The second layer alone (isolation=none: the limits and the audit hook); tests/test_sandbox.py
    attacks the bwrap sandbox with the hook switched off."""
    outside = tmp_path / "outside.txt"
    # A wall limit far above the 5 s CPU limit: on loaded cores (two test files at a time beside their
    # Ray workers) the endless loop got its CPU seconds too slowly and met the default 7 s wall limit first.
    assert needle in run_python(code, isolation_mode="none", wall_seconds=60)
    assert "outside the working folder is not allowed" in run_python(f"open({str(outside)!r}, 'w').write('x')",
                                                                     isolation_mode="none")
    assert not outside.exists() and not Path("/tmp/alignctl_escape").exists()


def test_the_python_tool_is_off_unless_enabled():
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.errors import UserError

    flags = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "actor_rollout_ref.rollout.n": 2,
             "actor_rollout_ref.rollout.multi_turn.enable": True,
             "actor_rollout_ref.rollout.multi_turn.tools": ["calculator", "python"]}
    with pytest.raises(UserError, match="enable_python_tool=true"):
        load_config(RLConfig, None, [], flags=flags)
    cfg = load_config(RLConfig, None, [], flags=flags | {"actor_rollout_ref.rollout.multi_turn.enable_python_tool": True,
                                                         "actor_rollout_ref.rollout.multi_turn.isolation": "none"})
    assert cfg.actor_rollout_ref.rollout.multi_turn.tools == ["calculator", "python"]


PYTHON_TOOL = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "actor_rollout_ref.rollout.n": 2,
               "actor_rollout_ref.rollout.multi_turn.enable": True,
               "actor_rollout_ref.rollout.multi_turn.tools": ["python"],
               "actor_rollout_ref.rollout.multi_turn.enable_python_tool": True}
# what bubblewrap 0.8 prints where the kernel refuses unprivileged user namespaces
NO_USERNS = ("bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
             "non-privileged user namespaces. On e.g. debian this can be enabled with "
             "'sysctl kernel.unprivileged_userns_clone=1'.")


@pytest.mark.parametrize(("bwrap_script", "needles"), [
    (None, ["bubblewrap, which is not installed", "apt-get install bubblewrap"]),
    (f"#!/bin/sh\necho \"{NO_USERNS}\" >&2\nexit 1\n", ["cannot start", "unprivileged user namespaces",
                                                          "sysctl -w kernel.unprivileged_userns_clone=1"]),
])
def test_the_python_tool_is_refused_where_bwrap_cannot_run(monkeypatch, bwrap_script, needles):
    """Before anything starts, one line naming the fix; isolation=none is the explicit way out."""
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.errors import UserError
    from alignctl.tools.bwrap import isolation_problem

    import shutil
    import tempfile

    bin_dir = Path(tempfile.mkdtemp(prefix="fake-bwrap-"))  # not under pytest's 0700 folders: root runs bwrap as nobody
    bin_dir.chmod(0o755)
    if bwrap_script is not None:  # a bwrap that fails as the real one does without user namespaces
        (bin_dir / "bwrap").write_text(bwrap_script)
        (bin_dir / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    isolation_problem.cache_clear()
    try:
        with pytest.raises(UserError) as info:
            load_config(RLConfig, None, [], flags=PYTHON_TOOL)
        message = str(info.value)
        assert "\n" not in message and message.startswith("key 'actor_rollout_ref.rollout.multi_turn.isolation': ")
        assert all(n in message for n in needles) and "multi_turn.isolation=none" in message, message
        load_config(RLConfig, None, [], flags=PYTHON_TOOL | {"actor_rollout_ref.rollout.multi_turn.isolation": "none"})
        # and a run that skipped the check gets the same reason as the tool's answer, nothing runs
        assert run_python("print(1)").startswith("error: the python tool")
    finally:
        isolation_problem.cache_clear()
        shutil.rmtree(bin_dir)


# ------------------------------------------------------------------------------ chat templates


def test_prompts_present_tools_through_the_template_or_a_system_message(tool_model):
    from alignctl.models.loading import load_tokenizer
    from alignctl.tools.chat import render_prompt, tools_system_text

    tok = load_tokenizer(tool_model["model"], padding_side="left")
    schemas = tool_schemas(["calculator"])
    text = tok.decode(render_prompt(tok, [{"role": "user", "content": "What is 7+8?"}], schemas))
    assert text.startswith("<|system|>You can use these tools:") and text.endswith("<|user|>What is 7+8?<|end|><|assistant|>")
    merged = tok.decode(render_prompt(tok, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"}], schemas))
    assert merged.startswith("<|system|>Be brief.\n\nYou can use these tools:") and merged.count("<|system|>") == 1
    # A template that renders `tools` itself (as Qwen2.5's does) gets them as the tools argument.
    tok.chat_template = ("{%- if tools %}{{ '<|system|>TOOLS:' }}{% for t in tools %}{{ t['function']['name'] }}"
                         "{% endfor %}{{ '<|end|>' }}{%- endif %}" + tok.chat_template)
    assert tok.decode(render_prompt(tok, [{"role": "user", "content": "Hi"}], schemas)).startswith(
        "<|system|>TOOLS:calculator<|end|><|user|>Hi")
    assert tools_system_text(schemas) not in tok.decode(render_prompt(tok, [{"role": "user", "content": "Hi"}], schemas))


def test_tool_turn_ids_are_what_the_template_appends(tool_model):
    from alignctl.models.loading import load_tokenizer
    from alignctl.tools.chat import ToolTurns

    tok = load_tokenizer(tool_model["model"], padding_side="left")
    turns = ToolTurns(tok, (tok.eos_token_id,))
    ids = turns.ids([ToolResult("calculator", "408", True, 0.0)])
    assert tok.decode(ids) == "<|tool|>408<|end|><|assistant|>"
    # a template that marks the last message: the assistant turn renders differently once a tool message follows
    tok.chat_template = "{% for m in messages %}{% if loop.last %}#{% endif %}{{ m['content'] + '<|end|>' }}{% endfor %}"
    with pytest.raises(ValueError, match="renders earlier turns differently"):
        ToolTurns(tok, (tok.eos_token_id,)).ids([ToolResult("calculator", "1", True, 0.0)])


# ------------------------------------------------------------------------------ multi-turn rollouts


def _rollout(tool_model, max_turns: int = 3, budget: int = 256, lanes: int = 1):
    from transformers import AutoModelForCausalLM

    from alignctl.models.loading import load_tokenizer
    from alignctl.rollout.hf_engine import HFRolloutEngine
    from alignctl.rollout.multi_turn import MultiTurnRollout
    from alignctl.tools.chat import render_prompt

    tok = load_tokenizer(tool_model["model"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tool_model["model"])
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_id=[tok.eos_token_id])
    rollout = MultiTurnRollout(engine, tok, ["calculator"], max_turns=max_turns, max_response_length=budget,
                               stop_ids=[tok.eos_token_id], lanes=lanes)
    prompts = [render_prompt(tok, [{"role": "user", "content": q}], tool_schemas(["calculator"])) for q in TRACES]
    return tok, model, rollout, prompts


def test_token_in_token_out_and_loss_masks(tool_model):
    """Greedy rollouts reproduce the fitted traces; each response is exactly [sampled | inserted |
    sampled] with the inserted part equal to the template's tool-turn ids for the tool results,
    and the loss mask is 1 on the sampled tokens only."""
    from alignctl.rollout.engine import SamplingParams

    tok, _, rollout, prompts = _rollout(tool_model)
    out = rollout.generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=256))
    stop = (tok.eos_token_id,)
    for i, question in enumerate(TRACES):
        prompt, response, loss = trace_ids(tok, question, stop)
        assert prompts[i] == prompt
        assert out.responses()[i] == response, question
        assert out.loss_mask[i, :len(loss)].tolist() == loss and int(out.loss_mask[i, len(loss):].sum()) == 0
        assert out.finish_reason[i] == "stop"
    assert out.extras["turns"] == [2, 1, 2, 2, 2]
    assert out.extras["tool_calls"] == [{"calculator": 1}, {}, {"abacus": 1}, {"calculator": 1}, {"<malformed>": 1}]
    assert out.extras["tool_error_kinds"] == [{}, {}, {"unknown_tool": 1}, {"bad_arguments": 1}, {"malformed": 1}]
    assert out.extras["tool_valid_calls"] == [1, 0, 0, 0, 0]
    text = tok.decode(out.responses()[0])
    assert text == ('<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call><|end|>'
                    "<|tool|>408<|end|><|assistant|>#### 408<|end|>")


def test_turn_and_length_limits_end_a_trajectory(tool_model):
    from alignctl.rollout.engine import SamplingParams

    tok, _, rollout, prompts = _rollout(tool_model, max_turns=1)
    out = rollout.generate(prompts[:1], SamplingParams(n=1, greedy=True, max_new_tokens=256))
    # one turn allowed: the call is not run, nothing is inserted
    assert out.extras["turns"] == [1] and out.extras["tool_calls"] == [{}] and int(out.loss_mask.sum()) == len(out.responses()[0])
    _, _, short, prompts = _rollout(tool_model, budget=80)
    cut = short.generate(prompts[:1], SamplingParams(n=1, greedy=True, max_new_tokens=80))
    assert cut.finish_reason == ["length"] and len(cut.responses()[0]) == 80


def test_rollout_log_probs_equal_the_training_forward(tool_model):
    """Sampled multi-turn responses (temperature 1, n = 2): the engine's log-probs at sampling time
    and a full training forward over the assembled rows agree on every sampled token (fp32 CPU)."""
    from alignctl.models.forward import compute_log_probs
    from alignctl.rollout.engine import SamplingParams
    from alignctl.workers.sequences import assemble

    tok, model, rollout, prompts = _rollout(tool_model)
    out = rollout.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=256, seed=3))
    tensors = assemble(prompts, out, prompt_width=max(map(len, prompts)), response_width=256, pad_id=tok.pad_token_id)
    assert tensors["attention_mask"][:, -256:].sum() > tensors["response_mask"].sum()  # tool tokens attended, not trained
    with torch.no_grad():
        for packed in (False, True):
            logp = compute_log_probs(model, tensors["input_ids"], tensors["attention_mask"], 256,
                                     position_ids=tensors["position_ids"], temperature=1.0,
                                     use_remove_padding=packed).log_probs
            mask = tensors["response_mask"].bool()
            diff = (logp - tensors["rollout_log_probs"]).abs()[mask]
            assert float(diff.max()) < 1e-5, (packed, float(diff.max()))


def _timed(rollout, delay) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Record when the engine decodes and when the calculator runs; the calculator first sleeps
    ``delay()`` seconds (a slow tool: a subprocess, a remote service)."""
    import dataclasses

    decode_spans, tool_spans = [], []
    generate, tool = rollout.engine.generate, rollout.tools["calculator"]

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            decode_spans.append((start, time.perf_counter()))

    def slow_calculator(**arguments):
        start = time.perf_counter()
        time.sleep(delay())
        try:
            return tool.fn(**arguments)
        finally:
            tool_spans.append((start, time.perf_counter()))

    rollout.engine.generate = timed_generate
    rollout.tools["calculator"] = dataclasses.replace(tool, fn=slow_calculator)
    return decode_spans, tool_spans


def _overlapping(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def _overlap_s(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``spans`` that fall inside [start, end]."""
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


def test_lanes_decode_while_other_lanes_tools_run_and_change_no_token(tool_model):
    """Two lanes: the engine decodes one lane while the other lane's (slow) calculator call runs;
    one lane: decoding waits for every call. The conversations are token for token the same."""
    from alignctl.rollout.engine import SamplingParams

    params = SamplingParams(n=1, greedy=True, max_new_tokens=256)
    outs = {}
    for lanes in (1, 2):
        _, _, rollout, prompts = _rollout(tool_model, lanes=lanes)
        decode_spans, tool_spans = _timed(rollout, lambda: 0.3)
        outs[lanes] = rollout.generate(prompts, params)
        assert len(tool_spans) == 1  # TRACES has one valid calculator call (the others are refused before running)
        assert _overlapping(decode_spans, tool_spans) == (lanes == 2), lanes
        # The engine idles only for the part of the call it could not fill with decoding: with one lane
        # it waits out the whole 0.3 s; with two it waits at most the call minus the decoding done
        # meanwhile. (A bound, not "less than the one-lane wait": how much decoding fits into the call
        # depends on the machine's load, and under load the other lane's turn can be very short.)
        wait = outs[lanes].metrics["multi_turn/tool_wait_s"]
        (tool_start, tool_end), = tool_spans
        decoded_meanwhile = _overlap_s(decode_spans, tool_start, tool_end)
        if lanes == 1:
            assert decoded_meanwhile == 0.0 and wait >= 0.9 * 0.3, wait
        else:
            assert wait <= (tool_end - tool_start) - decoded_meanwhile + 0.05, (wait, decoded_meanwhile)
    one, two = outs[1], outs[2]
    assert two.responses() == one.responses()
    assert torch.equal(two.loss_mask, one.loss_mask) and two.finish_reason == one.finish_reason
    assert two.extras == one.extras


def test_a_seeded_rollout_with_lanes_does_not_depend_on_tool_timing(tool_model):
    """Sampled (temperature 1, n = 2) with three lanes and random tool delays: two runs are equal."""
    import random

    from alignctl.rollout.engine import SamplingParams

    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=256, seed=11)
    runs = []
    for run in range(2):
        _, _, rollout, prompts = _rollout(tool_model, lanes=3)
        jitter = random.Random(run)
        _timed(rollout, lambda: jitter.uniform(0.0, 0.15))
        runs.append(rollout.generate(prompts, params))
    assert runs[0].responses() == runs[1].responses()
    assert torch.equal(runs[0].log_probs, runs[1].log_probs) and torch.equal(runs[0].loss_mask, runs[1].loss_mask)
    assert runs[0].extras == runs[1].extras


# ------------------------------------------------------------------------------ flagged turns in a rollout


class _ScriptedPolicy:
    """A policy that writes given texts, turn after turn (token ids of a char tokenizer): the rollout's
    handling of what a model writes, without fitting a model to write it."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0
        self.pad_token_id = tokenizer.pad_token_id

    def generate(self, prompt_ids, params):
        from alignctl.rollout.engine import RolloutOutput

        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        rows = [ids for _ in prompt_ids for _ in range(params.n)]
        return RolloutOutput.from_ragged(rows, None, ["stop"] * len(rows), params.n, self.pad_token_id)

    def wake(self): ...
    def sleep(self): ...
    def sync_weights(self, weights=None): ...


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    from alignctl.models.loading import load_tokenizer
    from alignctl.models.tiny import init_model

    root = tmp_path_factory.mktemp("char")
    vocab = root / "vocab.jsonl"
    vocab.write_text(json.dumps({"text": "".join(chr(c) for c in range(32, 127)) + "\n"}) + "\n")
    init_model(out=root / "m", tokenizer_from=[vocab], hidden=16, layers=1, tokenizer_kind="char")
    return load_tokenizer(root / "m", padding_side="left")


@pytest.mark.parametrize(("first_turn", "why"), [
    # one good call and one without arguments: neither runs
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
     '<tool_call>{"name": "calculator"}</tool_call>', 'has no "arguments"'),
    ('<tool_call>{"name": "calculator", "arguments": {"x": ' + "[" * 3000, "nests deeper than"),  # no RecursionError
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}', "is not closed"),
])
def test_a_flagged_turn_runs_no_call_and_the_model_is_told(char_tokenizer, first_turn, why):
    from alignctl.rollout.engine import SamplingParams
    from alignctl.rollout.multi_turn import MultiTurnRollout

    policy = _ScriptedPolicy(char_tokenizer, [first_turn, "#### 42"])
    rollout = MultiTurnRollout(policy, char_tokenizer, ["calculator"], max_turns=3, max_response_length=20000,
                               stop_ids=[char_tokenizer.eos_token_id])
    prompt = list(char_tokenizer("q", add_special_tokens=False)["input_ids"])
    out = rollout.generate([prompt], SamplingParams(n=1, greedy=True, max_new_tokens=20000))
    assert out.extras["turns"] == [2]  # the model got an answer to its turn and wrote its final one
    assert out.extras["tool_calls"] == [{"<malformed>": 1}] and out.extras["tool_error_kinds"] == [{"malformed": 1}]
    assert out.extras["tool_valid_calls"] == [0]
    response = out.responses()[0]
    inserted = [t for t, m in zip(response, out.loss_mask[0].tolist()) if m == 0]
    told = char_tokenizer.decode(inserted)
    assert why in told and "no call of this turn ran" in told and "42" not in told  # 6*7 never ran


def test_a_tool_turn_that_fills_the_budget_exactly_ends_the_conversation(char_tokenizer):
    """The response budget used up to the last token by an inserted tool turn: the trajectory ends
    ('length') instead of asking the engine for 0 new tokens (tools_arith's GRPO stopped on that)."""
    from alignctl.rollout.engine import SamplingParams
    from alignctl.rollout.multi_turn import MultiTurnRollout

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    prompt = list(char_tokenizer("q", add_special_tokens=False)["input_ids"])

    def rollout(budget):
        policy = _ScriptedPolicy(char_tokenizer, [call, "#### 42"])
        return MultiTurnRollout(policy, char_tokenizer, ["calculator"], max_turns=3, max_response_length=budget,
                                stop_ids=[char_tokenizer.eos_token_id]).generate(
            [prompt], SamplingParams(n=1, greedy=True, max_new_tokens=budget))

    full = rollout(20000)
    inserted_end = full.loss_mask[0].tolist().index(1, full.loss_mask[0].tolist().index(0))  # the answer's start
    out = rollout(inserted_end)  # call + tool turn exactly fill the budget
    assert out.response_lengths.tolist() == [inserted_end] and out.finish_reason == ["length"]
    assert out.extras["turns"] == [1] and out.extras["tool_valid_calls"] == [1]


def test_a_fenced_example_is_no_call(char_tokenizer):
    from alignctl.rollout.engine import SamplingParams
    from alignctl.rollout.multi_turn import MultiTurnRollout

    example = 'Write:\n```\n<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>\n```\n'
    policy = _ScriptedPolicy(char_tokenizer, [example])
    rollout = MultiTurnRollout(policy, char_tokenizer, ["calculator"], max_turns=3, max_response_length=2000,
                               stop_ids=[char_tokenizer.eos_token_id])
    prompt = list(char_tokenizer("q", add_special_tokens=False)["input_ids"])
    out = rollout.generate([prompt], SamplingParams(n=1, greedy=True, max_new_tokens=2000))
    assert out.extras["turns"] == [1] and out.extras["tool_calls"] == [{}]  # the final answer, nothing ran


@pytest.mark.parametrize(("isolation", "sees_project"), [("none", "True"), ("bwrap", "False")])
def test_the_rollout_runs_the_python_tool_with_the_configured_isolation(char_tokenizer, isolation, sees_project):
    from alignctl.rollout.engine import SamplingParams
    from alignctl.rollout.multi_turn import MultiTurnRollout

    if isolation == "bwrap":
        bwrap_or_skip()
    project = str(Path(__file__).resolve().parents[1])
    code = f"import os; print(os.path.exists({project!r}))"
    policy = _ScriptedPolicy(char_tokenizer, [
        '<tool_call>{"name": "python", "arguments": {"code": ' + json.dumps(code) + '}}</tool_call>', "#### done"])
    rollout = MultiTurnRollout(policy, char_tokenizer, ["python"], max_turns=3, max_response_length=4000,
                               stop_ids=[char_tokenizer.eos_token_id], tool_settings={"isolation": isolation})
    prompt = list(char_tokenizer("q", add_special_tokens=False)["input_ids"])
    out = rollout.generate([prompt], SamplingParams(n=1, greedy=True, max_new_tokens=4000))
    inserted = [t for t, m in zip(out.responses()[0], out.loss_mask[0].tolist()) if m == 0]
    assert out.extras["tool_valid_calls"] == [1] and sees_project in char_tokenizer.decode(inserted)
