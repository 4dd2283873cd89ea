"""Weights from the actor's rank 0 to a rollout pool over a process group of their own.

``actor_rollout_ref.rollout.weight_transport=collective``. The group spans the actor's rank 0
(channel rank 0, the sender) and every rollout worker (channel ranks 1..n), beside each pool's own
training group: gloo on CPU, NCCL on GPU, where tensors go device to device without a copy to host
memory. It is built from a store of its own (torch.distributed allows one default group per
process, and both pools already have theirs).

The small part of each sync travels through that store as JSON (never pickle: the store listens on
the node's address): the names, shapes and dtypes of the tensors and the trainer's log-probs of the
probe sequence. Then every tensor is broadcast in that order into buffers the receivers allocate.
A broadcast blocks the sender until every receiver has joined it. In asynchronous RL the rollout
workers may still be generating a queued batch, so the actor sends a copy of its weights from a
thread (``send_in_background``) and trains on meanwhile.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

JOIN_TIMEOUT = timedelta(minutes=5)  # every worker is up when the channel forms: joining takes seconds
CHANNEL_TIMEOUT = timedelta(minutes=30)  # a receiver may wait out a long update, a sender a long generation


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight channel: unknown dtype {name!r}")
    return dtype


class WeightChannel:
    """One end of the group: rank 0 ``send``s, the other ranks ``receive`` the same sequence."""

    def __init__(self, store: Any, group: Any, rank: int, device: str) -> None:
        self.store, self.group, self.rank, self.device = store, group, rank, device
        self.transfers = 0  # syncs so far: the store's keys are numbered by it on both ends
        self._sender: threading.Thread | None = None
        self._send_error: BaseException | None = None

    @classmethod
    def open(cls, addr: str, port: int, rank: int, size: int, device: str,
             listener: socket.socket | None = None) -> WeightChannel:
        """Rank 0 serves the store on ``listener`` (from ``worker_process.listening_socket``); the
        others connect to ``addr:port``. Blocks until all ``size`` ranks have joined."""
        if rank == 0:
            if listener is None:
                raise ValueError("weight channel: rank 0 needs its listening socket")
            store = dist.TCPStore(addr, port, size, is_master=True, master_listen_fd=listener.detach(),
                                  timeout=JOIN_TIMEOUT)
        else:
            store = dist.TCPStore(addr, port, size, is_master=False, timeout=JOIN_TIMEOUT)
        store.set_timeout(CHANNEL_TIMEOUT)
        prefixed = dist.PrefixStore("weights_group", store)
        if device == "cuda":
            group = dist.ProcessGroupNCCL(prefixed, rank, size)
        else:
            group = dist.ProcessGroupGloo(prefixed, rank, size, CHANNEL_TIMEOUT)
        return cls(store, group, rank, device)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], header: dict[str, Any]) -> None:
        """Rank 0: ``header`` (JSON-able) and the tensors, in order, to every receiver."""
        self.wait_sent()
        self._send(weights, header)

    def send_in_background(self, weights: list[tuple[str, torch.Tensor]], header: dict[str, Any]) -> None:
        """``send`` from a thread, returning at once: the caller goes on while the receivers finish
        what they are doing. ``weights`` must not change until it is sent (pass a copy). An error
        of the sending thread is raised by the next send, ``wait_sent`` or ``close``."""
        self.wait_sent()
        self._sender = threading.Thread(target=self._send_catching, args=(weights, header), daemon=True,
                                        name="weight-channel-send")
        self._sender.start()

    def wait_sent(self) -> None:
        """Until the background send (if any) has ended; its error, if it failed."""
        if self._sender is not None:
            self._sender.join()
            self._sender = None
        error, self._send_error = self._send_error, None
        if error is not None:
            raise error

    def _send_catching(self, weights: list[tuple[str, torch.Tensor]], header: dict[str, Any]) -> None:
        try:
            self._send(weights, header)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread by wait_sent
            self._send_error = exc

    def _send(self, weights: Iterable[tuple[str, torch.Tensor]], header: dict[str, Any]) -> None:
        tensors = [(name, tensor.detach().contiguous()) for name, tensor in weights]
        manifest = [[name, list(t.shape), str(t.dtype)] for name, t in tensors]
        self.store.set(self._key(), json.dumps({"manifest": manifest, **header}))
        for _, tensor in tensors:
            self._broadcast(tensor.to(self._tensor_device))  # no copy where it already is
        self.transfers += 1

    def receive(self) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
        """Ranks 1..n: the weights rank 0 sends next (waits for them) and the header sent with them."""
        key = self._key()
        header = json.loads(self.store.get(key))
        weights = []
        for name, shape, dtype in header.pop("manifest"):
            tensor = torch.empty(shape, dtype=_dtype(dtype), device=self._tensor_device)
            self._broadcast(tensor)
            weights.append((name, tensor))
        self.transfers += 1
        if self.rank == 1:  # every receiver has read the header once its tensors arrived
            self.store.delete_key(key)
        return weights, header

    def close(self) -> None:
        self.wait_sent()
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.group = self.store = None

    @property
    def _tensor_device(self) -> str:
        """Where the group's tensors live: NCCL moves GPU memory (an offloaded actor's CPU weights
        are copied up first), gloo host memory."""
        return "cuda" if self.device == "cuda" else "cpu"

    def _key(self) -> str:
        return f"sync/{self.transfers}"

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()
