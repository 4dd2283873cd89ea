"""``tools-arith``: multi-digit products that call for a calculator.

    What is 482 * 917? Answer after "####".
    -> <tool_call>{"name": "calculator", "arguments": {"expression": "482 * 917"}}</tool_call>
       [tool] 441994
       #### 441994

Files (the test questions never appear in any train file):
- ``train.parquet`` / ``test.parquet``: RL prompts, ground truth = the product (``data_source``
  ``arith``, so the GSM8K-style ``#### N`` rule scores them);
- ``sft_train.parquet``: tool-use traces (a calculator call that copies the two numbers, the
  calculator's own result, then ``#### product``) on their own questions, optionally with fewer
  digits (``tools_arith.sft_digits``) so SFT teaches the call format without solving the RL task.
"""

from __future__ import annotations

import json
import random
from typing import Any

from alignctl.config.preprocess import ToolsArithConfig
from alignctl.data.preprocess.common import Context
from alignctl.data.readers import Record
from alignctl.data.schema import assistant, user
from alignctl.errors import UserError

DATA_SOURCE = "arith"
INSTRUCTION = 'Answer after "####".'


def check_config(cfg: ToolsArithConfig) -> None:
    for key in ("num_train", "num_test", "num_sft"):
        if getattr(cfg, key) < 1:
            raise UserError(f"key 'tools_arith.{key}' expected a positive integer, got {getattr(cfg, key)}")
    for key in ("digits", "sft_digits"):
        if not 1 <= getattr(cfg, key) <= 9:
            raise UserError(f"key 'tools_arith.{key}' expected an integer in 1..9, got {getattr(cfg, key)}")
    space = (9 * 10 ** (cfg.digits - 1)) ** 2
    if cfg.num_train + cfg.num_test > space // 2:
        raise UserError(f"keys 'tools_arith.num_train'/'num_test': {cfg.num_train + cfg.num_test} questions asked "
                        f"but only {space} {cfg.digits}-digit pairs exist; ask for fewer or raise tools_arith.digits")


def draw(rng: random.Random, count: int, digits: int, avoid: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """``count`` distinct operand pairs with ``digits`` digits each, none of them in ``avoid``."""
    low, high = 10 ** (digits - 1), 10 ** digits - 1
    out: list[tuple[int, int]] = []
    while len(out) < count:
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in avoid:
            avoid.add(pair)
            out.append(pair)
    return out


def _prompt(a: int, b: int) -> list[dict[str, str]]:
    return [user(f"What is {a} * {b}? {INSTRUCTION}")]


def rl_row(a: int, b: int) -> dict[str, Any]:
    return {"data_source": DATA_SOURCE, "prompt": _prompt(a, b), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a * b)}, "extra_info": {"question": f"{a} * {b}"}}


def call_text(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def sft_row(a: int, b: int) -> dict[str, Any]:
    from alignctl.tools.calculator import calculator

    expression = f"{a} * {b}"
    result = calculator(expression=expression)  # the tool's own output, as the rollout will insert it
    completion = [assistant(call_text(expression)), {"role": "tool", "content": result},
                  assistant(f"#### {a * b}")]
    return {"data_source": DATA_SOURCE, "prompt": _prompt(a, b), "completion": completion,
            "extra_info": {"question": expression}}


def build(ctx: Context) -> None:
    cfg, opts = ctx.cfg, ctx.cfg.tools_arith
    check_config(opts)
    ctx.refuse_source_keys("tools_arith.num_test")
    rng = random.Random(f"tools-arith:{cfg.seed}")
    seen: set[tuple[int, int]] = set()
    test = draw(rng, opts.num_test, opts.digits, seen)
    train = draw(rng, opts.num_train, opts.digits, seen)
    sft = draw(rng, opts.num_sft, opts.sft_digits, seen)
    for filename, kind, split, pairs, make in (("train.parquet", "rl", "train", train, rl_row),
                                               ("test.parquet", "rl", "test", test, rl_row),
                                               ("sft_train.parquet", "sft", "train", sft, sft_row)):
        rows: list[Record] = []
        for i, (a, b) in enumerate(ctx.track(pairs, f"tools-arith {filename}")):
            ctx.emit(kind, f"tools-arith {filename} #{i}", make(a, b), rows, split)
        ctx.write(filename, kind, split, rows)
