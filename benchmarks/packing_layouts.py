"""The three layouts of a forward pass (shared prompt, packed, padded) on this machine's device.

``use_remove_padding`` and ``share_prompt`` default to ``auto`` (``models.attention.resolve_packing``):
packed rows with shared prompts on a CPU, where the cost is the token count; padded batches with
torch's sdpa on a GPU without flash-attn, where the segment kernel's many small attention calls
cost more than the padding saves. This measures that choice: same process, same
SmolLM2-135M-shaped Llama (random weights: a pass costs the same whatever they are), the
quickstart's batch (8 prompts = a 24-token head + 37 tokens of their own, 4 responses of 26
tokens). Passes: no-grad log-probs of 32 responses, an actor forward + backward of 16, and a
reward-model step of 8 pairs (bottom 24 of 30 blocks frozen, bf16 autocast). Layouts alternate
(A B C A B C). "ours" is the layout ``auto`` picks on this device, the baseline the one it
passes over (padded on a CPU, shared prompt on a GPU); all three are printed.

Run: ``python benchmarks/packing_layouts.py [--quick] [--json out.json] [--threads N] [--device cpu|cuda]``.
Measured on one H200 (docs/results.md, "Packing on a GPU").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, summarize, time_interleaved  # noqa: E402
from shared_head import PROMPTS, RESPONSE_LEN, models, pairs, rl_batch  # noqa: E402

from alignctl.models import attention  # noqa: E402
from alignctl.models.forward import compute_log_probs  # noqa: E402
from alignctl.models.reward_forward import pair_prompt_lengths, score_padded, score_shared_prompts  # noqa: E402

LAYOUTS = ("shared prompt", "packed", "padded")


def synced(fn: Callable[[], None], device: str) -> Callable[[], None]:
    """``fn`` that returns only when the device has finished it (CUDA runs asynchronously)."""
    def run() -> None:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return run


def log_prob_pass(actor: Any, batch: tuple[torch.Tensor, ...], layout: str, grad: bool, rows: slice) -> Callable[[], None]:
    ids, mask, pos = batch

    def run() -> None:
        actor.set_attn_implementation("sdpa" if layout == "padded" else attention.SEGMENT_SDPA)
        with torch.set_grad_enabled(grad):
            out = compute_log_probs(actor, ids[rows], mask[rows], RESPONSE_LEN, position_ids=pos[rows],
                                    use_remove_padding=layout != "padded", share_prompt=layout == "shared prompt")
            if grad:
                out.log_probs.square().mean().backward()
    return run


def reward_step(reward: Any, layout: str, device: str) -> Callable[[], None]:
    seqs = pairs()

    def run() -> None:
        shared = layout == "shared prompt"
        reward.set_attn_implementation(attention.SEGMENT_SDPA if shared else "sdpa")
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
            scores = (score_shared_prompts(reward, seqs, pair_prompt_lengths(seqs), 0) if shared
                      else score_padded(reward, seqs, 0))
        torch.nn.functional.logsigmoid(scores[:PROMPTS] - scores[PROMPTS:]).mean().neg().backward()
    return run


def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    known, rest = extra.parse_known_args()
    args = parse_bench_args(__doc__.splitlines()[0], rest)
    device = known.device
    threads = set_threads(args.threads)
    layers = 4 if args.quick else 30
    parts = models(layers)
    actor, reward = parts["actor"].to(device), parts["reward"].to(device)
    batch = tuple(t.to(device) for t in rl_batch())
    packed = attention.resolve_packing(attention.AUTO, device=device)
    ours = "shared prompt" if attention.resolve_share_prompt(attention.AUTO, device=device, packing=packed) else (
        "packed" if packed else "padded")
    base = "padded" if ours != "padded" else "shared prompt"
    passes = {
        "no-grad log-probs, 32 responses": lambda layout: log_prob_pass(actor, batch, layout, False, slice(None)),
        "actor forward + backward, 16 responses": lambda layout: log_prob_pass(actor, batch, layout, True, slice(0, 16)),
        "reward-model step, 8 pairs": lambda layout: reward_step(reward, layout, device),
    }
    records = []
    for name, make in passes.items():
        layouts = LAYOUTS if "reward" not in name else ("shared prompt", "padded")
        times = time_interleaved({layout: synced(make(layout), device) for layout in layouts},
                                 warmup=1 if args.quick else 2, repeats=1 if args.quick else 5)
        medians = {layout: summarize(times[layout]["wall"])["median"] for layout in layouts}
        setup = {"device": device, "layers": layers, "ours": ours, "baseline": base, "threads": threads,
                 **{f"s/{layout}": round(value, 4) for layout, value in medians.items()}}
        records.append(report(f"{name}: auto's layout ({ours}) vs {base}", medians[ours], medians[base], "s per pass",
                              setup, higher_is_better=False))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
