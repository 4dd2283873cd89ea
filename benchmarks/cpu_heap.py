"""Kept heap memory (``alignctl.cpu_heap``, what every CPU stage does) vs glibc's defaults: CPU training steps.

The work is the quickstart's actor update on a SmolLM2-135M-shaped Llama (hidden 576, 30 layers,
vocab 49152, random weights: the cost does not depend on them): per step, two micro-batches of 16
sequences (4 prompts of 60 tokens sharing their prompt, 4 responses of 40 tokens each), forward +
backward of ``compute_log_probs`` and one AdamW step each.

The setting is process-wide and glibc cannot undo it exactly (any ``mallopt`` call also stops its
adaptive mmap threshold), so each side runs in its own child process: the script starts the children
itself, alternating (system, kept, system, kept, ...) so a load change hits both sides alike, and
prints the median step time of each side, the ratio (system / kept), page faults per step and the
children's peak RSS. It also checks that both sides computed the same losses to the last bit (the
setting changes where buffers live, not the arithmetic) and exits 1 if they did not.

Run: ``python benchmarks/cpu_heap.py [--quick] [--json out.json] [--threads N]``
(default: 2 threads, 3 children per side, 4 timed steps each after one warm-up step).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, smollm2_config, summarize  # noqa: E402

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN, MICRO_BATCHES = 4, 4, 60, 40, 2
CHILD_FLAG = "--child"


def child(layers: int, steps: int, threads: int) -> dict[str, Any]:
    """One side: the timed steps of this process (its heap setting comes from the environment)."""
    import torch
    from transformers import LlamaForCausalLM

    from alignctl.cpu_heap import keep_freed_memory
    from alignctl.models.forward import compute_log_probs

    kept = keep_freed_memory()  # False on the system side: ALIGNCTL_CPU_HEAP=system
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM(smollm2_config(layers)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(MICRO_BATCHES):
        prompts = torch.randint(3, 49152, (PROMPTS, PROMPT_LEN), generator=gen).repeat_interleave(N, dim=0)
        responses = torch.randint(3, 49152, (PROMPTS * N, RESPONSE_LEN), generator=gen)
        batches.append(torch.cat([prompts, responses], dim=1))

    def step() -> float:
        total = 0.0
        for ids in batches:
            out = compute_log_probs(model, ids, torch.ones_like(ids), RESPONSE_LEN, share_prompt=True)
            loss = -out.log_probs.mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            total += float(loss)
        return total

    losses, times, faults = [step()], [], []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"kept": kept, "times": times, "faults": faults, "losses": losses,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_side(side: str, layers: int, steps: int, threads: int) -> dict[str, Any]:
    env = {**os.environ, "ALIGNCTL_CPU_HEAP": side}
    cmd = [sys.executable, __file__, CHILD_FLAG, str(layers), str(steps), str(threads)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"cpu_heap benchmark: the {side} child failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = args.threads or 2
    layers, steps, children = (2, 2, 1) if args.quick else (30, 4, 3)
    results: dict[str, list[dict[str, Any]]] = {"system": [], "keep": []}
    for _ in range(children):
        for side in results:
            results[side].append(run_side(side, layers, steps, threads))
    if not all(r["kept"] for r in results["keep"]) or any(r["kept"] for r in results["system"]):
        raise SystemExit("cpu_heap benchmark: the kept side could not set the heap (not glibc?)")
    losses = {side: {tuple(r["losses"]) for r in runs} for side, runs in results.items()}
    if len(losses["system"] | losses["keep"]) != 1:
        print(f"losses differ between the sides: {losses}")
        raise SystemExit(1)
    median = {side: summarize([t for r in runs for t in r["times"]])["median"] for side, runs in results.items()}
    for side, runs in results.items():
        per_step = summarize([f for r in runs for f in r["faults"]])["median"]
        peak = max(r["peak_rss_mb"] for r in runs)
        print(f"{side:>6}: median step {median[side]:.3f} s, {per_step:,.0f} page faults per step, peak RSS {peak:,.0f} MB")
    print("losses identical on both sides:", losses["keep"].pop()[:3], "...")
    setup = {"layers": layers, "prompts": PROMPTS, "n": N, "prompt_len": PROMPT_LEN, "response_len": RESPONSE_LEN,
             "micro_batches": MICRO_BATCHES, "threads": threads, "children_per_side": children, "steps": steps}
    report("cpu_heap: actor update, kept heap vs glibc defaults", median["keep"], median["system"], "s per step",
           setup, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    else:
        main()
