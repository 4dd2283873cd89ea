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

The module is also the one home of the MATH final answer as text: :func:`last_boxed` (used by
the MATH preprocessor for ground truths and by eval for votes) and :func:`vote_keys`, which
groups the answers of several responses by this scorer's own equivalence for maj@k.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from alignctl.rewards.pool import CallResult, FailureTally, ScoringPool, in_worker, record_failure

DEFAULT_TIMEOUT_S = 10.0
# Enough for any honest answer; an exploding sympy expression hits MemoryError instead.
WORKER_MEMORY_LIMIT_MB = 4096

_POOL: ScoringPool | None = None
_POOL_LOCK = threading.Lock()
_TOTALS = FailureTally()


# A box command followed by its argument: `\boxed{...}`, `\boxed {...}` or `\boxed 5`.
_BOX = re.compile(r"\\(?:boxed|fbox)(?=[\s{])")


class BoxError(ValueError):
    """The last box of a text is malformed (unbalanced braces, empty)."""


def _closing_brace(text: str, start: int) -> int:
    """Index of the ``}`` matching the ``{`` at ``start``. A backslash escapes the next character,
    so ``\\{`` / ``\\}`` are literal braces and ``\\\\`` (a LaTeX line break) does not escape."""
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise BoxError("unbalanced braces in the last \\boxed{...}")


def last_boxed(text: str) -> str | None:
    """Content (stripped) of the last ``\\boxed``/``\\fbox`` in ``text``, found by real brace
    matching: ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``, ``\\boxed{\\{1,2\\}}`` gives ``\\{1,2\\}``.
    None when there is no box; raises :class:`BoxError` when the last box is malformed."""
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        content = text[i + 1: _closing_brace(text, i)]
    else:
        # `\boxed 5$`: the argument runs to the closing `$` (or the end of the line).
        content = re.split(r"[$\n]", text[i:], maxsplit=1)[0]
    content = content.strip()
    if not content:
        raise BoxError("the last \\boxed{} is empty")
    return content


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
                preload=("math_verify", "alignctl.rewards.math_scorer"),
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


def vote_keys(responses: Sequence[str], timeout_s: float | None = None) -> list[str | None]:
    """The answer each response votes with in maj@k, answers this scorer calls equal sharing a key.

    A response's answer is its last box (None, no vote, when it has none or a malformed one).
    Answers are grouped greedily in order: each joins the first group whose first answer it
    matches, either as the same text up to spaces or by :func:`compute_score` (the answer, boxed,
    scored against the group's first answer as ground truth), so ``\\frac{1}{2}``, ``0.5`` and
    ``1/2`` share a key. A group's key is its first answer with spaces removed. Each comparison
    runs in the scoring pool under ``timeout_s``; one that times out counts as "different"."""
    keys: list[str | None] = []
    groups: dict[str, str] = {}  # key -> the group's first answer as written
    seen: dict[str, str] = {}  # answer without spaces -> its key (one comparison per distinct answer)
    for response in responses:
        try:
            answer = last_boxed(response)
        except BoxError:
            answer = None
        if answer is None:
            keys.append(None)
            continue
        text = "".join(answer.split())
        if text not in seen:
            boxed = "\\boxed{" + answer + "}"
            key = next((k for k, first in groups.items() if compute_score(boxed, first, timeout_s) >= 1.0), text)
            groups.setdefault(key, answer)
            seen[text] = key
        keys.append(seen[text])
    return keys


def timeout_count() -> int:
    """Math verifications that hit their timeout in this process so far."""
    return _TOTALS.timeouts


def crash_count() -> int:
    """Math verifications whose worker process died (e.g. a C-level crash) in this process so far."""
    return _TOTALS.crashes
