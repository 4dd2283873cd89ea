"""Rule accuracy of generated responses on rows that carry a ground truth.

Each response is scored with the default rule scorer of its row's ``data_source`` (GSM8K / arith
``#### N``, MATH via math-verify); a response is correct when it gets the full score 1. For maj@k
the responses vote with their normalised final answer: the GSM8K number as a Decimal (so ``1800``,
``1,800.0`` and ``$1800`` vote together, as the scorer compares them) or the last ``\\boxed{}`` content
with spaces removed for math sources.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from alignctl.errors import UserError
from alignctl.eval.data import PromptRow
from alignctl.eval.stats import accuracy_table


def scorer_for(data_source: str) -> str | None:
    """``"gsm8k"`` / ``"math"``, or None when no rule scorer knows the source."""
    from alignctl.rewards.registry import scorer_name

    try:
        return scorer_name(data_source)
    except UserError:
        return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def answer_key(scorer: str, text: str) -> Hashable | None:
    """The normalised final answer a response votes with in maj@k (None: no answer)."""
    if scorer == "gsm8k":
        from alignctl.rewards.gsm8k import extract_answer, parse_number

        answer = extract_answer(text, "strict")
        return parse_number(answer) if answer is not None else None
    boxed = last_boxed(text)
    return "".join(boxed.split()) if boxed is not None else None


def rule_accuracy(rows: Sequence[PromptRow], texts: Sequence[Sequence[str]]
                  ) -> tuple[dict[str, dict[str, float]], list[list[bool] | None]]:
    """({data_source: {"pass@1": ..., "pass@k": ..., "maj@k": ..., "num_prompts": ...}},
    per-prompt correctness (None where the row has no ground truth or no known scorer)).

    ``"all"`` is added when more than one data source was scored."""
    from alignctl.rewards.registry import default_compute_score

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
        answers.append([answer_key(scorer, t) for t in samples])
    table = {source: accuracy_table(flags, answers) for source, (flags, answers) in sorted(by_source.items())}
    if len(by_source) > 1:
        all_flags = [f for flags, _ in by_source.values() for f in flags]
        all_answers = [a for _, answers in by_source.values() for a in answers]
        table["all"] = accuracy_table(all_flags, all_answers)
    return table, correct
