"""The passes of one PPO step and one reward-model step with and without the row's shared head.

Chat prompts start with the same tokens: SmolLM2's template opens every conversation with a 24-token
system message, and the quickstart's arith prompts are 58-63 tokens. Shared-prompt packing computes
each prompt once for its responses; on top of that, the tokens every prompt of a packed row starts
with (the head) are computed once per row (``models/forward.py``). Baseline: the same packing with
the head repeated in every prompt (``_row_head_length`` forced to 0), as before.

Same process, same SmolLM2-135M-shaped Llama (random weights: a pass costs the same whatever they
are), same batch: 8 prompts = a 24-token head + 37 tokens of their own, 4 responses of 26 tokens
each, two mini-batches of 16 responses per update (the quickstart's shapes). Passes, as the workers
run them (segment-masked sdpa): reference log-probs and critic values (no grad, all 32), critic
update (bottom 18 blocks frozen), actor update; then a reward-model step: 8 (chosen, rejected) pairs
scored through ``score_shared_prompts`` (bottom 24 blocks frozen), forward and backward. Optimizer
steps run with lr 0. Sides alternate (A B A B). The ratio is baseline time / ours.

Run: ``python benchmarks/shared_head.py [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, smollm2_config, summarize, time_interleaved  # noqa: E402

from alignctl.models import attention, forward  # noqa: E402
from alignctl.models.blocks import freeze_bottom_layers  # noqa: E402
from alignctl.models.forward import compute_log_probs, compute_values  # noqa: E402
from alignctl.models.loading import position_ids_from_mask  # noqa: E402
from alignctl.models.reward_forward import pair_prompt_lengths, score_shared_prompts  # noqa: E402

PROMPTS, N, HEAD, REST, RESPONSE_LEN, MINI = 8, 4, 24, 37, 26, 16


@contextlib.contextmanager
def head_sharing(enabled: bool) -> Iterator[None]:
    original = forward._row_head_length
    if not enabled:
        forward._row_head_length = lambda *args: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        forward._row_head_length = original  # type: ignore[assignment]


def models(layers: int) -> dict[str, Any]:
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification

    torch.manual_seed(0)
    config = smollm2_config(layers)
    parts = {"actor": LlamaForCausalLM(config), "reference": LlamaForCausalLM(config),
             "critic": LlamaForTokenClassification(config), "reward": LlamaForSequenceClassification(config)}
    freeze_bottom_layers(parts["critic"], layers * 18 // 30, "benchmark")
    freeze_bottom_layers(parts["reward"], layers * 24 // 30, "benchmark")
    attention.register()
    for model in parts.values():
        model.set_attn_implementation(attention.SEGMENT_SDPA)  # what the workers load on a CPU
    return parts


def tokens(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(3, 49152, shape, generator=gen)


def rl_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    head = tokens(gen, 1, HEAD).expand(PROMPTS, HEAD)
    prompts = torch.cat([head, tokens(gen, PROMPTS, REST)], dim=1).repeat_interleave(N, dim=0)
    ids = torch.cat([prompts, tokens(gen, PROMPTS * N, RESPONSE_LEN)], dim=1)
    mask = torch.ones_like(ids)
    return ids, mask, position_ids_from_mask(mask)


def pairs() -> list[list[int]]:
    gen = torch.Generator().manual_seed(2)
    head = tokens(gen, HEAD).tolist()
    prompts = [head + tokens(gen, REST).tolist() for _ in range(PROMPTS)]
    chosen = [p + tokens(gen, RESPONSE_LEN).tolist() for p in prompts]
    rejected = [p + tokens(gen, RESPONSE_LEN).tolist() for p in prompts]
    return chosen + rejected


def step(parts: dict[str, Any], share_head: bool) -> Callable[[], None]:
    ids, mask, pos = rl_batch()
    seqs = pairs()
    logp = lambda m, s: compute_log_probs(m, ids[s], mask[s], RESPONSE_LEN, position_ids=pos[s],  # noqa: E731
                                          share_prompt=True).log_probs
    values = lambda m, s: compute_values(m, ids[s], mask[s], RESPONSE_LEN, position_ids=pos[s],  # noqa: E731
                                         share_prompt=True)
    optim = {name: torch.optim.AdamW([p for p in parts[name].parameters() if p.requires_grad], lr=0.0, weight_decay=0.0)
             for name in ("actor", "critic", "reward")}

    def update(name: str, output: Callable[[Any, slice], torch.Tensor]) -> None:
        for start in range(0, len(ids), MINI):
            optim[name].zero_grad(set_to_none=True)
            output(parts[name], slice(start, start + MINI)).square().mean().backward()
            optim[name].step()

    def run() -> None:
        with head_sharing(share_head):
            with torch.no_grad():
                logp(parts["reference"], slice(None))
                values(parts["critic"], slice(None))
            update("critic", values)
            update("actor", logp)
            optim["reward"].zero_grad(set_to_none=True)
            scores = score_shared_prompts(parts["reward"], seqs, pair_prompt_lengths(seqs), 0)
            torch.nn.functional.logsigmoid(scores[:PROMPTS] - scores[PROMPTS:]).mean().neg().backward()
            optim["reward"].step()

    return run


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = set_threads(args.threads)
    layers = 4 if args.quick else 30
    parts = models(layers)
    times = time_interleaved({"ours": step(parts, True), "baseline": step(parts, False)},
                             warmup=1, repeats=1 if args.quick else 3)
    ours, base = (summarize(times[side]["wall"])["median"] for side in ("ours", "baseline"))
    setup = {"layers": layers, "prompts": PROMPTS, "n": N, "head": HEAD, "rest": REST, "response_len": RESPONSE_LEN,
             "mini_batch": MINI, "threads": threads}
    report("PPO step passes + a reward-model step: head shared per row vs repeated in each prompt", ours, base,
           "s per step (after generation)", setup, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
