"""The worker passes of one PPO step after generation, with and without the quickstart's two savings.

Same process, same SmolLM2-135M-shaped Llama (hidden 576, 30 layers, vocab 49152; random weights:
the cost of a pass does not depend on them) as policy, reference and value model, same batch: 8
prompts x 4 responses, prompts of 60 tokens, responses of 26 (the quickstart's shapes), two
mini-batches of 16 responses per update. Every pass runs as the workers run it: packed rows
(segment-masked sdpa), each prompt computed once for its 4 responses (``share_prompt``). Both sides
alternate (A B A B) so a load change hits both.

  * baseline (the defaults): old log-probs recomputed (a no-grad pass over the 32 sequences),
    reference log-probs, critic values, critic update of the whole value model, actor update;
  * ours (pipelines/quickstart.yaml): ``actor.recompute_old_log_prob=false`` (the rollout's own
    log-probs serve, so that pass is gone) and ``critic.model.freeze_layers=18`` (backward and the
    optimizer cover the top 12 blocks and the value head), the rest the same.

Optimizer steps run with lr 0 (Adam's arithmetic without moving the weights), so every repeat sees
the same model. The ratio is baseline time / ours.

Run: ``python benchmarks/ppo_step_passes.py [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, smollm2_config, summarize, time_interleaved  # noqa: E402

from alignctl.models import attention  # noqa: E402
from alignctl.models.blocks import freeze_bottom_layers  # noqa: E402
from alignctl.models.forward import compute_log_probs, compute_values  # noqa: E402
from alignctl.models.loading import position_ids_from_mask  # noqa: E402

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN, MINI = 8, 4, 60, 26, 16


def models(layers: int, frozen: int) -> dict[str, Any]:
    from transformers import LlamaForCausalLM, LlamaForTokenClassification

    torch.manual_seed(0)
    config = smollm2_config(layers)
    critic_full, critic_frozen = LlamaForTokenClassification(config), LlamaForTokenClassification(config)
    critic_frozen.load_state_dict(critic_full.state_dict())
    freeze_bottom_layers(critic_frozen, frozen, "benchmark", key="critic.model.freeze_layers")
    parts = {"actor": LlamaForCausalLM(config), "reference": LlamaForCausalLM(config),
             "critic_full": critic_full, "critic_frozen": critic_frozen}
    attention.register()
    for model in parts.values():
        model.set_attn_implementation(attention.SEGMENT_SDPA)  # what the RL workers load on a CPU
    return parts


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids, attention mask, position ids: N responses per prompt, the prompt repeated."""
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, 49152, (PROMPTS, PROMPT_LEN), generator=gen).repeat_interleave(N, dim=0)
    responses = torch.randint(3, 49152, (PROMPTS * N, RESPONSE_LEN), generator=gen)
    ids = torch.cat([prompts, responses], dim=1)
    mask = torch.ones_like(ids)
    return ids, mask, position_ids_from_mask(mask)


def step(parts: dict[str, Any], critic: Any, recompute: bool) -> Callable[[], None]:
    """One side's passes, as a zero-argument callable."""
    ids, mask, pos = batch()
    logp = lambda m, s: compute_log_probs(m, ids[s], mask[s], RESPONSE_LEN, position_ids=pos[s],  # noqa: E731
                                          share_prompt=True).log_probs
    values = lambda m, s: compute_values(m, ids[s], mask[s], RESPONSE_LEN, position_ids=pos[s],  # noqa: E731
                                         share_prompt=True)
    everything = slice(None)
    optim = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.0, weight_decay=0.0)
             for name, m in (("actor", parts["actor"]), ("critic", critic))}

    def update(model: Any, output: Callable[[Any, slice], torch.Tensor], name: str) -> None:
        for start in range(0, len(ids), MINI):
            optim[name].zero_grad(set_to_none=True)
            output(model, slice(start, start + MINI)).square().mean().backward()
            optim[name].step()

    def run() -> None:
        with torch.no_grad():
            if recompute:
                logp(parts["actor"], everything)
            logp(parts["reference"], everything)
            values(critic, everything)
        update(critic, values, "critic")
        update(parts["actor"], logp, "actor")

    return run


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0])
    threads = set_threads(args.threads)
    layers, frozen = (4, 2) if args.quick else (30, 18)
    parts = models(layers, frozen)
    sides = {"ours": step(parts, parts["critic_frozen"], False), "baseline": step(parts, parts["critic_full"], True)}
    times = time_interleaved(sides, warmup=1, repeats=1 if args.quick else 3)
    ours, base = (summarize(times[side]["wall"])["median"] for side in ("ours", "baseline"))
    setup = {"layers": layers, "critic_frozen_layers": frozen, "prompts": PROMPTS, "n": N, "prompt_len": PROMPT_LEN,
             "response_len": RESPONSE_LEN, "mini_batch": MINI, "threads": threads}
    report("ppo step passes: rollout log-probs + critic frozen vs recompute + full critic", ours, base,
           "s per step (after generation)", setup, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
