"""The training-health monitor (issue 17): every alarm on synthetic metric streams, with the
step it must fire at computed by hand from the documented rule, and one real RL run where a
``stop`` alarm checkpoints and ends the run with exit 1."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from alignctl.monitor import Monitor, Thresholds, response_diversity
from alignctl.trainers.checkpoint_folders import complete_checkpoints
from conftest import run_cli
from rl_helpers import make_assets, read_metrics


def _fired(stream: list[dict[str, float]], **thresholds: float) -> list[tuple[int, str]]:
    """Feed ``stream`` (one metrics dict per step, steps 1..n); (step, alarm) of every alarm."""
    monitor = Monitor(Thresholds(**thresholds))
    return [(a.step, a.name) for step, m in enumerate(stream, 1) for a in monitor.observe(step, m)]


def test_entropy_collapse_fires_once_when_recent_mean_falls_below_a_tenth_of_start():
    # W=2: start = mean(1.0, 1.0) = 1.0. Recent means: step 4 (1.0+0.5)/2=0.75, step 5 (0.5+0.05)/2=0.275,
    # step 6 (0.05+0.05)/2 = 0.05 < 0.1 -> fires at step 6 only, and stays quiet while it lasts.
    stream = [{"actor/entropy": v} for v in (1.0, 1.0, 1.0, 0.5, 0.05, 0.05, 0.04)]
    assert _fired(stream, window=2) == [(6, "entropy_collapse")]


def test_no_rule_fires_before_two_windows_of_data():
    stream = [{"actor/entropy": v} for v in (1.0, 1.0, 1.0, 0.0, 0.0)]
    # W=3 needs 6 values: a collapse at steps 4-5 is not judged yet.
    assert _fired(stream, window=3) == []


def test_an_alarm_re_arms_after_its_condition_cleared():
    lengths = [10, 10, 30, 30, 10, 10, 30, 30]
    # W=2, start 10, length_high 2: recent at step 4 = 30 > 2x -> fire; step 6 = 10 clears; step 8 = 30 fires again.
    assert _fired([{"response_length/mean": v} for v in lengths], window=2, length_high=2.0) == [
        (4, "length_blowup"), (8, "length_blowup")]


def test_length_collapse_below_the_fraction_of_start():
    # The default fraction 0.75, W=2, start 40: recent (35+31)/2 = 33 < 30? no; (30+29)/2 = 29.5 < 30: fires.
    assert _fired([{"response_length/mean": v} for v in (40, 40, 35, 31)], window=2) == []
    assert _fired([{"response_length/mean": v} for v in (40, 40, 30, 29)], window=2) == [(4, "length_collapse")]
    stream = [{"response_length/mean": v} for v in (40, 40, 30, 19)]  # recent (30+19)/2=24.5 < 20? no
    assert _fired(stream, window=2, length_low=0.5) == []
    stream = [{"response_length/mean": v} for v in (40, 40, 21, 18)]  # recent 19.5 < 0.5 x 40 = 20
    assert _fired(stream, window=2, length_low=0.5) == [(4, "length_collapse")]


def test_mode_collapse_when_few_responses_are_distinct():
    stream = [{"monitor/unique_in_batch": v} for v in (0.9, 0.5, 0.2, 0.1)]
    # W=2, no start needed: recent means 0.7 (step 2), 0.35 (step 3), 0.15 < 0.25 at step 4.
    assert _fired(stream, window=2) == [(4, "mode_collapse")]


def test_kl_over_budget():
    stream = [{"actor/reference_kl": v} for v in (0.1, 0.4, 0.7, 0.2)]
    # W=2: recent 0.25, 0.55 > 0.5 at step 3, then 0.45 clears.
    assert _fired(stream, window=2) == [(3, "kl_budget")]


def test_reward_hacking_rm_score_up_while_rule_score_falls():
    rm = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7]
    rule = [0.50, 0.50, 0.50, 0.48, 0.44, 0.40]
    stream = [{"reward/rm_score/mean": r, "reward/rule_score/mean": g} for r, g in zip(rm, rule)]
    # W=2: judged from step 2W = 4 over the last 4W = 8 steps (all of them here), x = 0..n-1.
    # Step 4: y = .5 .5 .5 .48, Sxx = 5, sum (x - 1.5)(y - .495) = -.03 -> slope -.006, fitted fall
    #   .018 < .05. Step 5: Sxx = 10, slope -.14 / 10 = -.014, fall .056; residuals -.012 .002 .016 .010
    #   -.016 -> SSR .00076, se = sqrt(.00076 / 3 / 10) = .00503, t = -2.78 > -3: no.
    # Step 6: Sxx = 17.5, slope -.35 / 17.5 = -.02, fall .10; residuals -.02 0 .02 .02 0 -.02 -> SSR
    #   .0016, se = sqrt(.0016 / 4 / 17.5) = .00478, t = -4.18 <= -3, rm slope > 0 -> fires at step 6.
    assert _fired(stream, window=2) == [(6, "reward_hacking")]


def test_reward_hacking_against_the_accuracy_a_custom_reward_reports():
    """A custom reward returning {"score": acc + bonus, "acc": acc}: the score is the proxy, the
    logged acc the gold signal (same numbers as the rule-score test above, same firing step)."""
    score = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7]
    acc = [0.50, 0.50, 0.50, 0.48, 0.44, 0.40]
    stream = [{"critic/score/mean": r, "reward/extra/acc/mean": g} for r, g in zip(score, acc)]
    assert _fired(stream, window=2) == [(6, "reward_hacking")]
    honest = [{"critic/score/mean": g, "reward/extra/acc/mean": g} for g in [0.5, 0.4, 0.6, 0.3, 0.7, 0.2]]
    assert _fired(honest, window=2) == []  # score == acc: the proxy cannot rise while the gold falls


def test_reward_hacking_needs_the_proxy_to_rise():
    rule = [0.5, 0.5, 0.3, 0.2]
    stream = [{"reward/rm_score/mean": 0.5, "reward/rule_score/mean": g} for g in rule]
    assert _fired(stream, window=2) == []  # gold fell, proxy flat: a bad run, not hacking


def test_reward_hacking_against_validation_accuracy():
    key = "val-core/arith/acc/mean@1"
    stream = [{key: 0.45}, {"critic/score/mean": 0.1}, {"critic/score/mean": 0.1}, {key: 0.47},
              {"critic/score/mean": 0.5}, {"critic/score/mean": 0.6}, {key: 0.39}]
    # W=2: the score rose (0.1 -> 0.55) and accuracy fell from its first value 0.45 to 0.39
    # (0.06 >= 0.05) at step 7; at step 4 it had risen.
    assert _fired(stream, window=2) == [(7, "reward_hacking")]


def test_tool_collapse_when_the_policy_stops_calling_tools():
    calls = [0.9, 0.9, 0.8, 0.9, 0.9, 0.2, 0.0, 0.0]
    stream = [{"multi_turn/calls_per_sample": c} for c in calls]
    # W=2: start 0.9. Step 6: recent (0.9 + 0.2) / 2 = 0.55 >= 0.25 x 0.9 = 0.225. Step 7: recent
    # (0.2 + 0.0) / 2 = 0.1 < 0.225 -> fires at step 7 (once: step 8 continues the same condition).
    assert _fired(stream, window=2) == [(7, "tool_collapse")]


def test_every_alarm_has_a_config_name():
    from alignctl.config.rl import MONITOR_ALARMS
    from alignctl.monitor import ALARM_NAMES

    assert set(MONITOR_ALARMS) == set(ALARM_NAMES)


def test_non_finite_numbers_fire_at_once():
    assert _fired([{"actor/pg_loss": 0.3}, {"actor/pg_loss": math.nan, "actor/grad_norm": math.inf}]) == \
        [(2, "non_finite")]


def test_ignore_policy_silences_one_alarm():
    monitor = Monitor(Thresholds(window=1), policies={"kl_budget": "ignore"})
    assert monitor.observe(1, {"actor/reference_kl": 9.0, "actor/pg_loss": math.inf})[0].name == "non_finite"


def test_response_diversity_counts_distinct_responses_by_hand():
    responses = torch.tensor([[5, 6, 0], [5, 6, 0], [7, 0, 0], [5, 6, 9]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    groups = torch.tensor([0, 0, 1, 1])
    got = response_diversity(responses, mask, groups)
    # distinct: (5,6), (7,), (5,6,9) -> 3 of 4; group 0 has one repeat of 2 (0.5), group 1 none (0).
    assert got == {"monitor/unique_in_batch": 0.75, "monitor/dup_in_group": 0.25, "monitor/responses": 4.0}


@pytest.mark.slow
def test_a_stop_alarm_checkpoints_then_ends_the_run(tmp_path: Path):
    """A real two-step GRPO run with a KL budget no update can meet: the alarm fires at step 2
    (step 1's KL loss is 0: the policy still equals the reference when it is measured), the run saves
    a checkpoint at that step and exits 1 naming the alarm; metrics.jsonl marks the alarm."""
    assets = make_assets(tmp_path / "assets", num_train=16, num_test=4)
    run = tmp_path / "run"
    result = run_cli("grpo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
                     f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={assets['reward']}",
                     f"trainer.run_dir={run}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                     "actor_rollout_ref.rollout.n=2", "data.max_response_length=8", "trainer.total_training_steps=4",
                     "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
                     "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=1e-2",
                     "monitor.window=1", "monitor.kl_budget=1e-9", "monitor.policies={kl_budget: stop}")
    assert result.code == 1, result.stderr[-2000:]
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "stopped by the monitor at step 2: kl_budget" in ours[0], result.stderr[-2000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/kl_loss"] == 0.0 and rows[1]["monitor/alarm/kl_budget"] == 1.0
    assert "monitor/alarm/kl_budget" not in rows[0]
    assert [step for step, _ in complete_checkpoints(run / "checkpoints")] == [2]


def test_noisy_rule_score_alone_is_not_hacking():
    """A rule score that only wobbles (one batch's accuracy: +-0.08 around 0.6) while the reward
    model's score rises: no alarm. A first version compared with the best W-mean and fired here."""
    rule = [0.60, 0.68, 0.52, 0.64, 0.56, 0.66, 0.53, 0.61, 0.55, 0.58, 0.52, 0.60]
    stream = [{"reward/rm_score/mean": 0.1 * i, "reward/rule_score/mean": g} for i, g in enumerate(rule)]
    # W=4, judged at steps 8..12 over all steps so far: the fitted line falls by 0.03-0.07, with a
    # slope t between -0.4 and -1.4 (computed with alarms._slope): noise, not a trend.
    assert _fired(stream) == []


ACC_REWARD = '''
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    match = re.search(r"####\\s*(-?\\d+)", solution_str)
    acc = float(match is not None and match.group(1) == str(ground_truth))
    digits = sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
    return {"score": acc + digits, "acc": acc}
'''


@pytest.mark.slow
def test_the_baseline_is_measured_before_step_1_and_read_back_on_resume(tmp_path: Path):
    """GRPO on the tiny model with a reward that reports acc: before step 1 the reference policy
    answers 6 prompts (monitor.baseline_prompts=5, rounded up to the 2 workers) x 2; the baseline
    holds their numbers and step 1's, and a resumed run reads it back instead of measuring the
    trained policy."""
    import json

    assets = make_assets(tmp_path / "assets", num_train=16, num_test=4)
    reward = tmp_path / "acc_reward.py"
    reward.write_text(ACC_REWARD)
    run = tmp_path / "run"

    def grpo(steps: int):
        return run_cli("grpo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
                       f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={reward}",
                       f"trainer.run_dir={run}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.rollout.n=2", "data.max_response_length=8", f"trainer.total_training_steps={steps}",
                       "trainer.n_gpus_per_node=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
                       "trainer.save_freq=1", "trainer.stop_on_flat_reward=false", "monitor.baseline_prompts=5")

    first = grpo(1)
    assert first.code == 0, first.stderr[-2000:]
    assert "monitor baseline: 6 prompts x 2" in first.stdout + first.stderr
    saved = json.loads((run / "monitor_baseline.json").read_text())
    assert (saved["responses"], saved["prompts"], saved["group_size"]) == (12, 6, 2)
    assert saved["gold_key"] == "reward/extra/acc/mean" and 0 <= saved["gold"] <= 1
    assert 1 <= saved["length"] <= 8 and saved["entropy"] > 0 and 0 < saved["unique"] <= 1
    assert saved["proxy_key"] == "critic/score/mean" and saved["seconds"] > 0
    row = read_metrics(run)[0]
    assert row["monitor/responses"] == 8.0
    again = grpo(2)
    assert again.code == 0, again.stderr[-2000:]
    assert "monitor baseline:" not in again.stdout + again.stderr
    assert json.loads((run / "monitor_baseline.json").read_text()) == saved
