"""The default scorer: pick the rule scorer from the row's ``data_source`` (verl's convention).

``RULE_SCORERS`` is the table, in lookup order; each entry declares the data sources it scores
and its two functions (the score, and the answer a response votes with in maj@k):

    gsm8k   openai/gsm8k, gsm8k, arith -> strict ``#### N`` extraction (the synthetic arithmetic
            task answers as ``#### N``)
    math    any source containing "math" (any case) -> math-verify (lighteval/MATH,
            DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500, math, ...)

Anything else is a UserError: silently scoring an unknown source as 0 would train on a reward
that is constant, which looks like a bad run rather than a config mistake. Other tasks bring a
custom reward function (``custom_reward_function.path``), which also runs in the scoring pool's
processes; this table is not extended at run time, because those processes import only this
module.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from alignctl.errors import UserError

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k", "arith")
MATH_SOURCE_EXAMPLES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")


def _gsm8k_score(solution_str: str, ground_truth: Any, timeout_s: float | None) -> float:
    from alignctl.rewards import gsm8k_scorer as gsm8k

    return gsm8k.compute_score(solution_str, str(ground_truth), method="strict")


def _gsm8k_votes(responses: Sequence[str], timeout_s: float | None) -> list[Hashable | None]:
    from alignctl.rewards.gsm8k_scorer import extract_answer, parse_number

    answers = [extract_answer(text, "strict") for text in responses]
    return [parse_number(a) if a is not None else None for a in answers]


def _math_score(solution_str: str, ground_truth: Any, timeout_s: float | None) -> float:
    from alignctl.rewards import math_scorer

    return math_scorer.compute_score(solution_str, str(ground_truth), timeout_s=timeout_s)


def _math_votes(responses: Sequence[str], timeout_s: float | None) -> list[Hashable | None]:
    from alignctl.rewards import math_scorer

    return list(math_scorer.vote_keys(responses, timeout_s=timeout_s))


@dataclass(frozen=True)
class RuleScorer:
    """A built-in scorer and the data sources it takes (``matches``; ``examples`` for errors).
    ``score(solution, ground_truth, timeout_s)`` and ``vote_keys(responses, timeout_s)`` import
    their scorer module on first use, so that importing this table stays light."""

    name: str
    matches: Callable[[str], bool]
    examples: tuple[str, ...]
    score: Callable[[str, Any, float | None], float]
    vote_keys: Callable[[Sequence[str], float | None], list[Hashable | None]]


RULE_SCORERS = (
    RuleScorer("gsm8k", lambda source: source in GSM8K_SOURCES, GSM8K_SOURCES, _gsm8k_score, _gsm8k_votes),
    RuleScorer("math", lambda source: "math" in source.lower(), MATH_SOURCE_EXAMPLES, _math_score, _math_votes),
)


def rule_scorer(data_source: str) -> RuleScorer:
    """The first entry of ``RULE_SCORERS`` taking ``data_source``; UserError when none does."""
    for scorer in RULE_SCORERS:
        if scorer.matches(data_source):
            return scorer
    known = ", ".join(example for scorer in RULE_SCORERS for example in scorer.examples)
    raise UserError(
        f"no default reward scorer for data_source {data_source!r} (known: {known}, or any name "
        "containing 'math'); set custom_reward_function.path to score it"
    )


def scorer_name(data_source: str) -> str:
    """``"gsm8k"`` or ``"math"`` for a known data source; UserError otherwise."""
    return rule_scorer(data_source).name


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    math_timeout_s: float | None = None,
) -> float:
    """verl-signature scorer dispatching on ``data_source``. ``math_timeout_s`` bounds one math
    verification (default ``alignctl.rewards.math_scorer.DEFAULT_TIMEOUT_S``)."""
    del extra_info  # part of the signature; the rule scorers do not need it
    return rule_scorer(data_source).score(solution_str, ground_truth, math_timeout_s)


def answer_format_share(data_sources: Sequence[str], responses: Sequence[str]) -> float | None:
    """Share of the responses to GSM8K-family prompts (gsm8k, arith) that end in a parseable
    ``#### N``, right or wrong: the format curve that the strict reward (format counts only
    together with correctness) keeps apart from accuracy. None when no prompt is of that family."""
    from alignctl.rewards.gsm8k_scorer import extract_answer

    formatted = [extract_answer(text, "strict") is not None
                 for source, text in zip(data_sources, responses) if source in GSM8K_SOURCES]
    return sum(formatted) / len(formatted) if formatted else None


def default_vote_keys(data_source: str, responses: Sequence[str], *,
                      math_timeout_s: float | None = None) -> list[Hashable | None]:
    """The final answer each response votes with in maj@k, keyed so that answers the default
    scorer treats as equal get equal keys (None: no answer, no vote). GSM8K: the strict ``#### N``
    number as a Decimal; MATH: :func:`alignctl.rewards.math_scorer.vote_keys` (math-verify equivalence).
    UserError for a source without a default scorer, as :func:`default_compute_score`."""
    return rule_scorer(data_source).vote_keys(responses, math_timeout_s)
