"""Where the RL roles run: named resource pools and the role -> pool mapping (``trainer.pools``,
``trainer.placement``), in verl's spirit (its ``resource_pool_spec`` + role mapping).

The default is today's single hybrid pool ``global_pool`` (``trainer.nnodes`` x
``trainer.n_gpus_per_node`` workers) holding every role. Each pool becomes its own Ray placement
group and torch.distributed group (workers/pooled_workers.py); this module only reads and checks the
config, before Ray starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from alignctl.config.core import field
from alignctl.cores import available_cores
from alignctl.errors import UserError

DEFAULT_POOL = "global_pool"
ROLES = ("actor", "critic", "rm", "rollout")
PLACEMENT_STRATEGIES = ("auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a Ray actor / placement-group name


@dataclass
class PoolConfig:
    nnodes: int | None = field(None, ge=1, help="Nodes this pool spans (default: trainer.nnodes).")
    workers_per_node: int | None = field(None, ge=1, help="Worker processes per node (default: "
                                                          "trainer.n_gpus_per_node); one GPU each on CUDA.")
    cpus_per_worker: int | None = field(None, ge=1, help="CPU cores (and torch threads) per worker "
                                                         "(default: trainer.cpus_per_worker).")
    gpus_per_worker: int | None = field(None, ge=0, help="GPUs per worker (default: 1 when trainer.device "
                                                         "resolves to cuda, else 0).")
    resources: dict[str, float] = field(default_factory=dict, help="Custom Ray resources each worker asks for, "
                                                                "e.g. {big_memory: 1}: the pool then runs only on nodes "
                                                                "started with them (ray start --resources).")
    strategy: str = field("auto", help="Ray placement strategy. auto: PACK on one node; with nnodes > 1, "
                                       "STRICT_SPREAD of one bundle per node (workers_per_node workers on "
                                       "each of nnodes distinct nodes). SPREAD is the best-effort version; "
                                       "PACK packs the node bundles onto as few nodes as fit.",
                          choices=PLACEMENT_STRATEGIES)


@dataclass
class PlacementConfig:
    actor: str = field(DEFAULT_POOL, help="Pool of the actor, its rollout engine and the reference policy "
                                          "(the hybrid engine: the reference always lives with the actor).")
    critic: str = field(DEFAULT_POOL, help="Pool of the critic (used by gae).")
    rm: str = field(DEFAULT_POOL, help="Pool of the reward model (reward_model.enable).")
    rollout: str = field("", help="Pool of rollout workers of their own, which generate and receive the actor's "
                                  "weights after every update (a different pool than the actor's). Empty: the "
                                  "actor's workers generate (the hybrid engine).")


@dataclass(frozen=True)
class PoolShape:
    """A pool resolved against the trainer defaults: what one placement group asks Ray for."""

    name: str
    nnodes: int
    workers_per_node: int
    cpus: int  # per worker
    gpus: int  # per worker
    strategy: str  # a Ray strategy (auto resolved)
    resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources per worker

    @property
    def world_size(self) -> int:
        return self.nnodes * self.workers_per_node


def _shape(name: str, pool: PoolConfig | None, trainer: Any, gpus_default: int, auto_cpus: int) -> PoolShape:
    pool = pool or PoolConfig()
    nnodes = pool.nnodes or trainer.nnodes
    strategy = pool.strategy
    if strategy == "auto":
        strategy = "STRICT_SPREAD" if nnodes > 1 else "PACK"
    cpus = pool.cpus_per_worker or trainer.cpus_per_worker
    return PoolShape(name, nnodes, pool.workers_per_node or trainer.n_gpus_per_node,
                     auto_cpus if cpus == "auto" else cpus,
                     gpus_default if pool.gpus_per_worker is None else pool.gpus_per_worker, strategy,
                     tuple(sorted(pool.resources.items())))


def role_pools(trainer: Any, roles: tuple[str, ...] = ROLES) -> dict[str, str]:
    """role -> pool name, for the roles asked (an unset rollout pool is the actor's: the hybrid engine)."""
    return {role: getattr(trainer.placement, role) or trainer.placement.actor for role in roles}


def pool_shapes(trainer: Any, roles: tuple[str, ...] = ROLES, gpus_default: int = 0) -> dict[str, PoolShape]:
    """The pools that hold at least one of ``roles`` (the roles this run uses), in role order."""
    names = list(dict.fromkeys(role_pools(trainer, roles).values()))
    auto_cpus = auto_cpus_per_worker(sum((trainer.pools.get(n) or PoolConfig()).workers_per_node
                                         or trainer.n_gpus_per_node for n in names))
    return {name: _shape(name, trainer.pools.get(name), trainer, gpus_default, auto_cpus) for name in names}


def auto_cpus_per_worker(workers_per_node: int, cores: int | None = None) -> int:
    """``cpus_per_worker: auto``: the cores this process may use (``cores.available_cores``: the
    machine's, or a pipeline stage's share of them) shared evenly by the workers of one node, at
    least 1 each. Pools are counted as if they shared the node, so separate pools never ask for more
    threads than there are cores."""
    cores = cores if cores is not None else available_cores()
    return max(1, cores // max(1, workers_per_node))


def check_placement(trainer: Any) -> None:
    """Every role placed on a defined pool, every defined pool used, shapes that can exist."""
    for name in trainer.pools:
        if not _POOL_NAME.match(str(name)):
            raise UserError(f"key 'trainer.pools.{name}': a pool name is letters, digits, '_', '.', '-' "
                            f"(at most 64, not starting with a symbol)")
    known = {DEFAULT_POOL, *trainer.pools}
    for role, name in role_pools(trainer).items():
        if name not in known:
            raise UserError(f"key 'trainer.placement.{role}' names pool {name!r}, which is not defined; "
                            f"expected one of {', '.join(sorted(known))} (define it under trainer.pools)")
    used = set(role_pools(trainer).values())
    for name in trainer.pools:
        if name not in used:
            raise UserError(f"key 'trainer.pools.{name}': no role is placed on it; name it in "
                            f"trainer.placement.actor / critic / rm / rollout, or remove it")
    for name, pool in trainer.pools.items():
        for resource, amount in pool.resources.items():
            if resource in ("CPU", "GPU", "memory") or isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                    or amount <= 0:
                raise UserError(f"key 'trainer.pools.{name}.resources.{resource}': expected a custom resource name "
                                f"with a positive amount (CPUs and GPUs have their own keys), got {amount!r}")
    for name in used:
        shape = _shape(name, trainer.pools.get(name), trainer, 0, auto_cpus=1)  # cores play no part here
        if shape.strategy == "STRICT_PACK" and shape.nnodes > 1:
            key = f"trainer.pools.{name}.strategy" if name in trainer.pools else "trainer.nnodes"
            raise UserError(f"key {key!r}: STRICT_PACK puts every worker on one node, but the pool spans "
                            f"{shape.nnodes} nodes; use STRICT_SPREAD, SPREAD or PACK")


def pool_size_key(trainer: Any, name: str, default: str = "trainer.nnodes x trainer.n_gpus_per_node") -> str:
    """The config key that sizes pool ``name`` (for error messages): its ``trainer.pools`` entry,
    else ``default`` (the pool that the top-level trainer keys size)."""
    return f"trainer.pools.{name}" if name in trainer.pools else default


def pool_key(trainer: Any, role: str) -> str:
    """The config key that sets the size of ``role``'s pool."""
    return pool_size_key(trainer, getattr(trainer.placement, role))
