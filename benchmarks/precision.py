"""``trainer.precision=bf16`` vs ``fp32``: the three passes of an RL step on a SmolLM2-135M-shaped model.

Same process, same randomly initialised Llama with SmolLM2-135M-Instruct's shape (hidden 576, 30
layers, 9 query / 3 kv heads, vocab 49152; the cost of a pass does not depend on the weights), same
prompts, both sides alternating (A B A B) so a load change hits both alike:

  * ``rollout``: the hf engine samples n=4 responses of 40 tokens for 8 prompts of 60 tokens
    (no stop token: every row runs to the end, so both sides decode the same number of tokens);
  * ``log_probs``: a no-grad ``compute_log_probs`` over the 32 sequences (the old/ref pass);
  * ``train``: forward + backward of ``compute_log_probs`` on a micro-batch of 8 (the actor update).

"ours" is bf16 autocast with the LM head kept in float32 (what ``trainer.precision=bf16`` does in the
actor), the baseline fp32;
the ratio is fp32 time / bf16 time. It also prints the largest log-prob gap between the two.
A third side times ``rollout`` and ``log_probs`` on a bf16 *copy* of the model (weights stored in bf16,
output projection float32: what ``rollout.dtype=bfloat16`` / ``ref.dtype=bfloat16`` use), with its
own log-prob gap and ratio against fp32 (no ``train``: a copy does not train).
bf16 only pays where the hardware has bf16 matmuls (CUDA; CPUs with avx512_bf16 or AMX); on other
CPUs expect a ratio below 1.

Run: ``python benchmarks/precision.py [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, smollm2_config, summarize, time_interleaved  # noqa: E402

from alignctl.models.forward import compute_log_probs  # noqa: E402
from alignctl.rollout import SamplingParams, get_rollout_engine  # noqa: E402
from alignctl.workers.batch_transfer import autocast, float32_output_head  # noqa: E402
from alignctl.workers.low_precision import low_precision_copy  # noqa: E402

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN, MICRO = 8, 4, 60, 40, 8


def smollm2_shaped(layers: int) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(smollm2_config(layers)).eval()


def passes(model: torch.nn.Module, precision: str) -> dict[str, Any]:
    """The three timed passes of one side, as zero-argument callables."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (PROMPT_LEN,), generator=gen).tolist() for _ in range(PROMPTS)]
    engine = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2)
    params = SamplingParams(n=N, temperature=1.0, max_new_tokens=RESPONSE_LEN, seed=0, stop_token_ids=())
    ids = torch.randint(3, 49152, (PROMPTS * N, PROMPT_LEN + RESPONSE_LEN), generator=gen)
    mask = torch.ones_like(ids)

    def rollout() -> None:
        with torch.no_grad(), autocast("cpu", precision):
            engine.generate(prompts, params)

    def log_probs() -> torch.Tensor:
        with torch.no_grad(), autocast("cpu", precision):
            return compute_log_probs(model, ids, mask, RESPONSE_LEN).log_probs

    def train() -> None:
        model.zero_grad(set_to_none=True)
        with autocast("cpu", precision):
            out = compute_log_probs(model, ids[:MICRO], mask[:MICRO], RESPONSE_LEN)
        out.log_probs.mean().backward()

    return {"rollout": rollout, "log_probs": log_probs, "train": train}


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = set_threads(args.threads)
    layers = 4 if args.quick else 30
    model = smollm2_shaped(layers)
    copy = low_precision_copy(model, "bfloat16", "cpu")  # before the patch below: float32 has its own head
    float32_output_head(model, "cpu")  # as the RL actor does under bf16 (a no-op for the float32 side)
    sides = {"bf16": passes(model, "bf16"), "fp32": passes(model, "fp32"), "bf16_copy": passes(copy, "fp32")}
    exact = sides["fp32"]["log_probs"]()
    gaps = {side: (sides[side]["log_probs"]() - exact).abs().max().item() for side in ("bf16", "bf16_copy")}
    for side, gap in gaps.items():
        print(f"largest |log-prob {side} - fp32| over {PROMPTS * N} x {RESPONSE_LEN} tokens: {gap:.4f}")
    setup = {"layers": layers, "prompts": PROMPTS, "n": N, "prompt_len": PROMPT_LEN, "response_len": RESPONSE_LEN,
             "micro_batch": MICRO, "threads": threads, "max_logprob_gap": gaps["bf16"],
             "max_logprob_gap_copy": gaps["bf16_copy"]}
    repeats = 1 if args.quick else 3
    for name in ("rollout", "log_probs", "train"):
        timed = [side for side in sides if name != "train" or side != "bf16_copy"]
        times = time_interleaved({side: sides[side][name] for side in timed}, warmup=1, repeats=repeats)
        median = {side: summarize(times[side]["wall"])["median"] for side in timed}
        for side, label in (("bf16", "bf16 autocast"), ("bf16_copy", "bf16 copy")):
            if side not in median:
                continue
            stem = None if args.json is None else args.json.removesuffix(".json")
            json_path = None if stem is None else f"{stem}-{name}{'-copy' if side == 'bf16_copy' else ''}.json"
            report(f"precision/{name}: {label} vs fp32", median[side], median["fp32"], "s per pass", setup,
                   higher_is_better=False, json_path=json_path)


if __name__ == "__main__":
    main()
