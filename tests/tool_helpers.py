"""A tiny model that has learned to use tools, for multi-turn tests.

The traces are built with the real pieces the rollout uses (the prompt with the tool list, the
call parser, ``run_tool``, the template's tool-turn ids), so the inserted tokens are exactly what a
rollout inserts. A 2-layer char-level model is then fitted to them (loss on the model's own turns
only) until greedy decoding reproduces every trace: one valid calculator call, a direct answer, an
unknown tool, a wrongly typed argument and malformed JSON.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import pandas as pd
import torch

CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'
# question -> (first turn, final answer after the tool message, or None when the first turn answers)
TRACES = {
    "What is 12*34?": (CALL.format(name="calculator", args='{"expression": "12*34"}'), "#### 408"),
    "What is 7+8?": ("#### 15", None),
    "Use the abacus on 3+4.": (CALL.format(name="abacus", args="{}"), "#### 7"),
    "Typed call for 5*6.": (CALL.format(name="calculator", args='{"expression": 30}'), "#### 30"),
    "Broken call for 2*2.": ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "#### 4"),
}
ANSWERS = {"What is 12*34?": "408", "What is 7+8?": "15", "Use the abacus on 3+4.": "7",
           "Typed call for 5*6.": "30", "Broken call for 2*2.": "4"}


def _vocabulary_file(root: Path) -> Path:
    from alignctl.tools import tool_schemas
    from alignctl.tools.chat import tools_system_text

    texts = [tools_system_text(tool_schemas(["calculator"])), "error: unknown tool bad_arguments timed out",
             "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,:;!?'\"{}[]()<>/*+-=_#|\\\n"]
    texts += [q for q in TRACES] + [t for pair in TRACES.values() for t in pair if t]
    path = root / "vocab.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def trace_ids(tokenizer, question: str, stop_ids: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, loss mask) of one trace, built as the rollout builds them."""
    from alignctl.tools import parse_tool_calls, run_tool, tool_schemas
    from alignctl.tools.tool import TOOLS
    from alignctl.tools.chat import ToolTurns, render_prompt

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [stop_ids[0]]

    prompt = render_prompt(tokenizer, [{"role": "user", "content": question}], tool_schemas(["calculator"]))
    first, final = TRACES[question]
    response, loss = encode(first), [1] * len(encode(first))
    if final is not None:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = []
            for call in parse_tool_calls(first):
                if call.error:
                    from alignctl.tools.tool import ToolResult

                    results.append(ToolResult(call.name, f"error: {call.error}", False, 0.0, "malformed"))
                else:
                    tool = TOOLS.get(call.name) if call.name in TOOLS else None
                    results.append(run_tool(tool, call.name, call.arguments, pool))
        inserted = ToolTurns(tokenizer, stop_ids).ids(results)
        answer = encode(final)
        response += inserted + answer
        loss += [0] * len(inserted) + [1] * len(answer)
    return prompt, response, loss


def make_tool_model(root: Path, *, steps: int = 400, hidden: int = 64, heads: int | None = None) -> dict[str, Path]:
    """``{"model": folder, "data": train.parquet}``: the fitted model and RL prompts of the traces."""
    from transformers import AutoModelForCausalLM

    from alignctl.models.loading import load_tokenizer
    from alignctl.models.tiny import init_model

    root.mkdir(parents=True, exist_ok=True)
    base = root / "base"
    init_model(out=base, tokenizer_from=[_vocabulary_file(root)], hidden=hidden, layers=2, heads=heads,
               tokenizer_kind="char", seed=0)
    tokenizer = load_tokenizer(base, padding_side="left")
    stop = (int(tokenizer.eos_token_id),)
    rows = [trace_ids(tokenizer, q, stop) for q in TRACES]
    width = max(len(p) + len(r) for p, r, _ in rows)
    ids = torch.full((len(rows), width), int(tokenizer.pad_token_id))
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r, loss) in enumerate(rows):
        seq = p + r
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, len(p):len(seq)] = torch.tensor([t if m else -100 for t, m in zip(r, loss)])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert loss.item() < 0.01, f"the tool traces were not learned (loss {loss.item():.4f})"
    out = root / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    data = root / "train.parquet"
    pd.DataFrame([{"data_source": "arith", "prompt": [{"role": "user", "content": q}],
                   "reward_model": {"style": "rule", "ground_truth": ANSWERS[q]}, "extra_info": {"index": i}}
                  for i, q in enumerate(TRACES)] * 2).to_parquet(data)
    return {"model": out, "data": data}
