"""An actor update with the RL workers' heap reuse (alignctl/workers/heap.py) vs glibc's defaults.

Same process, same SmolLM2-135M-shaped Llama (hidden 576, 30 layers, vocab 49152; random weights),
same batch as ``ppo_step_passes.py`` (8 prompts x 4 responses, prompts of 60 tokens, responses of
26, each prompt computed once for its responses): one actor update = two micro-batches of 16
responses, each a packed forward with log-probs and entropy, a backward and an AdamW step (lr 0, so
every repeat sees the same model). The sides alternate (A B A B) and switch malloc's settings
before each call:

  * ours: ``keep_freed_memory()``, what every RL worker does at start (no mmap, no heap trimming);
  * baseline: glibc's settings as they stand in a long-running process that frees large blocks
    (its dynamic mmap threshold has grown to its 32 MB cap and the trim threshold to twice that),
    after ``malloc_trim(0)`` hands the heap's free memory back. Tensors above 32 MB, such as the
    [response tokens, vocab] float32 logits (80 MB here), are then fresh mmaps whose pages fault in.

The ratio is baseline time / ours. Linux with glibc only.

Run: ``python benchmarks/heap_reuse.py [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, summarize, time_interleaved  # noqa: E402
from ppo_step_passes import MINI, RESPONSE_LEN, batch, models  # noqa: E402

from alignctl.models.forward import compute_log_probs  # noqa: E402
from alignctl.workers import heap  # noqa: E402

M_MMAP_THRESHOLD = -3
STEADY_MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
DEFAULT_MMAP_MAX = 65536


def glibc_steady_defaults() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt(heap.M_MMAP_MAX, DEFAULT_MMAP_MAX)
    libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
    libc.mallopt(heap.M_TRIM_THRESHOLD, 2 * STEADY_MMAP_THRESHOLD)
    libc.malloc_trim(0)


def update(actor: Any, setting: Callable[[], object]) -> Callable[[], None]:
    ids, mask, pos = batch()
    optim = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=0.0, weight_decay=0.0)

    def run() -> None:
        setting()
        for start in range(0, len(ids), MINI):
            rows = slice(start, start + MINI)
            optim.zero_grad(set_to_none=True)
            out = compute_log_probs(actor, ids[rows], mask[rows], RESPONSE_LEN, position_ids=pos[rows],
                                    share_prompt=True, compute_entropy=True)
            out.log_probs.square().mean().backward()
            optim.step()

    return run


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    if not sys.platform.startswith("linux") or not heap.keep_freed_memory():
        raise SystemExit("heap_reuse.py needs Linux with glibc (mallopt)")
    threads = set_threads(args.threads)
    layers = 4 if args.quick else 30
    actor = models(layers, 0)["actor"]
    sides = {"ours": update(actor, heap.keep_freed_memory), "baseline": update(actor, glibc_steady_defaults)}
    times = time_interleaved(sides, warmup=1, repeats=1 if args.quick else 4)
    ours, base = (summarize(times[side]["wall"])["median"] for side in ("ours", "baseline"))
    setup = {"layers": layers, "micro_batches": 2, "micro_batch": MINI, "response_len": RESPONSE_LEN, "threads": threads}
    report("actor update: heap reuse vs glibc defaults", ours, base, "s per update", setup,
           higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
