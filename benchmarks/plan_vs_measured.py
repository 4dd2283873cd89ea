"""``alignctl plan`` vs the memory a GPU really peaks at, for the actor's update phase.

Needs a CUDA GPU (exits with a message otherwise). For each configuration it builds what one
worker holds during an actor update (the policy, a frozen reference copy, AdamW state), runs the
rollout-free part of an RL step that peaks (one training micro-batch: packed forward through
``compute_log_probs``, backward, optimizer step), reads ``torch.cuda.max_memory_allocated`` and
prints it beside the plan's estimate of resident parts + the update phase:

    python benchmarks/plan_vs_measured.py --model work/smollm2_grpo/base_model-<key>
    python benchmarks/plan_vs_measured.py --model PATH --configs ddp ddp_ckpt ddp_bf16

One process, one worker (world size 1). The fsdp2 rows shard the policy with alignctl's own
``FSDP2Engine`` in a one-process NCCL group (``fsdp2_offload`` with torch's ``CPUOffloadPolicy``
and the reference parked in CPU memory, as ``ref.fsdp_config.param_offload`` does). The target is an
estimate within 25% of the measurement for ddp, fsdp2 + checkpointing and fsdp2 + offload.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIGS = {
    "ddp": [],
    "ddp_ckpt": ["actor_rollout_ref.model.enable_gradient_checkpointing=true"],
    "ddp_bf16": ["trainer.precision=bf16"],
    "fsdp2_ckpt": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.model.enable_gradient_checkpointing=true"],
    "fsdp2_offload": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
                      "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
}


def rl_config(model: str, micro: int, prompt: int, response: int, extra: list[str]):  # noqa: ANN201 - RLConfig
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    return load_config(RLConfig, None, [
        f"actor_rollout_ref.model.path={model}", "data.train_files=[unused.parquet]", "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}", f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}", "trainer.device=cuda", *extra],
        base={"algorithm": {"adv_estimator": "grpo"}})


def measure(cfg, micro: int, prompt: int, response: int) -> int:  # noqa: ANN001
    """Peak bytes of one actor update micro-batch with a reference copy resident."""
    from transformers import AutoModelForCausalLM

    from alignctl.models.compat import enable_activation_checkpointing
    from alignctl.models.forward import compute_log_probs
    from alignctl.workers.batch_transfer import autocast, float32_output_head

    arr = cfg.actor_rollout_ref
    offload = arr.actor.strategy == "fsdp2" and arr.actor.fsdp_config.offload_policy
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(arr.model.path, dtype=torch.float32)
    reference = copy.deepcopy(model).requires_grad_(False)  # parked: stays in CPU memory
    if not arr.ref.fsdp_config.param_offload:
        reference = reference.cuda()
    if not offload:
        model = model.cuda()  # CPUOffloadPolicy keeps the shards on the CPU and moves them per unit
    if arr.model.enable_gradient_checkpointing:
        enable_activation_checkpointing(model)
    if arr.actor.strategy == "fsdp2":
        from alignctl.workers.strategy import FSDP2Engine

        FSDP2Engine(model, 1, offload=offload)
    if cfg.trainer.precision == "bf16":
        float32_output_head(model, "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(3, model.config.vocab_size, (micro, prompt + response), device="cuda")
    mask = torch.ones_like(ids)
    for _ in range(2):  # the second step has the optimizer state allocated
        with autocast("cuda", cfg.trainer.precision):
            out = compute_log_probs(model, ids, mask, response)
        out.log_probs.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    peak = torch.cuda.max_memory_allocated()
    del model, reference, optimizer
    return peak


def one_process_group() -> None:
    """fully_shard needs a process group and a device mesh: a world of one over NCCL."""
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face causal LM folder")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--response", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("plan_vs_measured needs a CUDA GPU (torch.cuda.max_memory_allocated); none is visible")
    from alignctl.plan import make_plan

    if any(CONFIGS[name] and "strategy=fsdp2" in CONFIGS[name][0] for name in args.configs):
        one_process_group()

    print(f"{'config':10} {'planned GiB':>12} {'measured GiB':>13} {'planned/measured':>17}")
    for name in args.configs:
        cfg = rl_config(args.model, args.micro, args.prompt, args.response, CONFIGS[name])
        plan, _ = make_plan(cfg, device_memory=torch.cuda.get_device_properties(0).total_memory)
        actor = plan.roles[0]
        planned = actor.resident_total + actor.phase_totals()["update"]
        measured = measure(cfg, args.micro, args.prompt, args.response)
        print(f"{name:10} {planned / 2**30:12.2f} {measured / 2**30:13.2f} {planned / measured:17.2f}")


if __name__ == "__main__":
    main()
