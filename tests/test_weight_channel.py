"""The collective weight transport (alignctl/workers/weight_channel.py) in real processes: one sender
and two receivers on a gloo group of their own, beside the default group every rank already has
(as in the actor's and the rollout pool's workers), the second transfer sent from a thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_helpers import run_ranks

from alignctl.workers.weight_channel import WeightChannel, _dtype
from alignctl.workers.worker_process import listening_socket


def _weights(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [("model.embed_tokens.weight", torch.randn(50, 8, generator=g)),
            ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g).to(torch.bfloat16)),
            ("step_counter", torch.tensor(version, dtype=torch.int64)),  # a 0-dim tensor
            ("lm_head.weight", torch.randn(50, 8, generator=g).t())]  # not contiguous: sent contiguous


def _open(rank: int, world: int) -> WeightChannel:
    listener = listening_socket("127.0.0.1") if rank == 0 else None
    port = [listener.getsockname()[1] if listener else None]
    dist.broadcast_object_list(port, src=0)  # the default group tells the receivers where to connect
    return WeightChannel.open("127.0.0.1", int(port[0]), rank, world, "cpu", listener)


def _transfer_check(rank: int, world: int) -> str:
    channel = _open(rank, world)
    seen = []
    for version in (1, 2):
        if rank == 0:  # the second from a thread, as the asynchronous loop sends
            send = channel.send if version == 1 else channel.send_in_background
            send(_weights(version), {"probe": [3, 4, 5], "probe_log_probs": [-0.5, -1.25], "version": version})
            continue
        weights, header = channel.receive()
        expected = _weights(version)
        assert [name for name, _ in weights] == [name for name, _ in expected]
        for (name, got), (_, want) in zip(weights, expected):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got, want), name
        seen.append(header)
    channel.close()
    return json.dumps(seen)


def test_a_sender_reaches_every_receiver_with_exact_tensors_and_the_header(tmp_path: Path) -> None:
    results = [json.loads(r) for r in run_ranks(_transfer_check, 3, tmp_path, 3)]
    assert results[0] == []
    for received in results[1:]:
        assert received == [{"probe": [3, 4, 5], "probe_log_probs": [-0.5, -1.25], "version": v} for v in (1, 2)]


def test_a_failed_background_send_is_raised_in_the_callers_thread(monkeypatch) -> None:
    channel = WeightChannel(store=None, group=None, rank=0, device="cpu")

    def broken(weights, header):
        raise RuntimeError("peer went away")

    monkeypatch.setattr(channel, "_send", broken)
    channel.send_in_background([], {})
    with pytest.raises(RuntimeError, match="peer went away"):
        channel.wait_sent()
    channel.wait_sent()  # raised once, then clear


def test_rank_zero_needs_its_listener() -> None:
    with pytest.raises(ValueError, match="listening socket"):
        WeightChannel.open("127.0.0.1", 1, 0, 2, "cpu")


@pytest.mark.parametrize("name", ["float32", "torch.bfloat16", "int64"])
def test_dtypes_cross_as_their_names(name: str) -> None:
    assert isinstance(_dtype(name), torch.dtype)


def test_a_name_that_is_not_a_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'nn'"):
        _dtype("nn")
