"""The report leads with its verdict: the accuracy change with a paired interval, the independent
judge before the training reward model, samples chosen to inform, curves a reader can read."""

from __future__ import annotations

import numpy as np

from alignctl.eval.curves import PANELS, legend_label, panel_series
from alignctl.eval.plots import _informative_band
from alignctl.eval.report_summary import accuracy_change, choose_samples, verdict
from alignctl.eval.results import EvalResults
from alignctl.eval.stats import bootstrap_ci


def _sample(i: int, policy: tuple[str, bool, float], reference: tuple[str, bool, float]) -> dict:
    def resp(text: str, correct: bool, reward: float) -> dict:
        return {"text": text, "correct": correct, "reward": reward, "length": len(text), "truncated": False}

    return {"index": i, "prompt": f"q{i}", "data_source": "arith", "ground_truth": "1",
            "policy": [resp(*policy)], "reference": [resp(*reference)]}


SAMPLES = [
    _sample(0, ("#### 1", True, 1.0), ("#### 2", False, 0.0)),   # only the policy right
    _sample(1, ("#### 3", False, 0.2), ("#### 1", True, 0.9)),   # only the reference right
    _sample(2, ("#### 1", True, 1.0), ("#### 1", True, 1.0)),    # identical: left out
    _sample(3, ("#### 4", False, 0.7), ("#### 5", False, 0.1)),  # both wrong, scored apart
    _sample(4, ("#### 1", True, 0.5), ("1", True, 0.5)),          # both right, same score
    _sample(5, ("#### 1", True, 0.8), ("#### 6", False, 0.3)),   # only the policy right
]


def test_accuracy_change_by_hand():
    """policy right on prompts 0, 2, 4, 5 (4/6); reference on 1, 2, 4 (3/6): +1/6; the interval is
    the bootstrap of the paired differences [1, -1, 0, 0, 0, 1] with the same seed."""
    change = accuracy_change(SAMPLES, num_bootstrap=500, seed=3)
    assert change.prompts == 6 and change.policy == 4 / 6 and change.reference == 3 / 6
    assert abs(change.change - 1 / 6) < 1e-12
    assert change.change_ci == bootstrap_ci(np.array([1.0, -1.0, 0.0, 0.0, 0.0, 1.0]), num_resamples=500, seed=3)
    assert change.change_ci[0] < change.change < change.change_ci[1]


def _results(**fields) -> EvalResults:
    return EvalResults(num_prompts=6, n=1, samples=SAMPLES, config={"seed": 0}, **fields)


def test_verdict_puts_accuracy_then_the_judge_then_the_training_reward_model():
    change = accuracy_change(SAMPLES, num_bootstrap=500, seed=3)
    results = _results(judge_win_rate=0.608, judge_win_rate_ci=(0.558, 0.652), win_rate=0.781,
                       win_rate_ci=(0.703, 0.859), rm_trained_policy=True)
    low, high = (f"{100 * v:+.1f}" for v in change.change_ci)
    assert verdict(results, change) == (
        f"Held-out accuracy 50.0% → 66.7%, +16.7 points [95% CI {low}, {high}]; an independent judge prefers "
        f"the policy 60.8% [55.8%, 65.2%]; the reward model it was trained on (not independent) prefers it "
        f"78.1% [70.3%, 85.9%].")
    plain = _results(win_rate=0.6, win_rate_ci=(0.5, 0.7), rm_trained_policy=False, warnings=["w"])
    assert verdict(plain, None) == "The reward model prefers it 60.0% [50.0%, 70.0%] — 1 warning below."


def test_samples_disagreements_first_identical_last_and_said():
    choice = choose_samples(_results(), limit=4)
    assert [s["index"] for s in choice.samples] == [0, 5, 1, 3]
    assert choice.how == ("Shown: 4 of them, prompts where only one model answered right first (2 where only the "
                          "policy did, then 1 where only the reference did), then 1 where the reward model scored "
                          "the two apart, then the rest in prompt order (1), and last 1 where both models wrote "
                          "the same answer.")
    assert [s["verdict"] for s in choice.samples] == ["win", "win", "loss", "win"]
    assert [s["index"] for s in choose_samples(_results(), limit=10).samples] == [0, 5, 1, 3, 4, 2]


def test_curves_read_as_words_and_ppo_gets_its_panels():
    ppo = {k: [(1.0, 0.1), (2.0, 0.2)] for k in (
        "critic/score/mean", "critic/vf_loss", "critic/vf_explained_var", "actor/ppo_kl", "actor/pg_clipfrac",
        "actor/grad_norm", "critic/grad_norm", "actor/lr", "critic/lr", "actor/reference_kl")}
    titles = [title for title, _ in panel_series(ppo)]
    assert titles == ["Reward (mean, p10 / p50 / p90)", "KL to reference", "Policy update (KL old -> new)",
                      "Clip fraction", "Gradient norm", "Learning rate", "Value loss (critic)",
                      "Explained variance (critic)"]
    grpo = {"critic/score/mean": [(1.0, 0.1)], "actor/entropy": [(1.0, 2.0)]}
    assert "critic" not in " ".join(t.lower() for t, _ in panel_series(grpo))
    reward = next(p for p in PANELS if p.title.startswith("Reward"))
    assert reward.label("critic/score/mean") == "mean reward" and reward.ylabel == "reward"
    assert all(p.ylabel for p in PANELS if p.title != "Monitor alarms")
    assert legend_label("val-core/arith/acc/mean@1") == "arith acc mean@1"


def test_a_right_or_wrong_reward_gets_no_p10_p90_band():
    binary = [(1.0, 0.0), (2.0, 0.0)], [(1.0, 1.0), (2.0, 1.0)]
    spread = [(1.0, 0.1), (2.0, 0.2)], [(1.0, 0.8), (2.0, 0.9)]
    assert not _informative_band(*binary) and _informative_band(*spread)


def test_the_curve_table_names_each_metric_in_words(tmp_path):
    from alignctl.eval.report import write_report

    curves = {"critic/score/mean": [[1.0, 0.1], [2.0, 0.3]], "actor/entropy": [[1.0, 2.0], [2.0, 1.5]]}
    summary = {k: {"first": v[0][1], "last": v[-1][1], "min": 0.0, "max": 1.0, "steps": 2.0} for k, v in curves.items()}
    results = _results(curves=curves, curve_summary=summary)
    import dataclasses

    from alignctl.config.eval import EvalConfig

    results.config.update(dataclasses.asdict(EvalConfig(policy="p", reference="r", prompts="t.parquet", run="run")))
    write_report(results, tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert 'mean reward <span class="sub">(critic/score/mean)</span>' in html
    assert 'policy entropy <span class="sub">(actor/entropy)</span>' in html
    assert "| mean reward (`critic/score/mean`) |" in (tmp_path / "report.md").read_text()
