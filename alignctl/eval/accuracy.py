"""Rule accuracy of generated responses on rows that carry a ground truth.

Each response is scored with the default rule scorer of its row's ``data_source`` (GSM8K / arith
``#### N``, MATH via math-verify); a response is correct when it gets the full score 1. For maj@k
the responses vote with their final answer, grouped by the scorer's own equivalence
(:func:`alignctl.rewards.rule_scorers.default_vote_keys`): the GSM8K number as a Decimal (so ``1800``,
``1,800.0`` and ``$1800`` vote together) or, for math sources, the last ``\\boxed{}`` compared by
math-verify (so ``\\frac{1}{2}``, ``1/2`` and ``0.5`` vote together).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from alignctl.errors import UserError
from alignctl.eval.data import PromptRow
from alignctl.eval.stats import accuracy_table


def scorer_for(data_source: str) -> str | None:
    """``"gsm8k"`` / ``"math"``, or None when no rule scorer knows the source."""
    from alignctl.rewards.rule_scorers import scorer_name

    try:
        return scorer_name(data_source)
    except UserError:
        return None


def rule_accuracy(rows: Sequence[PromptRow], texts: Sequence[Sequence[str]]
                  ) -> tuple[dict[str, dict[str, float]], list[list[bool] | None]]:
    """({data_source: {"pass@1": ..., "pass@k": ..., "maj@k": ..., "num_prompts": ...}},
    per-prompt correctness (None where the row has no ground truth or no known scorer)).

    ``"all"`` is added when more than one data source was scored."""
    from alignctl.rewards.rule_scorers import default_compute_score, default_vote_keys

    correct: list[list[bool] | None] = []
    by_source: dict[str, tuple[list[list[bool]], list[list[Hashable | None]]]] = {}
    for row, samples in zip(rows, texts):
        scorer = scorer_for(row.data_source) if row.ground_truth is not None else None
        if scorer is None:
            correct.append(None)
            continue
        marks = [default_compute_score(row.data_source, t, row.ground_truth, row.extra_info) >= 1.0 for t in samples]
        correct.append(marks)
        flags, answers = by_source.setdefault(row.data_source, ([], []))
        flags.append(marks)
        answers.append(default_vote_keys(row.data_source, samples))
    table = {source: accuracy_table(flags, answers) for source, (flags, answers) in sorted(by_source.items())}
    if len(by_source) > 1:
        all_flags = [f for flags, _ in by_source.values() for f in flags]
        all_answers = [a for _, answers in by_source.values() for a in answers]
        table["all"] = accuracy_table(all_flags, all_answers)
    return table, correct
