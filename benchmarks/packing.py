"""Packed vs padded micro-batches: forward + backward tokens/s of the response log-prob pass.

Same model, same samples, same loss. A ~5M-parameter Llama (vocab 4096, hidden 256, 4 layers);
prompts of 32 tokens, responses uniform in [16, 256] tokens, laid out as verl does (every row
padded to 32 + 256 columns).

- baseline ("padded"): fixed micro-batches of 8 rows, full padded width, ``use_remove_padding=False``;
- ours ("packed"): token-budgeted micro-batches (budget = the padded micro-batch's 8 x 288 slots,
  balanced by Karmarkar-Karp), pads removed, sequences packed into one row per micro-batch,
  isolated by segment-wise sdpa (``alignctl_segment_sdpa``).

Both run with one torch thread by default (``--threads N`` to change): the dev machine's 2 cores
are shared, and a descheduled second thread stalls every parallel region, which hits the packed
path's many small segment kernels hardest and measures the neighbours rather than the code.

The block-diagonal 4D-mask variant (any attention implementation) is timed too and reported in
``setup``: its attention costs the whole packed row, so it gains less.

    python benchmarks/packing.py [--quick] [--json OUT] [--threads N]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse_bench_args, report, set_threads, summarize, time_interleaved  # noqa: E402

from alignctl.models.forward import compute_log_probs  # noqa: E402
from alignctl.models.microbatch import dynamic_micro_batches, fixed_micro_batches  # noqa: E402

PROMPT_LEN = 32
MAX_RESPONSE = 256
MIN_RESPONSE = 16
MICRO_BATCH = 8


def build_model(vocab: int = 4096, hidden: int = 256, layers: int = 4) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=688, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
    )  # fmt: skip
    return LlamaForCausalLM(config).train()


def build_batch(n: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """verl layout: [prompt (32) | response right-padded to 256]."""
    gen = torch.Generator().manual_seed(seed)
    width = PROMPT_LEN + MAX_RESPONSE
    input_ids = torch.randint(0, vocab, (n, width), generator=gen)
    lengths = torch.randint(MIN_RESPONSE, MAX_RESPONSE + 1, (n,), generator=gen)
    mask = (torch.arange(width)[None, :] < PROMPT_LEN + lengths[:, None]).long()
    return input_ids, mask


def train_pass(
    model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, parts: list[list[int]], packed: bool, budget: int
) -> None:
    """One forward+backward over all micro-batches (gradient accumulation), as an actor update does."""
    model.zero_grad(set_to_none=True)
    n_tokens = mask[:, PROMPT_LEN:].sum()
    for part in parts:
        idx = torch.tensor(part)
        out = compute_log_probs(
            model, input_ids[idx], mask[idx], MAX_RESPONSE,
            use_remove_padding=packed, max_tokens_per_row=budget if packed else None,
        )  # fmt: skip
        (-out.log_probs.sum() / n_tokens).backward()


def with_attention(model: torch.nn.Module, impl: str, fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        model.set_attn_implementation(impl)
        fn()

    return run


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = set_threads(args.threads, default=1)
    n_samples, repeats = (16, 1) if args.quick else (64, 3)
    model = build_model()
    input_ids, mask = build_batch(n_samples, model.config.vocab_size)
    real_tokens = int(mask.sum())
    budget = MICRO_BATCH * (PROMPT_LEN + MAX_RESPONSE)
    padded_parts = fixed_micro_batches(n_samples, MICRO_BATCH)
    packed_parts = dynamic_micro_batches(mask.sum(1).tolist(), budget)

    candidates = {
        "padded": with_attention(model, "sdpa", lambda: train_pass(model, input_ids, mask, padded_parts, False, budget)),
        "packed": with_attention(
            model, "alignctl_segment_sdpa", lambda: train_pass(model, input_ids, mask, packed_parts, True, budget)
        ),
    }
    if not args.quick:  # informational: the dense-mask variant is slow to run on CPU
        candidates["packed_4d_mask"] = with_attention(
            model, "sdpa", lambda: train_pass(model, input_ids, mask, packed_parts, True, budget)
        )
    timings = time_interleaved(candidates, warmup=1, repeats=repeats)
    wall = {name: summarize(t["wall"])["median"] for name, t in timings.items()}
    cpu = {name: summarize(t["cpu"])["median"] for name, t in timings.items()}

    setup = {
        "model": "Llama vocab=4096 hidden=256 layers=4 heads=4 intermediate=688",
        "parameters": sum(p.numel() for p in model.parameters()),
        "samples": n_samples,
        "prompt_len": PROMPT_LEN,
        "response_len": f"uniform[{MIN_RESPONSE},{MAX_RESPONSE}]",
        "real_tokens": real_tokens,
        "padded_slots": int(mask.numel()),
        "padded_micro_batches": len(padded_parts),
        "packed_micro_batches": len(packed_parts),
        "token_budget": budget,
        "repeats": repeats,
        "threads": threads,
        "timing": "interleaved repeats, median; wall clock headline",
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_per_cpu_s": {name: real_tokens / t for name, t in cpu.items()},
        "cpu_time_ratio_packed_over_padded": cpu["padded"] / cpu["packed"],
    }
    if "packed_4d_mask" in wall:
        setup["packed_4d_mask_tokens_per_s"] = real_tokens / wall["packed_4d_mask"]
    report(
        "packing: forward+backward log-prob pass",
        ours=real_tokens / wall["packed"],
        baseline=real_tokens / wall["padded"],
        unit="tokens/s",
        setup=setup,
        higher_is_better=True,
        json_path=args.json,
    )


if __name__ == "__main__":
    main()
