"""The audit's outputs: ``summary.json``, ``flagged.jsonl``, ``report.html`` and the console table.

The HTML page is rendered with the reports' jinja environment (alignctl.templating; autoescaping on, so dataset
text with markup shows as text) from ``alignctl/resources/templates/audit.html.j2``, shipped in the
package.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.audit.checks import PairText, finite_or_none

HTML_TEMPLATE = "audit.html.j2"
SNIPPET_CHARS = 300  # of each text in flagged.jsonl / the HTML page; the row index finds the rest
EXAMPLES_PER_CHECK = 5  # flagged rows the page shows for each check (all of them are in flagged.jsonl)


@dataclass
class CheckResult:
    """One check: its name, whether it blocks (--strict), its rule, and flagged row -> detail."""

    name: str
    blocking: bool
    rule: str
    rows: dict[int, str]
    ran: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, total: int) -> dict[str, Any]:
        return {"ran": self.ran, "blocking": self.blocking, "rule": self.rule, "flagged": len(self.rows),
                "fraction": len(self.rows) / total if total else 0.0, "note": self.note, **self.extra}


@dataclass
class AuditResult:
    data: str
    test: str | None
    rows: int
    out: str
    max_length: int
    checks: list[CheckResult] = field(default_factory=list)
    length_bias: dict[str, dict[str, Any]] = field(default_factory=dict)
    reward_model: dict[str, Any] | None = None
    likelihood: dict[str, Any] | None = None  # --likelihood-model: its own likelihood's accuracy
    scores: dict[int, tuple[float, float]] = field(default_factory=dict)
    samples: dict[int, PairText] = field(default_factory=dict)

    def flagged_rows(self) -> list[int]:
        return sorted({i for check in self.checks for i in check.rows})

    def blocking_problems(self) -> dict[str, int]:
        """Check name -> flagged rows, for the blocking checks that flagged any (what --strict exits on)."""
        return {c.name: len(c.rows) for c in self.checks if c.blocking and c.rows}

    def warnings(self) -> list[str]:
        out = [f"length bias ({unit}): chosen is longer in {100 * b['longer_share_of_unequal']:.1f}% of pairs "
               f"of different lengths" for unit, b in self.length_bias.items() if b.get("biased")]
        rm = self.reward_model or {}
        if rm.get("accuracy_all") is not None and rm.get("accuracy_length_matched") is not None \
                and rm["accuracy_all"] - rm["accuracy_length_matched"] > 0.1:
            out.append(f"reward model accuracy drops from {100 * rm['accuracy_all']:.1f}% to "
                       f"{100 * rm['accuracy_length_matched']:.1f}% on length-matched pairs: it may reward length")
        lik = self.likelihood or {}
        best = max((v for v in (lik.get("accuracy_sum"), lik.get("accuracy_mean")) if v is not None), default=None)
        if best is not None and rm.get("accuracy_all") is not None and best - rm["accuracy_all"] > 0.1:
            out.append(f"the language model's own likelihood ranks {100 * best:.1f}% of pairs right, the reward model "
                       f"{100 * rm['accuracy_all']:.1f}%: the reward model misses what that language model knows")
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "data": self.data, "test": self.test, "rows": self.rows, "max_length": self.max_length,
            "flagged_rows": len(self.flagged_rows()),
            "checks": {c.name: c.summary(self.rows) for c in self.checks},
            "length_bias": self.length_bias,
            "reward_model": None if self.reward_model is None else
            {k: finite_or_none(v) if isinstance(v, float) else v for k, v in self.reward_model.items()},
            "likelihood": self.likelihood,
            "by_group": group_rows(self),
            "blocking": self.blocking_problems(), "warnings": self.warnings(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    def flagged_records(self) -> list[dict[str, Any]]:
        """One record per flagged row: its index, reasons (check + detail), short texts, RM scores."""
        by_row: dict[int, list[dict[str, str]]] = {}
        for check in self.checks:
            for i, detail in check.rows.items():
                by_row.setdefault(i, []).append({"check": check.name, "detail": detail})
        records = []
        for i in sorted(by_row):
            pair = self.samples.get(i)
            record: dict[str, Any] = {"row": i, "reasons": by_row[i]}
            if pair is not None:
                record.update({k: _snippet(getattr(pair, k)) for k in ("prompt", "chosen", "rejected")})
            if i in self.scores:
                record["score_chosen"], record["score_rejected"] = self.scores[i]
            records.append(record)
        return records


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"


def write_report(result: AuditResult, folder: str | Path) -> None:
    """Write summary.json, flagged.jsonl and report.html into ``folder``."""
    from alignctl.templating import template_environment

    folder = Path(folder)
    summary = result.summary()
    records = result.flagged_records()
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    with (folder / "flagged.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    html = template_environment(True).get_template(HTML_TEMPLATE).render(
        s=summary, findings=findings(result, records), total_flagged=len(records), examples=EXAMPLES_PER_CHECK)
    (folder / "report.html").write_text(html, encoding="utf-8")


def findings(result: AuditResult, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per check that flagged rows: its name, rule, count, share and its first
    :data:`EXAMPLES_PER_CHECK` flagged records (a finding on every row reads as its count and a few
    examples, not a page of rows)."""
    by_row = {record["row"]: record for record in records}
    out = []
    for check in result.checks:
        if check.rows:
            rows = sorted(check.rows)
            out.append({"name": check.name, "rule": check.rule, "blocking": check.blocking, "flagged": len(rows),
                        "share": len(rows) / max(result.rows, 1),
                        "examples": [{**by_row[i], "detail": check.rows[i]} for i in rows[:EXAMPLES_PER_CHECK]]})
    return out


