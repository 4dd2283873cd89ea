"""Weights from the actor to a rollout pool: Ray's object store against the weight channel, in one run.

Two ways ``actor_rollout_ref.rollout.weight_transport`` moves the actor's complete weights to the
rollout workers after each update, timed on the same processes, interleaved:

- ``object_store`` (the default): the sender returns the (name, tensor) list from a Ray call and the
  receivers take that object as the argument of theirs (the trainer's own calling pattern);
- ``collective``: the sender broadcasts every tensor over ``alignctl.workers.weight_channel`` (gloo
  here, NCCL on GPUs) into buffers the receivers allocate.

Both end when every receiver holds every tensor. What the two paths share (gathering the weights,
the probe check, loading them into the engine) is left out: it costs the same either way. Weights:
SmolLM2-135M's shape (random values; 30 blocks, ``--quick`` 4), float32, the tied output projection
listed twice as the actor's state dict lists it.

    python benchmarks/weight_transport.py [--quick] [--receivers 1 2] [--repeats 5] [--json OUT]

Ratio > 1: the channel is faster.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, smollm2_config, summarize  # noqa: E402


def _actor_classes() -> tuple[Any, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        def __init__(self, layers: int) -> None:
            import torch
            from transformers import LlamaForCausalLM

            torch.manual_seed(0)
            self.weights = [(n, t.detach()) for n, t in LlamaForCausalLM(smollm2_config(layers)).state_dict().items()]
            self.channel = self.listener = None

        def size_bytes(self) -> int:
            return sum(t.numel() * t.element_size() for _, t in self.weights)

        def address(self) -> tuple[str, int]:
            from alignctl.workers.worker_process import listening_socket

            self.listener = listening_socket("127.0.0.1")
            return self.listener.getsockname()[:2]

        def open(self, size: int) -> None:
            from alignctl.workers.weight_channel import WeightChannel

            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            addr, port = self.listener.getsockname()[:2]
            self.channel = WeightChannel.open(addr, port, 0, size, "cpu", self.listener)

        def export(self) -> list[tuple[str, Any]]:
            return [(n, t.cpu()) for n, t in self.weights]

        def send(self) -> None:
            self.channel.send(self.weights, {"probe": [], "probe_log_probs": []})

    @ray.remote(num_cpus=0)
    class Receiver:
        def __init__(self) -> None:
            self.channel = None

        def open(self, addr: str, port: int, rank: int, size: int) -> None:
            from alignctl.workers.weight_channel import WeightChannel

            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            self.channel = WeightChannel.open(addr, port, rank, size, "cpu")

        def load(self, weights: list[tuple[str, Any]]) -> int:
            return sum(t.numel() for _, t in weights)

        def receive(self) -> int:
            weights, _ = self.channel.receive()
            return sum(t.numel() for _, t in weights)

    return Sender, Receiver


def measure(layers: int, receivers: int, repeats: int) -> dict[str, Any]:
    import ray

    sender_cls, receiver_cls = _actor_classes()
    sender = sender_cls.remote(layers)
    peers = [receiver_cls.remote() for _ in range(receivers)]
    addr, port = ray.get(sender.address.remote())
    ray.get([sender.open.remote(receivers + 1),
             *[peer.open.remote(addr, port, rank, receivers + 1) for rank, peer in enumerate(peers, 1)]])
    numel = None

    def object_store() -> None:
        ref = sender.export.remote()
        counts = ray.get([peer.load.remote(ref) for peer in peers])
        check(counts)

    def collective() -> None:
        sent = sender.send.remote()
        counts = ray.get([peer.receive.remote() for peer in peers])
        ray.get(sent)
        check(counts)

    def check(counts: list[int]) -> None:
        nonlocal numel
        numel = numel or counts[0]
        assert set(counts) == {numel}, counts

    times: dict[str, list[float]] = {"object_store": [], "collective": []}
    for fn in (object_store, collective):  # warm-up: first transfers set up buffers and connections
        fn()
    for _ in range(repeats):
        for name, fn in (("object_store", object_store), ("collective", collective)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    size = ray.get(sender.size_bytes.remote())
    for handle in (sender, *peers):
        ray.kill(handle)
    return {"bytes": size, "times": times}


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0], extra=lambda p: (
        p.add_argument("--receivers", type=int, nargs="+", default=[1, 2]),
        p.add_argument("--repeats", type=int, default=5)))
    import ray

    from alignctl.workers.ray_session import init_ray

    layers = 4 if args.quick else 30
    init_ray(None, num_cpus=max(args.receivers) + 1)
    try:
        for receivers in args.receivers:
            out = measure(layers, receivers, 2 if args.quick else args.repeats)
            store, channel = (summarize(out["times"][k])["median"] for k in ("object_store", "collective"))
            json_path = None if args.json is None else Path(args.json).with_suffix(f".r{receivers}.json")
            report(f"weight transfer to {receivers} rollout worker(s), {out['bytes'] / 2**20:.0f} MiB",
                   channel, store, "s", {"layers": layers, "receivers": receivers, "bytes": out["bytes"],
                                         "times": out["times"], "ours": "collective (gloo)",
                                         "baseline": "Ray object store"},
                   higher_is_better=False, json_path=json_path)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
