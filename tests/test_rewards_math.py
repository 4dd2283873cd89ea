"""math-verify scorer: an equivalence fixture and adversarial inputs under the hard timeout, from
a non-main thread and inside a Ray worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from alignctl.rewards import math_scorer
from alignctl.rewards.pool import collect_failures
from alignctl.rewards.rule_scorers import default_compute_score

TIMEOUT_S = 1.5
# Killing the worker, reaping it and starting its successor takes milliseconds; thread hand-off
# and a busy 2-core machine get the rest of the slack.
SLACK_S = 1.0

# (response, ground truth, equivalent?) - the expected values are the mathematical truth.
EQUIVALENCE = [
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"The answer is $1/2$", r"\frac{1}{2}", True),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", True),
    (r"\boxed{0.25}", r"\frac{1}{4}", True),
    (r"\boxed{0.2}", r"\frac{1}{4}", False),
    (r"\boxed{[1, 3)}", "[1,3)", True),
    (r"\boxed{(1, 3]}", "[1,3)", False),
    (r"\boxed{(-\infty, 2) \cup (3, \infty)}", r"(-\infty,2)\cup(3,\infty)", True),
    (r"\boxed{\{1, 2, 3\}}", r"\{3, 2, 1\}", True),
    (r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", False),
    (r"\boxed{10\text{ cm}}", "10", True),
    (r"\boxed{30^\circ}", "30", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    (r"\boxed{-3}", "3", False),
    (r"\boxed{\pi}", "3.14", False),
    (r"Long work... so the final answer is $\boxed{7}$.", "7", True),
    (r"\boxed{3}", "$3$", True),  # ground truth already in math delimiters
    ("no answer here", "5", False),
]

ADVERSARIAL = {
    "power tower": r"The answer is \boxed{9^{9^{9^{9}}}}",
    "100k nested braces": r"\boxed{" + "{" * 49_995 + "}" * 49_995 + "}",
    "100k nested fractions": r"\boxed{" + r"\frac{1}{" * 10_000 + "2" + "}" * 10_000 + "}",
}


@pytest.fixture(scope="module", autouse=True)
def warm_pool() -> Iterator[None]:
    # Worker start-up (~1 s) is not part of an item's timeout; start the workers up front.
    math_scorer.warm_up()
    yield


def _in_thread(fn: Callable[[], Any]) -> tuple[Any, float, str]:
    """Run ``fn`` in a fresh (non-main) thread; return its result, wall time and thread name."""
    out: dict[str, Any] = {}

    def target() -> None:
        start = time.monotonic()
        out["value"] = fn()
        out["wall"] = time.monotonic() - start
        out["thread"] = threading.current_thread().name

    thread = threading.Thread(target=target, name="scorer-thread")
    thread.start()
    thread.join()
    return out["value"], out["wall"], out["thread"]


@pytest.mark.parametrize(("response", "truth", "expected"), EQUIVALENCE)
def test_equivalence_fixture(response: str, truth: str, expected: bool) -> None:
    assert math_scorer.compute_score(response, truth) == (1.0 if expected else 0.0)


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_input_returns_zero_within_the_timeout_from_a_thread(name: str) -> None:
    math_scorer.warm_up()  # the previous case's killed worker has a successor starting
    before = math_scorer.timeout_count()
    score, wall, thread = _in_thread(lambda: math_scorer.compute_score(ADVERSARIAL[name], "2", timeout_s=TIMEOUT_S))
    assert thread == "scorer-thread"
    assert score == 0.0
    assert TIMEOUT_S <= wall < TIMEOUT_S + SLACK_S
    assert math_scorer.timeout_count() == before + 1


def test_long_honest_answer_is_scored_not_timed_out() -> None:
    response = "Let me think. " * 7_000 + r"So the answer is \boxed{\frac{3}{4}}."
    assert len(response) > 98_000
    score, wall, _ = _in_thread(lambda: math_scorer.compute_score(response, "0.75", timeout_s=TIMEOUT_S))
    assert score == 1.0 and wall < TIMEOUT_S


def test_collect_failures_counts_only_this_threads_timeouts() -> None:
    math_scorer.warm_up()
    with collect_failures() as tally:
        assert math_scorer.compute_score(ADVERSARIAL["power tower"], "1", timeout_s=0.5) == 0.0
        assert math_scorer.compute_score(r"\boxed{1}", "1", timeout_s=TIMEOUT_S) == 1.0
    assert (tally.timeouts, tally.crashes) == (1, 0)


def test_concurrent_threads_get_their_own_answers() -> None:
    results: dict[int, float] = {}

    def score(i: int) -> None:
        results[i] = math_scorer.compute_score(rf"\boxed{{{i}}}", str(i if i % 2 else i + 1))

    threads = [threading.Thread(target=score, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: (1.0 if i % 2 else 0.0) for i in range(6)}


def test_registry_routes_math_sources_to_math_verify() -> None:
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"):
        assert default_compute_score(source, r"so $\boxed{\dfrac{1}{2}}$", "0.5") == 1.0
        assert default_compute_score(source, r"so $\boxed{\dfrac{1}{3}}$", "0.5") == 0.0


def test_hard_timeout_holds_inside_a_ray_worker() -> None:
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        result = ray.get(_ray_adversarial_task(ray).remote(ADVERSARIAL["power tower"], TIMEOUT_S), timeout=120)
    finally:
        if started_here:
            ray.shutdown()
    assert result["score"] == 0.0
    assert TIMEOUT_S <= result["wall"] < TIMEOUT_S + SLACK_S
    assert result["timeouts"] == 1
    assert result["honest"] == 1.0


def _ray_adversarial_task(ray: Any) -> Any:
    @ray.remote
    def task(response: str, timeout_s: float) -> dict[str, Any]:
        import threading as th
        import time as tm

        from alignctl.rewards import math_scorer as scorer

        scorer.warm_up()
        before = scorer.timeout_count()  # Ray may reuse a worker process between tasks
        out: dict[str, Any] = {}

        def run() -> None:  # a non-main thread of the Ray worker process
            start = tm.monotonic()
            out["score"] = scorer.compute_score(response, "2", timeout_s=timeout_s)
            out["wall"] = tm.monotonic() - start

        worker = th.Thread(target=run)
        worker.start()
        worker.join()
        out["timeouts"] = scorer.timeout_count() - before
        # The pool still answers after a kill; a generous budget since the replacement worker may be
        # slow to start on a loaded machine (this checks recovery, not speed).
        out["honest"] = scorer.compute_score(r"\boxed{2}", "2", timeout_s=30.0)
        return out

    return task
