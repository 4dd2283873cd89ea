"""Multi-turn rollouts with a slow tool: lanes (the engine decodes one group of prompts while the
tool calls of the others run) vs one batch per turn (decoding waits for the slowest call), in the
same run, on the same model and prompts.

The tool is the calculator behind a fixed delay per call (``--latency``, seconds), standing in for
a subprocess or a remote service; the rollout is greedy so both sides do the same decoding work
(the script counts the rows whose tokens differ: lanes pad each group to its own longest prompt,
which changes rounding, so a greedy pick can flip; it refuses to report when the two sides' response
lengths differ by more than 5%). The model is a tool-using model: by default the tiny model
fitted to the tool traces of the test suite (tests/tool_helpers.py, built in a temporary folder);
``--model DIR --data PARQUET`` takes a real one, e.g. the SFT stage of pipelines/tools_arith.yaml
with its test.parquet.

Reported: median wall seconds per rollout of each side (ratio > 1: lanes are faster) and the seconds
the engine sat idle waiting for tools (``multi_turn/tool_wait_s``).

    python benchmarks/multi_turn_overlap.py [--quick] [--lanes 2] [--latency 0.5] [--json OUT]
    python benchmarks/multi_turn_overlap.py --model work/tools_arith/sft --data work/tools_arith/data/test.parquet
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, set_threads  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and repeats (smoke run)")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the result as JSON to OUT")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch intra-op threads")
    parser.add_argument("--model", default=None, help="a tool-using model folder (default: the tiny fitted one)")
    parser.add_argument("--data", default=None, help="parquet with a chat 'prompt' column (with --model)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per rollout")
    parser.add_argument("--lanes", type=int, default=2, help="lanes on our side (the baseline has 1)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds each tool call takes")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def load_model_and_prompts(args: argparse.Namespace, scratch: Path) -> tuple[Any, Any, list[list[int]]]:
    import pandas as pd
    from transformers import AutoModelForCausalLM

    from alignctl.models.loading import load_tokenizer
    from alignctl.tools import tool_schemas
    from alignctl.tools.chat import render_prompt

    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tool_helpers import make_tool_model

        built = make_tool_model(scratch)
        args.model, args.data = str(built["model"]), str(built["data"])
    tokenizer = load_tokenizer(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    frame = pd.read_parquet(args.data)
    messages = [list(m) for m in frame["prompt"]]
    messages = (messages * (args.prompts // len(messages) + 1))[:args.prompts]
    schemas = tool_schemas(["calculator"])
    return model, tokenizer, [render_prompt(tokenizer, [dict(x) for x in m], schemas) for m in messages]


def make_rollout(model: Any, tokenizer: Any, lanes: int, latency: float, budget: int) -> Any:
    from alignctl.rollout.hf_engine import HFRolloutEngine
    from alignctl.rollout.multi_turn import MultiTurnRollout
    from alignctl.workers.model_setup import eos_ids

    stop = eos_ids(tokenizer, model)  # the stop ids the actor uses
    engine = HFRolloutEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_id=list(stop))
    rollout = MultiTurnRollout(engine, tokenizer, ["calculator"], max_turns=3, max_response_length=budget,
                               stop_ids=stop, lanes=lanes)
    calculator = rollout.tools["calculator"]

    def slow_calculator(**arguments: Any) -> str:
        time.sleep(latency)
        return calculator.fn(**arguments)

    rollout.tools["calculator"] = dataclasses.replace(calculator, fn=slow_calculator)
    return rollout


def main() -> None:
    args = parse_args()
    set_threads(args.threads)
    if args.quick:
        args.prompts, args.repeats = min(args.prompts, 8), 2
    from alignctl.rollout.engine import SamplingParams

    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer, prompts = load_model_and_prompts(args, Path(scratch))
    params = SamplingParams(n=1, greedy=True, max_new_tokens=args.max_new_tokens)
    sides = {"lanes": make_rollout(model, tokenizer, args.lanes, args.latency, args.max_new_tokens),
             "one batch": make_rollout(model, tokenizer, 1, args.latency, args.max_new_tokens)}
    wall: dict[str, list[float]] = {name: [] for name in sides}
    wait: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, Any] = {}
    for _ in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, rollout in sides.items():
            start = time.perf_counter()
            outputs[name] = rollout.generate(prompts, params)
            wall[name].append(time.perf_counter() - start)
            wait[name].append(outputs[name].metrics["multi_turn/tool_wait_s"])
    ours, base = outputs["lanes"].responses(), outputs["one batch"].responses()
    differing = sum(a != b for a, b in zip(ours, base))
    tokens = {name: sum(map(len, out.responses())) for name, out in outputs.items()}
    calls = sum(sum(c.values()) for c in outputs["lanes"].extras["tool_calls"])
    for name in sides:
        print(f"{name:>9}: wall {statistics.median(wall[name][1:]):.3f} s, engine waiting for tools "
              f"{statistics.median(wait[name][1:]):.3f} s (median of {args.repeats}), {tokens[name]} response tokens")
    # Lanes pad each group to its own longest prompt: rounding differs, and a greedy pick can flip.
    print(f"rows with different tokens: {differing} of {len(ours)}; tool calls per rollout (lanes): {calls}")
    if abs(tokens["lanes"] - tokens["one batch"]) > 0.05 * tokens["one batch"]:
        raise SystemExit("the two sides produced response lengths more than 5% apart: the comparison is void")
    report("multi_turn_overlap", statistics.median(wall["lanes"][1:]), statistics.median(wall["one batch"][1:]),
           "s/rollout", {"prompts": len(prompts), "lanes": args.lanes, "latency_s": args.latency,
                         "model": args.model, "tool_calls": calls,
                         "rows_differing": differing}, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