def summary_rows(result: AuditResult) -> list[list[Any]]:
    """Rows of the console table: check, flagged, share, blocking, rule or why it did not run."""
    rows = []
    for check in result.checks:
        flagged = str(len(check.rows)) if check.ran else "—"
        share = f"{100 * len(check.rows) / max(result.rows, 1):.1f}%" if check.ran else "—"
        rows.append([check.name, flagged, share, "yes" if check.blocking else "no",
                     check.rule if check.ran else f"skipped: {check.note}"])
    return rows


def group_rows(result: AuditResult) -> list[list[Any]]:
    """One row per --group-key value: pairs, then the RM's and the likelihood's accuracy ('—' when not run)."""
    tables = [(result.reward_model or {}).get("by_group"), (result.likelihood or {}).get("by_group_sum"),
              (result.likelihood or {}).get("by_group_mean")]
    names = sorted({name for table in tables if table for name in table})
    rows = []
    for name in names:
        pairs = next(table[name]["pairs"] for table in tables if table and name in table)
        rows.append([name, pairs] + ["—" if not table or name not in table else f"{100 * table[name]['accuracy']:.1f}%"
                                     for table in tables])
    return rows


def print_audit_report(result: AuditResult) -> None:
    from alignctl.console import console, print_table

    print_table(f"audit of {result.data}: {result.rows} pairs -> {result.out}",
                ["check", "flagged", "share", "blocking", "rule"], summary_rows(result))
    bias_rows = [[unit, f"{100 * b['chosen_longer']:.1f}%", f"{100 * b['chosen_shorter']:.1f}%",
                  f"{100 * b['equal']:.1f}%", f"{b['mean_chosen']:.1f} / {b['mean_rejected']:.1f}",
                  "yes" if b["biased"] else "no"] for unit, b in result.length_bias.items()]
    print_table("length bias", ["unit", "chosen longer", "chosen shorter", "equal", "mean chosen / rejected",
                                "biased"], bias_rows)
    rm = result.reward_model
    if rm is not None:
        print_table(f"reward model {rm['path']} (lengths in {rm['length_unit']})", ["pairs", "accuracy", "count"],
                    [[name, "—" if rm[f"accuracy_{name}"] is None else f"{100 * rm[f'accuracy_{name}']:.1f}%",
                      rm[f"pairs_{name}"]] for name in ("all", "length_matched", "chosen_longer", "chosen_shorter")])
    lik = result.likelihood
    if lik is not None:
        print_table(f"likelihood of the reply under {lik['path']}", ["pairs", "accuracy (sum)", "accuracy (mean)"],
                    [[lik["pairs"]] + ["—" if lik[k] is None else f"{100 * lik[k]:.1f}%"
                                       for k in ("accuracy_sum", "accuracy_mean")]])
    by_group = group_rows(result)
    if by_group:
        print_table("accuracy by group (--group-key)", ["group", "pairs", "reward model", "likelihood (sum)",
                                                        "likelihood (mean)"], by_group)
    for warning in result.warnings():
        console.print(f"[yellow]warning:[/yellow] {warning}")
