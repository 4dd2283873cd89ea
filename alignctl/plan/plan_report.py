"""Printing a memory plan: a rich table per device, a JSON record, and the one-line pre-flight error."""

from __future__ import annotations

from typing import Any

from alignctl.plan.estimate import Plan
from alignctl.plan.memory import GIB


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f}"


def plan_record(plan: Plan, changes: list[tuple[str, int]]) -> dict[str, Any]:
    """Everything the table shows, in bytes (``alignctl plan --json``)."""
    return {"device": plan.device, "workers": plan.world, "device_memory": plan.device_memory,
            "peak": plan.peak, "peak_phase": plan.peak_phase, "fits": plan.fits,
            "roles": {r.name: {"resident": r.resident, "phases": r.phases} for r in plan.roles},
            "pools": {p.name: {"workers": p.world, "roles": [r.name for r in p.roles], "peak": p.peak,
                               "peak_phase": p.peak_phase} for p in plan.pools},
            "what_ifs": [{"overrides": text, "peak": peak} for text, peak in changes]}


def print_plan(plan: Plan, changes: list[tuple[str, int]]) -> None:
    from rich.table import Table

    from alignctl.console import console

    pooled = len(plan.pools) > 1
    workers = ", ".join(f"{p.name} {p.world}" for p in plan.pools) if pooled else str(plan.world)
    table = Table(title=f"memory per {plan.device} worker (GiB), {workers} worker(s)")
    for column in (("pool",) if pooled else ()) + ("role", "part", "kind", "GiB"):
        table.add_column(column, justify="right" if column == "GiB" else "left")
    for pool in plan.pools:
        for role in pool.roles:
            lead = (pool.name,) if pooled else ()
            for part, size in role.resident.items():
                table.add_row(*lead, role.name, part, "resident", gib(size))
            for phase, parts in role.phases.items():
                for part, size in parts.items():
                    table.add_row(*lead, role.name, part, f"during {phase}", gib(size))
    out = console
    out.print(table)
    if pooled:
        for pool in plan.pools:
            out.print(f"pool {pool.name} ({'+'.join(r.name for r in pool.roles)}): peak {gib(pool.peak)} GiB "
                      f"({pool.peak_phase})")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    out.print(f"peak {gib(plan.peak)} GiB (all resident parts + {plan.peak_phase}) of {gib(plan.device_memory)} GiB "
              f"per worker: {verdict}")
    for text, peak in changes:
        out.print(f"  {text}  ->  peak {gib(peak)} GiB")


def fit_error(plan: Plan, changes: list[tuple[str, int]]) -> str:
    """The pre-flight error: one line naming the peak, the memory and the first change that fits."""
    fixes = [text for text, peak in changes if plan.device_memory is None or peak <= plan.device_memory]
    hint = f"; it would fit with {fixes[0]}" if fixes else "; see `alignctl plan` for what lowers it"
    return (f"plan: the run needs about {gib(plan.peak)} GiB per {plan.device} worker (peak in "
            f"{plan.peak_phase}) but {gib(plan.device_memory)} GiB is available{hint} "
            f"(--no-preflight skips this check)")
