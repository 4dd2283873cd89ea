"""GSM8K rule scorer: pull the final number out of a response and compare it, as a number, with
the ground truth.

Two extraction methods, as in verl:

- ``strict``: the response must state its answer as ``#### N`` (GSM8K's own format, which the
  prompt asks for); the last such line wins. Anything else is "no answer".
- ``flexible``: the last number in the response, whatever surrounds it.

Only the last ``CLIP_CHARS`` characters are looked at. The answer is stated at the end; a long
response (a rambling or looping chain of thought) is full of intermediate numbers and stray
``####`` fragments, and scanning all of it would both reward answers buried mid-text and cost
time linear in a response length the policy controls.

Numbers are compared as ``Decimal`` values, not strings, so ``18``, ``18.0``, ``$18`` and
``18.`` agree, as do ``1,800`` and ``1800`` or ``0.50`` and ``.5``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

Method = Literal["strict", "flexible"]

CLIP_CHARS = 300

# A number as people (and models) write it: optional sign and dollar sign in either order,
# thousands separators only in groups of three ("1,2,3" is a list, not 123), optional decimals.
_NUMBER = r"-?\$?-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\$?-?\.\d+"
_STRICT = re.compile(r"####\s*(" + _NUMBER + r")")
_FLEXIBLE = re.compile(_NUMBER)


def extract_answer(response: str, method: Method = "strict") -> str | None:
    """The final answer in ``response`` as written (e.g. ``"$1,800"``), or None when there is none."""
    tail = response[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
    elif method == "flexible":
        found = _FLEXIBLE.findall(tail)
    else:
        raise ValueError(f"unknown GSM8K extraction method {method!r} (expected 'strict' or 'flexible')")
    return found[-1] if found else None


def parse_number(text: str) -> Decimal | None:
    """``text`` as a Decimal after dropping ``$``, ``,``, spaces and a trailing ``.``; None when it
    is not a finite number."""
    cleaned = text.replace("$", "").replace(",", "").replace(" ", "").strip().rstrip(".")
    if cleaned.startswith("--"):
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def same_number(answer: str, ground_truth: str) -> bool:
    """True when both parse and are equal as numbers; anything unparsable is "not equal"."""
    a, b = parse_number(answer), parse_number(ground_truth)
    return a is not None and b is not None and a == b


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` for a correct final answer, ``format_score`` for an extracted but wrong one, 0
    when no answer could be extracted."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return score if same_number(answer, str(ground_truth)) else format_score
