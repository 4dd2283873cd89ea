"""Weights from the actor's rank 0 to a rollout pool over a process group of their own.

``actor_rollout_ref.rollout.weight_transport=collective``. The group spans the actor's rank 0
(channel rank 0, the sender) and every rollout worker (channel ranks 1..n), beside each pool's own
training group: gloo on CPU, NCCL on GPU, where tensors go device to device without a copy to host
memory. It is built from a store of its own (torch.distributed allows one default group per
process, and both pools already have theirs).

The small part of each sync travels through that store as JSON (never pickle: the store listens on
the node's address): the names, shapes and dtypes of the tensors and the trainer's log-probs of the
probe sequence. Then every tensor is broadcast in that order into buffers the receivers allocate.
A broadcast blocks the sender until every receiver has joined it, so the actor waits for rollout
workers still busy with a queued generation (asynchronous RL) before it trains on.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

CHANNEL_TIMEOUT = timedelta(minutes=30)  # a receiver may be busy with a long generation


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight channel: unknown dtype {name!r}")
    return dtype


class WeightChannel:
    """One end of the group: rank 0 ``send``s, the other ranks ``receive`` the same sequence."""

    def __init__(self, store: Any, group: Any, rank: int, size: int, device: str) -> None:
        self.store, self.group, self.rank, self.size, self.device = store, group, rank, size, device
        self.transfers = 0  # syncs so far: the store's keys are numbered by it on both ends

    @classmethod
    def open(cls, addr: str, port: int, rank: int, size: int, device: str,
             listener: socket.socket | None = None) -> WeightChannel:
        """Rank 0 serves the store on ``listener`` (from ``worker_process.listening_socket``); the
        others connect to ``addr:port``. Blocks until all ``size`` ranks have joined."""
        if rank == 0:
            if listener is None:
                raise ValueError("weight channel: rank 0 needs its listening socket")
            store = dist.TCPStore(addr, port, size, is_master=True, master_listen_fd=listener.detach(),
                                  timeout=CHANNEL_TIMEOUT)
        else:
            store = dist.TCPStore(addr, port, size, is_master=False, timeout=CHANNEL_TIMEOUT)
        prefixed = dist.PrefixStore("weights_group", store)
        if device == "cuda":
            group = dist.ProcessGroupNCCL(prefixed, rank, size)
        else:
            group = dist.ProcessGroupGloo(prefixed, rank, size, CHANNEL_TIMEOUT)
        return cls(store, group, rank, size, device)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], header: dict[str, Any]) -> None:
        """Rank 0: ``header`` (JSON-able) and the tensors, in order, to every receiver."""
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in weights]
        manifest = [[name, list(t.shape), str(t.dtype)] for name, t in tensors]
        self.store.set(self._key(), json.dumps({"manifest": manifest, **header}))
        for _, tensor in tensors:
            self._broadcast(tensor if self.device == "cuda" else tensor.cpu())
        self.transfers += 1

    def receive(self) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
        """Ranks 1..n: the weights rank 0 sends next (waits for them) and the header sent with them."""
        key = self._key()
        header = json.loads(self.store.get(key))
        device = "cuda" if self.device == "cuda" else "cpu"
        weights = []
        for name, shape, dtype in header.pop("manifest"):
            tensor = torch.empty(shape, dtype=_dtype(dtype), device=device)
            self._broadcast(tensor)
            weights.append((name, tensor))
        self.transfers += 1
        if self.rank == 1:  # every receiver has read the header once its tensors arrived
            self.store.delete_key(key)
        return weights, header

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.group = self.store = None

    def _key(self) -> str:
        return f"sync/{self.transfers}"

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()
