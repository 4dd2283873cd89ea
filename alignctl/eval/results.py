"""What an evaluation produced: headline numbers as attributes, per-prompt samples, JSON form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.pipeline.manifest import jsonable


@dataclass
class EvalResults:
    """Results of :func:`alignctl.eval.evaluate` / :func:`alignctl.eval.run_eval`.

    Rewards are reward-model scores (standardised when the model carries train-rm's mean/std);
    lengths are in characters of the decoded response. Fields are None when their input was not
    given (no reference -> no win rate; no reward model -> no rewards; no ground truth -> no
    accuracy).
    """

    num_prompts: int
    n: int
    # Win rate of the policy over the reference (ties count half) and its 95% bootstrap interval.
    win_rate: float | None = None
    win_rate_ci: tuple[float, float] | None = None
    lc_win_rate: float | None = None
    length_slope: float | None = None  # logistic slope per std of the length difference
    wins: int = 0
    ties: int = 0
    losses: int = 0
    # The same comparison by a second reward model that did not train the policy (judge_model).
    judge_win_rate: float | None = None
    judge_win_rate_ci: tuple[float, float] | None = None
    # The same comparison judged by the rule scorer on prompts with a ground truth: a right answer
    # beats a wrong one, anything else ties. What a judge that knew every answer would say, so a
    # reward-model win rate can be read against it (None without ground truth).
    rule_win_rate: float | None = None
    rule_win_rate_ci: tuple[float, float] | None = None
    # On the pairs where the rule marks exactly one answer right (decisive_pairs of them), how often
    # the reward model (rm_rule_agreement) and the judge (judge_rule_agreement) score the right one
    # higher: 0.5 is blind to correctness, and such a model's win rate cannot show an accuracy gain
    # (alignctl.eval.stats, "Rule agreement").
    rm_rule_agreement: float | None = None
    judge_rule_agreement: float | None = None
    # The same for a causal LM's summed log-probability of each answer (eval's likelihood_model).
    likelihood_rule_agreement: float | None = None
    decisive_pairs: int = 0
    # Whether reward_model is the one the policy was trained against (from the policy's manifest;
    # None when unknown), and disagreements between the win rate and a gold signal.
    rm_trained_policy: bool | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Reward-model scores.
    mean_reward: float | None = None
    reference_mean_reward: float | None = None
    reward_std: float | None = None
    reference_reward_std: float | None = None
    reward_quantiles: dict[str, float] = field(default_factory=dict)
    reference_reward_quantiles: dict[str, float] = field(default_factory=dict)
    rewards_normalized: bool = False
    # Responses.
    mean_length: float = 0.0
    reference_mean_length: float | None = None
    truncated_fraction: float = 0.0
    reference_truncated_fraction: float | None = None
    # Share of responses that repeat one phrase (alignctl.eval.repetition).
    repetition_rate: float = 0.0
    reference_repetition_rate: float | None = None
    # Rule accuracy per data source ({"pass@1", "pass@k", "maj@k", "num_prompts"}).
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)
    reference_accuracy: dict[str, dict[str, float]] = field(default_factory=dict)
    # Reward-model accuracy on held-out preference pairs.
    preference_accuracy: float | None = None
    preference: dict[str, float] = field(default_factory=dict)
    # RL run curves: {key: [[step, value], ...]} and a first/last/min/max summary.
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    curve_summary: dict[str, dict[str, float]] = field(default_factory=dict)
    # One entry per prompt: prompt, ground truth, and each model's responses with scores.
    samples: list[dict[str, Any]] = field(default_factory=list)
    skipped_prompts: int = 0
    rm_truncated: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    out_dir: Path | None = None
    # role -> the earlier eval output its responses were taken from (reuse_generations).
    reused_generations: dict[str, str] = field(default_factory=dict)
    # What each model generated, with its fingerprint: written to generations.json, not results.json.
    generations: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> dict[str, float]:
        """Flat numeric metrics (the manifest's ``metrics`` and the console table)."""
        out: dict[str, float] = {"num_prompts": float(self.num_prompts), "n": float(self.n)}
        for key in ("win_rate", "lc_win_rate", "judge_win_rate", "rule_win_rate", "rm_rule_agreement",
                    "judge_rule_agreement", "likelihood_rule_agreement", "mean_reward", "reference_mean_reward",
                    "preference_accuracy", "mean_length", "reference_mean_length", "repetition_rate",
                    "reference_repetition_rate"):
            value = getattr(self, key)
            if value is not None:
                out[key] = float(value)
        if self.win_rate_ci is not None:
            out["win_rate_ci_low"], out["win_rate_ci_high"] = self.win_rate_ci
        if self.judge_win_rate_ci is not None:
            out["judge_win_rate_ci_low"], out["judge_win_rate_ci_high"] = self.judge_win_rate_ci
        if self.rule_win_rate_ci is not None:
            out["rule_win_rate_ci_low"], out["rule_win_rate_ci_high"] = self.rule_win_rate_ci
        if self.decisive_pairs:
            out["decisive_pairs"] = float(self.decisive_pairs)
        out["warnings"] = float(len(self.warnings))
        for prefix, table in (("accuracy", self.accuracy), ("reference_accuracy", self.reference_accuracy)):
            for source, metrics in table.items():
                for name, value in metrics.items():
                    if name != "num_prompts":
                        out[f"{prefix}/{source}/{name}"] = value
        return out

    def __str__(self) -> str:
        """The headline numbers as a two-column text table (``print(results)``)."""
        rows = self.headline()
        width = max(len(key) for key in rows)
        reference = self.config.get("reference") or "none"
        lines = [f"EvalResults: {self.num_prompts} prompts x {self.n}, policy {self.config.get('policy')}, "
                 f"reference {reference}"]
        lines += [f"  {key:<{width}}  {number_text(value)}" for key, value in rows.items()]
        return "\n".join(lines)

    __repr__ = __str__  # the dataclass repr would print every sample

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite floats become strings, paths strings)."""
        data = dataclasses.asdict(self)
        del data["generations"]  # written beside results.json, for a later eval's reuse_generations
        data["out_dir"] = str(self.out_dir) if self.out_dir is not None else None
        return jsonable(data)


def number_text(value: float) -> str:
    """A headline number as shown in tables: whole numbers without decimals, others to 4 places."""
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}"
