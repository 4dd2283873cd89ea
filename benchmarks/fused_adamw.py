"""The RL workers' fused AdamW against torch's single-tensor AdamW: the optimizer step, and the rollout after it.

Same process, same randomly initialised Llama with SmolLM2-135M-Instruct's shape (the cost of a step does
not depend on the weights), glibc's heap kept as the RL workers keep it (``alignctl.cpu_heap``), the sides
alternating (A B C A B C) so a load change hits them alike:

  * ``step``: one ``AdamW.step()`` over every parameter (gradients set beforehand, not timed);
  * ``rollout``: an optimizer step of each kind, the weights restored, then the hf engine samples n=4
    responses of 40 tokens for 8 prompts of 60 tokens (fixed seed, no stop token: every side decodes the
    same tokens). A third side takes no optimizer step before its rollout (the control).

"ours" is ``build_optimizer`` (fused on plain CPU/CUDA parameters), the baseline ``AdamW(foreach=False)``;
ratios are baseline time / ours. The rollout side answers whether the fused step leaves anything behind that
slows the next generation (the quickstart's GRPO generated 3-14% slower on one clone than another).

Run: ``python benchmarks/fused_adamw.py [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, smollm2_config, summarize, time_interleaved  # noqa: E402

from alignctl.cpu_heap import keep_freed_memory  # noqa: E402
from alignctl.rollout import SamplingParams, get_rollout_engine  # noqa: E402
from alignctl.workers.strategy import build_optimizer  # noqa: E402

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 8, 4, 60, 40


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = set_threads(args.threads)
    heap_kept = keep_freed_memory()
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(smollm2_config(4 if args.quick else 30)).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    optimizers = {"fused": build_optimizer(params, lr=1e-5, weight_decay=0.01, betas=[0.9, 0.999]),
                  "single-tensor": torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=False, fused=False)}
    assert optimizers["fused"].defaults["fused"], "build_optimizer did not pick the fused kernel here"
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (PROMPT_LEN,), generator=gen).tolist() for _ in range(PROMPTS)]
    engine = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2)
    sampling = SamplingParams(n=N, temperature=1.0, max_new_tokens=RESPONSE_LEN, seed=0, stop_token_ids=())

    def set_grads() -> None:
        for p in params:
            p.grad = torch.full_like(p, 1e-3)

    def step(optimizer: torch.optim.Optimizer | None) -> None:
        set_grads()
        if optimizer is not None:
            optimizer.step()
        for p in params:
            p.grad = None  # as the workers' zero_grad leaves them during a rollout
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)

    set_grads()  # kept for the timed steps: only step() itself is timed
    step_times = time_interleaved({name: opt.step for name, opt in optimizers.items()}, warmup=1,
                                  repeats=3 if args.quick else 10)
    rollouts = {name: (lambda opt=opt: (step(opt), engine.generate(prompts, sampling)))
                for name, opt in {**optimizers, "no step": None}.items()}
    rollout_times = time_interleaved(rollouts, warmup=1, repeats=2 if args.quick else 10)

    setup: dict[str, Any] = {"model": f"random SmolLM2-shaped, {len(model.model.layers)} layers",
                             "parameters": sum(p.numel() for p in params), "threads": threads, "heap_kept": heap_kept}
    for name, times in rollout_times.items():
        setup[f"rollout_median_s[{name}]"] = summarize(times["wall"])["median"]
    for kind, times, baseline in (("optimizer step", step_times, "single-tensor"),
                                  ("rollout after a step", rollout_times, "single-tensor"),
                                  ("rollout after a fused step vs after none", rollout_times, "no step")):
        tag = kind.replace(" ", "-")
        json_path = None if args.json is None else f"{args.json.removesuffix('.json')}-{tag}.json"
        report(f"{kind}: fused vs {baseline}", summarize(times["fused"]["wall"])["median"],
               summarize(times[baseline]["wall"])["median"], "s", setup, higher_is_better=False, json_path=json_path)


if __name__ == "__main__":
    main()
