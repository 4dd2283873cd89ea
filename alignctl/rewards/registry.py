"""The default scorer: pick the rule scorer from the row's ``data_source`` (verl's convention).

    openai/gsm8k, gsm8k   -> GSM8K, strict ``#### N`` extraction
    arith                 -> GSM8K strict (the synthetic arithmetic task answers as ``#### N``)
    *math* (any case)     -> math-verify (lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
                             HuggingFaceH4/MATH-500, math, ...)

Anything else is a UserError: silently scoring an unknown source as 0 would train on a reward
that is constant, which looks like a bad run rather than a config mistake.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from alignctl.errors import UserError

GSM8K_SOURCES = ("openai/gsm8k", "gsm8k", "arith")
MATH_SOURCE_EXAMPLES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")


def scorer_name(data_source: str) -> str:
    """``"gsm8k"`` or ``"math"`` for a known data source; UserError otherwise."""
    if data_source in GSM8K_SOURCES:
        return "gsm8k"
    if "math" in data_source.lower():
        return "math"
    known = ", ".join((*GSM8K_SOURCES, *MATH_SOURCE_EXAMPLES))
    raise UserError(
        f"no default reward scorer for data_source {data_source!r} (known: {known}, or any name "
        "containing 'math'); set custom_reward_function.path to score it"
    )


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    math_timeout_s: float | None = None,
) -> float:
    """verl-signature scorer dispatching on ``data_source``. ``math_timeout_s`` bounds one math
    verification (default ``alignctl.rewards.math.DEFAULT_TIMEOUT_S``)."""
    del extra_info  # part of the signature; the rule scorers do not need it
    if scorer_name(data_source) == "gsm8k":
        from alignctl.rewards import gsm8k

        return gsm8k.compute_score(solution_str, str(ground_truth), method="strict")
    from alignctl.rewards import math as math_scorer

    return math_scorer.compute_score(solution_str, str(ground_truth), timeout_s=math_timeout_s)


def answer_format_share(data_sources: Sequence[str], responses: Sequence[str]) -> float | None:
    """Share of the responses to GSM8K-family prompts (gsm8k, arith) that end in a parseable
    ``#### N``, right or wrong: the format curve that the strict reward (format counts only
    together with correctness) keeps apart from accuracy. None when no prompt is of that family."""
    from alignctl.rewards.gsm8k import extract_answer

    formatted = [extract_answer(text, "strict") is not None
                 for source, text in zip(data_sources, responses) if source in GSM8K_SOURCES]
    return sum(formatted) / len(formatted) if formatted else None


def default_vote_keys(data_source: str, responses: Sequence[str], *,
                      math_timeout_s: float | None = None) -> list[Hashable | None]:
    """The final answer each response votes with in maj@k, keyed so that answers the default
    scorer treats as equal get equal keys (None: no answer, no vote). GSM8K: the strict ``#### N``
    number as a Decimal; MATH: :func:`alignctl.rewards.math.vote_keys` (math-verify equivalence).
    UserError for a source without a default scorer, as :func:`default_compute_score`."""
    if scorer_name(data_source) == "gsm8k":
        from alignctl.rewards.gsm8k import extract_answer, parse_number

        answers = [extract_answer(text, "strict") for text in responses]
        return [parse_number(a) if a is not None else None for a in answers]
    from alignctl.rewards import math as math_scorer

    return list(math_scorer.vote_keys(responses, timeout_s=math_timeout_s))
