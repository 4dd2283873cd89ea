"""MATH-style scorer on math-verify, with a hard per-item timeout.

Equivalence is math-verify's: the ground truth is parsed as LaTeX (wrapped in ``\\boxed{}`` when
it is bare), the response with LaTeX and plain-expression extraction, and the two are compared
symbolically and numerically, so ``\\frac{1}{2}``, ``\\dfrac12``, ``0.5`` and ``1/2`` agree, as do
intervals, sets, units in ``\\text{}`` and degrees.

math-verify's own timeouts (``parsing_timeout``, ``timeout_seconds``) use ``signal.alarm`` and
raise off the main thread, so they are switched off here; instead every call runs in a
persistent worker process (``pool.ScoringPool``) that is killed when it overruns. A timeout
or a crashed worker scores 0.0 and is counted: ``timeout_count()`` / ``crash_count()`` for the
whole process, ``pool.collect_failures()`` for one block of code.

math-verify is imported only inside the worker process, never by ``import alignctl.rewards``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from alignctl.rewards.pool import CallResult, FailureTally, ScoringPool, in_worker, record_failure

DEFAULT_TIMEOUT_S = 10.0
# Enough for any honest answer; an exploding sympy expression hits MemoryError instead.
WORKER_MEMORY_LIMIT_MB = 4096

_POOL: ScoringPool | None = None
_POOL_LOCK = threading.Lock()
_TOTALS = FailureTally()


class _DropDisabledTimeoutWarning(logging.Filter):
    """math-verify warns once per process that its (signal) timeout is off; ours is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_DROP_WARNING = _DropDisabledTimeoutWarning()


def _wrap_ground_truth(ground_truth: str) -> str:
    text = ground_truth.strip()
    if "\\boxed" in text or (text.startswith("$") and text.endswith("$") and len(text) > 1):
        return text
    return "\\boxed{" + text + "}"


def is_equivalent(solution_str: str, ground_truth: str) -> bool:
    """math-verify equivalence of the response's final answer and the ground truth. No timeout:
    call it only where something else bounds its time (a worker process)."""
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DROP_WARNING)  # same instance: added once
    gold = math_verify.parse(
        _wrap_ground_truth(str(ground_truth)),
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=None,  # type: ignore[arg-type]
    )
    if not gold:
        return False
    answer = math_verify.parse(
        solution_str,
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,  # type: ignore[arg-type]
    )
    return bool(math_verify.verify(gold, answer, timeout_seconds=None))


def _score_in_process(solution_str: str, ground_truth: str) -> float:
    return 1.0 if is_equivalent(solution_str, ground_truth) else 0.0


def shared_pool() -> ScoringPool:
    """The process-wide math worker pool (created on first use; workers start lazily)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ScoringPool(
                max_workers=max(1, min(4, os.cpu_count() or 1)),
                preload=("math_verify", "alignctl.rewards.math"),
                memory_limit_mb=WORKER_MEMORY_LIMIT_MB,
            )
        return _POOL


def warm_up() -> None:
    """Start the shared pool's workers now (the first call otherwise waits ~1 s for start-up)."""
    shared_pool().warm_up()


def compute_score(solution_str: str, ground_truth: str, timeout_s: float | None = None) -> float:
    """1.0 when the response's final answer equals ``ground_truth``, else 0.0; 0.0 (counted) when
    verification takes longer than ``timeout_s`` (default ``DEFAULT_TIMEOUT_S``) or crashes.

    Safe from any thread and inside Ray workers. Inside a scoring worker (a reward manager's
    process pool) it runs directly, because the manager already holds a timeout on the item.
    """
    if in_worker():
        return _score_in_process(solution_str, ground_truth)
    result: CallResult = shared_pool().call(
        _score_in_process, (solution_str, str(ground_truth)), DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    )
    if not result.ok:
        record_failure(result, _TOTALS)
        return 0.0
    value: Any = result.value
    return float(value)


def timeout_count() -> int:
    """Math verifications that hit their timeout in this process so far."""
    return _TOTALS.timeouts


def crash_count() -> int:
    """Math verifications whose worker process died (e.g. a C-level crash) in this process so far."""
    return _TOTALS.crashes
