"""Learning to use a calculator: 3-digit x 3-digit products, tiny model, multi-turn GRPO.

    .venv/bin/python scripts/tools_arith_demo.py [--seeds 1 2 3] [--sft-steps 400] [--grpo-steps 60]

Per seed:

1. Data: questions "What is A * B?" (A, B in 100..999), 2000 for RL, 200 held out.
2. A char-level tiny model (4 layers, hidden 128), fitted for ``--sft-steps`` batches of 16 on
   tool-use traces (a calculator call that copies the two numbers, the real tool result, then
   ``#### product``) built with the same pieces the rollout uses; loss on the model's own turns
   only. Its chat template renders the tool list in a few characters (``tools: calculator``).
3. ``alignctl grpo`` with multi-turn rollouts and the calculator: the strict ``#### N`` reward,
   validation on the held-out questions before and after (greedy, with the tool).
4. ``alignctl eval`` of the GRPO policy without tools (single-turn, the prompt has no tool list).

Prints one JSON line per seed: held-out accuracy with tools after SFT and after GRPO, without
tools after GRPO, the share of valid calls, turns per sample and the wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
ALIGNCTL = str(ROOT / ".venv" / "bin" / "alignctl")
COMPACT_TOOLS = ("{%- if tools %}{{ '<|system|>tools: ' }}{% for t in tools %}{{ t['function']['name'] + ' ' }}"
                 "{% endfor %}{{ '<|end|>' }}{%- endif %}")
CALL = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}</tool_call>'


def questions(seed: int, count: int, avoid: set[tuple[int, int]], digits: int = 3) -> list[tuple[int, int]]:
    from alignctl.data.preprocess.tools_arith import draw

    return draw(random.Random(f"tools-arith:{seed}:{count}:{digits}"), count, digits, avoid)


def prompt_rows(pairs: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"data_source": "arith", "prompt": [{"role": "user", "content": f"What is {a} * {b}?"}],
                          "reward_model": {"style": "rule", "ground_truth": str(a * b)}, "extra_info": {"index": i}}
                         for i, (a, b) in enumerate(pairs)])


def fit_on_traces(root: Path, pairs: list[tuple[int, int]], steps: int, seed: int) -> Path:
    """A tiny model fitted to tool-use traces; returns its folder."""
    from transformers import AutoModelForCausalLM

    from alignctl.models.loading import load_tokenizer
    from alignctl.models.tiny import init_model
    from alignctl.tools import ToolResult, tool_schemas
    from alignctl.tools.calculator import calculator
    from alignctl.tools.chat import ToolTurns, render_prompt

    vocab = root / "vocab.jsonl"
    schemas = tool_schemas(["calculator"])
    texts = ["tools: calculator", CALL.format(a=123, b=456), "What is 0123456789 * ?####"]
    vocab.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    init_model(out=root / "base", tokenizer_from=[vocab], hidden=128, layers=4, heads=4, tokenizer_kind="char",
               seed=seed, max_position_embeddings=1024)
    tok = load_tokenizer(root / "base", padding_side="left")
    # A template that renders the tool list itself, in a few characters: the generic system message
    # (the JSON schemas, ~400 characters) would triple every sequence of a character-level model.
    tok.chat_template = COMPACT_TOOLS + tok.chat_template
    tok.save_pretrained(root / "base")
    eos = int(tok.eos_token_id)
    turns = ToolTurns(tok, (eos,))

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"]) + [eos]

    rows = []
    for a, b in pairs:
        prompt = render_prompt(tok, [{"role": "user", "content": f"What is {a} * {b}?"}], schemas)
        call, answer = encode(CALL.format(a=a, b=b)), encode(f"#### {a * b}")
        inserted = turns.ids([ToolResult("calculator", calculator(expression=f"{a} * {b}"), True, 0.0)])
        rows.append((prompt, call + inserted + answer, [1] * len(call) + [0] * len(inserted) + [1] * len(answer)))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(root / "base")
    optim = torch.optim.AdamW(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = [rows[i] for i in torch.randint(len(rows), (16,), generator=gen).tolist()]
        width = max(len(p) + len(r) for p, r, _ in batch)
        ids = torch.full((len(batch), width), int(tok.pad_token_id))
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, r, loss) in enumerate(batch):
            ids[i, :len(p) + len(r)] = torch.tensor(p + r)
            mask[i, :len(p) + len(r)] = 1
            labels[i, len(p):len(p) + len(r)] = torch.tensor([t if m else -100 for t, m in zip(r, loss)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    model.save_pretrained(root / "sft")
    tok.save_pretrained(root / "sft")
    return root / "sft"


def grpo(root: Path, model: Path, train: Path, test: Path, seed: int, steps: int, lr: float) -> list[dict]:
    run = root / "grpo"
    args = [ALIGNCTL, "grpo", f"actor_rollout_ref.model.path={model}", f"data.train_files=[{train}]",
            f"data.val_files=[{test}]", f"trainer.run_dir={run}", "data.train_batch_size=16",
            "data.max_prompt_length=1024", "data.max_response_length=160", "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", f"actor_rollout_ref.actor.optim.lr={lr}",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.max_turns=3",
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={max(1, steps // 3)}",
            "trainer.n_gpus_per_node=2", "trainer.logger=[jsonl]", f"trainer.seed={seed}",
            "trainer.stop_on_flat_reward=false"]
    subprocess.run(args, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def no_tools_accuracy(root: Path, policy: Path, test: Path) -> float:
    out = root / "eval"
    subprocess.run([ALIGNCTL, "eval", "--policy", str(policy), "--prompts", str(test), "--out", str(out),
                    "max_new_tokens=160"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((out / "results.json").read_text())
    return float(results["accuracy"]["arith"]["pass@1"])


def run_seed(seed: int, sft_steps: int, grpo_steps: int, sft_digits: int, lr: float, keep: Path | None = None) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="alignctl-tools-") as name:
        root = Path(name) if keep is None else keep / f"seed{seed}"
        root.mkdir(parents=True, exist_ok=True)
        test_pairs = questions(seed, 200, set())
        train_pairs = questions(seed + 1000, 2000, set(test_pairs))
        prompt_rows(train_pairs).to_parquet(root / "train.parquet")
        prompt_rows(test_pairs).to_parquet(root / "test.parquet")
        # --sft-digits 2 teaches the call format on smaller numbers; RL and the held-out test use 3 digits.
        sft = fit_on_traces(root, questions(seed + 2000, 2000, set(), sft_digits), sft_steps, seed)
        rows = grpo(root, sft, root / "train.parquet", root / "test.parquet", seed, grpo_steps, lr)
        val = [r for r in rows if "val-core/arith/acc/mean@1" in r]
        train = [r for r in rows if "multi_turn/valid_call_share" in r]
        without = no_tools_accuracy(root, root / "grpo" / "actor", root / "test.parquet")
    return {"seed": seed, "with_tools_sft": val[0]["val-core/arith/acc/mean@1"],
            "with_tools_grpo": val[-1]["val-core/arith/acc/mean@1"], "without_tools_grpo": without,
            "curve": [(r["step"], round(r["val-core/arith/acc/mean@1"], 3)) for r in val],
            "valid_call_share_last": train[-1]["multi_turn/valid_call_share"],
            "turns_last": train[-1]["multi_turn/turns_mean"], "wall_s": round(time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--grpo-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=2e-4, help="GRPO learning rate (5e-4 collapsed 3 of 6 runs)")
    parser.add_argument("--keep", type=Path, help="write each seed's data, models and runs here (kept)")
    parser.add_argument("--sft-digits", type=int, default=3, help="operand digits of the SFT traces (2: the "
                                                                  "format on easier numbers; 0.0 on 3 digits after)")
    args = parser.parse_args()
    for seed in args.seeds:
        print(json.dumps(run_seed(seed, args.sft_steps, args.grpo_steps, args.sft_digits, args.lr, args.keep)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
