"""The RL workers' optimizer: AdamW with torch's fused kernel on plain CPU/CUDA parameters (what TRL's
stages use), checked against torch's single-tensor AdamW (the for-loop reference implementation) over
several steps with a changing learning rate, as the update loop drives it."""

from __future__ import annotations

import torch
from torch import nn

from alignctl.workers.strategy import build_lr_scheduler, build_optimizer, fused_adamw_applies


def _params(seed: int) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=gen) * 0.02) for shape in ((64, 32), (32,), (7, 5, 3))]


def test_rl_optimizer_is_fused_adamw_and_updates_as_the_reference_does() -> None:
    ours, ref = _params(0), _params(0)
    opt = build_optimizer(ours, lr=1e-3, weight_decay=0.01, betas=[0.9, 0.95])
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True
    reference = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95), foreach=False, fused=False)
    schedules = [build_lr_scheduler(o, total_steps=6, warmup_steps=2, style="cosine", min_lr_ratio=0.1)
                 for o in (opt, reference)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for params, o in ((ours, opt), (ref, reference)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            o.step()
        for s in schedules:
            s.step()
    start = _params(0)
    for a, b, s in zip(ours, ref, start):
        assert not torch.equal(a, s)  # 6 steps of lr ~1e-3 moved every tensor
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_fused_only_for_plain_tensors_on_devices_with_the_kernel() -> None:
    assert fused_adamw_applies(_params(0))
    assert not fused_adamw_applies([])
    meta = [nn.Parameter(torch.empty(3, 3, device="meta"))]
    assert not fused_adamw_applies(meta)
    assert build_optimizer(meta, lr=1e-3, weight_decay=0.0, betas=[0.9, 0.999]).defaults["fused"] is False


def test_fsdp2_shards_keep_torchs_default_adamw(one_process_group: None) -> None:
    """FSDP2's parameters are DTensor shards (after fully_shard, where the workers build the optimizer):
    not fused."""
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fully_shard(model)
    params = list(model.parameters())
    assert type(params[0]).__name__ == "DTensor"
    assert not fused_adamw_applies(params)
    assert build_optimizer(params, lr=1e-3, weight_decay=0.0, betas=[0.9, 0.999]).defaults["fused"] is False
