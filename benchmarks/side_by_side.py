"""Two jobs side by side on one core each against one after the other on every core (``cpu_share``).

What ``cpu_share: 0.5`` bets on (pipeline/concurrent.py): on a few CPU cores torch splits each small
matrix product of a decode step or a micro-batch over its threads at a cost, so two independent jobs,
each held to its own core, are done sooner than the same two in turn on all the cores.

A job is the RL step's two kinds of work on a randomly initialised Llama with SmolLM2-135M-Instruct's
shape (the cost does not depend on the weights): the hf engine samples n=4 responses of 40 tokens for 8
prompts of 60 tokens (fixed seed, no stop token), then one training pass (forward and backward) over 16
rows of 100 tokens, loss on the last 40 positions. Every job runs in a fresh process that builds its
model, waits on a barrier, then is timed:

  * baseline: two jobs one after the other in one process on every core (what ``--sequential`` does);
  * ours: two processes at once, each pinned to one core (``cores.pin_to_cores``), the wall time until
    both are done.

Ratios are baseline / ours (above 1: side by side is faster). Needs 2 cores.

Run: ``python benchmarks/side_by_side.py [--quick] [--json out.json]``.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, smollm2_config  # noqa: E402

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN, TRAIN_ROWS, TRAIN_LEN = 8, 4, 60, 40, 16, 100


def _job(layers: int, cores: list[int], repeats: int, barrier: Any, out: Any) -> None:
    from alignctl.cores import pin_to_cores

    pin_to_cores(cores)
    import torch
    from transformers import LlamaForCausalLM

    from alignctl.cpu_heap import keep_freed_memory
    from alignctl.rollout import SamplingParams, get_rollout_engine

    keep_freed_memory()  # as the RL workers run
    torch.manual_seed(0)
    model = LlamaForCausalLM(smollm2_config(layers))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (PROMPT_LEN,), generator=gen).tolist() for _ in range(PROMPTS)]
    rows = torch.randint(3, 49152, (TRAIN_ROWS, TRAIN_LEN), generator=gen)
    engine = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2)
    sampling = SamplingParams(n=N, temperature=1.0, max_new_tokens=RESPONSE_LEN, seed=0, stop_token_ids=())

    def work() -> dict[str, float]:
        t0 = time.perf_counter()
        engine.generate(prompts, sampling)
        t1 = time.perf_counter()
        logits = model(input_ids=rows).logits[:, -RESPONSE_LEN:]
        torch.log_softmax(logits.float(), -1).amax(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        return {"rollout": t1 - t0, "train": time.perf_counter() - t1}

    work()  # warm-up (first-touch pages, kernels)
    barrier.wait()
    start = time.perf_counter()
    parts = [work() for _ in range(repeats)]
    out.put({"wall": time.perf_counter() - start, "rollout": sum(p["rollout"] for p in parts),
             "train": sum(p["train"] for p in parts), "threads": torch.get_num_threads()})


def _run(layers: int, placements: list[tuple[list[int], int]]) -> list[dict[str, float]]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(placements)), ctx.Queue()
    procs = [ctx.Process(target=_job, args=(layers, cores, repeats, barrier, out)) for cores, repeats in placements]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return results


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    from alignctl.cores import available_core_ids

    cores = available_core_ids()
    if len(cores) < 2:
        raise SystemExit("side_by_side.py needs 2 cores")
    layers = 4 if args.quick else 30
    sequential = _run(layers, [(cores[:2], 2)])[0]  # two jobs in turn, on both cores
    side = _run(layers, [([cores[0]], 1), ([cores[1]], 1)])  # one job on each core, at once
    ours = max(r["wall"] for r in side)
    for label, row in [("in turn, 2 threads (both jobs)", sequential)] + [
            (f"side by side, job {i} on 1 core", r) for i, r in enumerate(side)]:
        print(f"{label}: wall {row['wall']:.2f} s (rollout {row['rollout']:.2f} s, train pass {row['train']:.2f} s, "
              f"{row['threads']} threads)")
    report("two RL-shaped jobs: side by side on 1 core each vs in turn on 2 cores", ours, sequential["wall"], "s",
           {"layers": layers, "prompts": PROMPTS, "n": N, "response_len": RESPONSE_LEN, "train_rows": TRAIN_ROWS,
            "train_len": TRAIN_LEN}, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
