"""Degenerate repetition in generated text: the share of responses that say the same phrase over
and over ("I'm a man. I'm a man. I'm a man."). A reward model that does not punish it lets RL drift
there; a judge trained on similar pairs may not punish it either, so eval counts it on its own.
Pure functions of the texts (no models)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

PHRASE_WORDS = 4  # a phrase: this many consecutive whitespace-separated words
REPEATS = 3  # a response is repetitive when one phrase occurs this many times or more
RISE = 0.10  # eval warns when the policy's share exceeds the reference's by this much


def is_repetitive(text: str, words: int = PHRASE_WORDS, repeats: int = REPEATS) -> bool:
    """Whether some run of ``words`` consecutive words occurs ``repeats`` times or more (overlaps count)."""
    tokens = text.split()
    phrases = Counter(tuple(tokens[i:i + words]) for i in range(len(tokens) - words + 1))
    return bool(phrases) and max(phrases.values()) >= repeats


def repetition_rate(texts: Iterable[str]) -> float:
    """The share of ``texts`` that are repetitive (0.0 for none)."""
    flags = [is_repetitive(t) for t in texts]
    return sum(flags) / len(flags) if flags else 0.0


def repetition_warning(policy_rate: float, reference_rate: float | None) -> str | None:
    """A warning line when the policy repeats itself clearly more often than the reference."""
    if reference_rate is None or policy_rate - reference_rate < RISE:
        return None
    return (f"degenerate repetition: {policy_rate:.1%} of the policy's responses repeat a {PHRASE_WORDS}-word phrase "
            f"{REPEATS}+ times, against {reference_rate:.1%} of the reference's; read the samples before trusting "
            f"the win rate (a reward model may not punish it)")
