"""The cheap audit checks ``train-rm`` runs before it trains (``audit: true``, the default).

Only what needs the files and nothing else: empty fields, chosen == rejected, exact duplicate
pairs, held-out prompts that also appear in the training pairs (leakage between
``data.train_files`` and ``data.val_files``), and a length bias (how often the chosen reply is
longer, in characters). Near duplicates (MinHash) and label errors (a reward model's scores) are
left to ``alignctl audit``, which says which rows; this prints one warning line per finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alignctl.audit import checks
from alignctl.audit.pairs import read_pairs, read_test_prompts


@dataclass
class QuickAudit:
    rows: int
    flagged: dict[str, int] = field(default_factory=dict)  # check -> rows
    length_bias: dict[str, float | bool] = field(default_factory=dict)

    def lines(self, where: str) -> list[str]:
        """One warning per finding (none for clean data)."""
        out = [f"{where}: {name.replace('_', ' ')}: {count} of {self.rows} pairs ({100 * count / self.rows:.1f}%)"
               for name, count in self.flagged.items() if count]
        if self.length_bias.get("biased"):
            out.append(f"{where}: length bias: the chosen reply is longer in "
                       f"{100 * float(self.length_bias['longer_share_of_unequal']):.1f}% of pairs of different "
                       f"lengths; a reward model can learn 'longer is better'")
        return out

    def metrics(self) -> dict[str, float]:
        out = {f"audit/{name}_rows": float(count) for name, count in self.flagged.items()}
        if self.length_bias:
            out["audit/chosen_longer_share"] = float(self.length_bias["longer_share_of_unequal"])
        return out


def quick_audit(train_files: list[str], val_files: list[str]) -> QuickAudit:
    pairs = [pair for path in train_files for pair in read_pairs(path)[0]]
    duplicates = checks.exact_duplicate_groups(pairs)
    flagged = {
        "empty": len(checks.empty_fields(pairs)),
        "identical": len(checks.identical_pairs(pairs)),
        "exact_duplicate": sum(len(group) - 1 for group in duplicates),  # rows beyond the first copy
    }
    if val_files:
        held_out = [prompt for path in val_files for prompt in read_test_prompts(path)]
        flagged["held_out_prompt_in_train"] = len(checks.leaked_prompts(pairs, held_out))
    bias = checks.length_bias([len(p.chosen) for p in pairs], [len(p.rejected) for p in pairs])
    return QuickAudit(len(pairs), flagged, bias)
