"""One rollout call, as every worker that generates runs it: the hybrid actor (generating with its
own training module or an engine beside it) and a rollout worker on a pool of its own.

Sampling parameters come from the controller's batch meta; the result is the batch layout the
controller expects (prompt + response ids, masks, positions, the group ids), whoever generated it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from alignctl.batch import Batch
from alignctl.rollout import SamplingParams
from alignctl.rollout.engine import RolloutEngine
from alignctl.workers.batch_transfer import autocast
from alignctl.workers.sequences import assemble, expand_lists


def sampling_params(meta: dict[str, Any], max_new_tokens: int, rank: int) -> SamplingParams:
    return SamplingParams(n=meta["n"], temperature=meta["temperature"], top_p=meta["top_p"], top_k=meta["top_k"],
                          max_new_tokens=max_new_tokens, greedy=not meta["do_sample"],
                          seed=meta["seed"] * 1009 + rank)


def generate_batch(rollout: RolloutEngine, prompts: Batch, *, max_new_tokens: int, rank: int, device: str,
                   precision: str, pad_id: int, free_cache: bool, before: Callable[[], None] | None = None,
                   extra_metrics: Callable[[], dict[str, float]] | None = None) -> Batch:
    """Generate for ``prompts`` with ``rollout``; ``before`` runs once the engine is awake (the
    actor's weight sync), ``extra_metrics`` after generation (its sync check's figures)."""
    meta = prompts.meta
    params = sampling_params(meta, max_new_tokens, rank)
    start = time.perf_counter()
    rollout.wake()
    if before is not None:
        before()
    with autocast(device, precision):
        out = rollout.generate(prompts["prompt_ids"], params)
    if free_cache:
        rollout.sleep()
    tensors = assemble(prompts["prompt_ids"], out, prompt_width=meta["prompt_width"],
                       response_width=max_new_tokens, pad_id=pad_id)
    tensors["group_index"] = torch.as_tensor([prompts["uid"][int(i)] for i in out.prompt_index])
    engine_metrics = {**rollout.status_metrics(), **(extra_metrics() if extra_metrics else {})}
    gen_meta = {"temperature": params.logprob_temperature, "timing_s/gen_worker": time.perf_counter() - start,
                "rollout_metrics": {**{k: v for k, v in out.metrics.items() if k.startswith("multi_turn/")},
                                    **engine_metrics}}
    return Batch(tensors, expand_lists(prompts, out), {**meta, **gen_meta})


def with_tools(engine: RolloutEngine, cfg: Any, tokenizer: Any, eos_ids: list[int]) -> RolloutEngine:
    """The engine wrapped in the multi-turn tool loop when ``rollout.multi_turn.enable`` (else as is)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return engine
    from alignctl.rollout.multi_turn import MultiTurnRollout

    return MultiTurnRollout(engine, tokenizer, mt.tools, max_turns=mt.max_turns,
                            max_response_length=cfg.data.max_response_length, stop_ids=eos_ids,
                            timeout_s=mt.tool_timeout_s, max_parallel_tools=mt.max_parallel_tools, lanes=mt.lanes,
                            tool_settings={"isolation": mt.isolation})
