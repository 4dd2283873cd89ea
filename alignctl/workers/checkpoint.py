"""Worker-side training state on disk: weights, optimizer, LR schedule and random generators.

``ddp`` and ``fsdp2`` save through torch's distributed checkpoint (DCP): every rank writes its own
shards of the model and optimizer state in parallel (replicated DDP tensors are written once) and
loads them back into the same layout, so no rank ever holds a gathered copy. DeepSpeed uses its
own ``save_checkpoint`` (see :mod:`alignctl.workers.deepspeed_engine`). All functions here are
collective: every rank of the group calls them with the same folder (a shared filesystem, as for
any multi-node checkpoint).

The folder a worker writes is not a checkpoint by itself: the controller commits it (renames the
whole step folder into place) only after every worker returned, see
:mod:`alignctl.trainers.checkpoint_folders`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS_DIR = "dcp"  # model + optimizer shards (torch.distributed.checkpoint layout)
SCHEDULER_FILE = "lr_scheduler.pt"


def save_model_and_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / WEIGHTS_DIR))


def load_model_and_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # The current (fresh) state gives DCP the layout to load into: shapes, shards and the optimizer
    # slots (get_state_dict initialises AdamW's lazily created moments for that).
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder / WEIGHTS_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def rng_file(folder: Path, rank: int) -> Path:
    return folder / f"rng_rank{rank}.pt"


def save_rng(folder: Path, rank: int, generators: dict[str, torch.Generator]) -> None:
    """This rank's random state: torch's global generators and the worker's own (mini-batch shuffles)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "generators": {k: g.get_state() for k, g in generators.items()}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, rng_file(folder, rank))


def load_rng(folder: Path, rank: int, generators: dict[str, torch.Generator]) -> None:
    path = rng_file(folder, rank)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no random state for rank {rank} (was the checkpoint written by a "
                                f"run with a different number of workers?)")
    state = torch.load(path, weights_only=True)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    for name, generator in generators.items():
        generator.set_state(state["generators"][name])


def save_training_state(engine: Any, folder: str, rank: int, generators: dict[str, torch.Generator]) -> None:
    """One role's whole training state (every rank calls it with the same ``folder``)."""
    from alignctl.errors import portable_os_error

    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        engine.save_state(path, is_writer=rank == 0)
        save_rng(path, rank, generators)
    except BaseException as exc:
        # DCP wraps a rank's OSError (disk full) in its own exception and Ray drops the context:
        # re-raise the plain OS error so the controller can say "disk full" and name the path.
        plain = portable_os_error(exc, path)
        if plain is None:
            raise
        raise plain from None


def load_training_state(engine: Any, folder: str, rank: int, generators: dict[str, torch.Generator]) -> None:
    path = Path(folder)
    engine.load_state(path)
    load_rng(path, rank, generators)
