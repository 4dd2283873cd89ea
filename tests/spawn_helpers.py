"""Running a check in W spawned processes that form a gloo group (torch.distributed on CPU, no Ray).

``run_ranks(check, world, out_dir, *args)`` calls ``check(rank, *args) -> str`` in every rank and
returns each rank's string. Results are written only after the process group is destroyed, so a
rank that finished its check but aborted in interpreter teardown (seen in CI: gloo threads in C++
static destruction, SIGABRT) is told apart from a failed check: the first only warns.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, out_dir: str, check: Callable[..., str], args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = check(rank, *args)
        dist.barrier()  # both ranks leave together
    finally:
        dist.destroy_process_group()
    (Path(out_dir) / f"rank{rank}.txt").write_text(result)


def run_ranks(check: Callable[..., str], world: int, out_dir: Path, *args: Any, timeout: float = 300) -> list[str]:
    """``check`` must be importable by name (a module-level function of a test module)."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, world, port, str(out_dir), check, args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
    for proc in procs:  # a rank stuck waiting for a dead peer
        if proc.is_alive():
            proc.kill()
            proc.join()
    paths = [out_dir / f"rank{rank}.txt" for rank in range(world)]
    missing = [rank for rank, path in enumerate(paths) if not path.exists()]
    assert not missing, f"ranks {missing} did not finish; exit codes {[p.exitcode for p in procs]}"
    if any(proc.exitcode != 0 for proc in procs):
        warnings.warn(f"a rank aborted after finishing its check (exit codes {[p.exitcode for p in procs]})")
    return [path.read_text() for path in paths]
