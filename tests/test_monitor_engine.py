"""The monitor's machinery alarms (alignctl/monitor/engine_rules.py): the rollout engine's
probabilities leaving the trainer's (mismatch KL k3, token probability ratio) and samples staler
than the asynchronous bound. Synthetic streams with the firing step worked out by hand from the
documented rule, then one tiny-model run where an engine planted by a plugin (it samples colder than
the trainer's temperature) fires both mismatch alarms at step 1 while the plain hf engine in float32
fires none."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from alignctl.monitor import Monitor, Thresholds
from alignctl.monitor.alarms import gold_and_proxy
from rl_helpers import make_assets, read_metrics, rl_config

K3, ABS = "rollout_corr/k3_kl", "rollout/log_prob_diff_mean"
ST_MEAN, ST_MAX = "rollout/staleness/mean", "rollout/staleness/max"


def _fired(stream: list[dict[str, float]], **thresholds) -> list[tuple[int, str]]:
    monitor = Monitor(Thresholds(**thresholds))
    return [(a.step, a.name) for step, m in enumerate(stream, 1) for a in monitor.observe(step, m)]


def test_mismatch_kl_fires_at_the_step_it_crosses_the_bound_and_re_arms():
    # Bound 0.01: steps 1-2 below, step 3 (0.02) over -> fires; step 4 stays over (no repeat);
    # step 5 back under clears it; step 6 over again fires again. A step without the metric is silent.
    k3 = [1e-9, 0.004, 0.02, 0.05, 0.001, 0.03]
    stream = [{K3: v} for v in k3] + [{}]
    assert _fired(stream) == [(3, "mismatch_kl"), (6, "mismatch_kl")]


def test_mismatch_kl_evidence_line_names_the_bound_k1_and_the_earlier_level():
    monitor = Monitor(Thresholds())
    monitor.observe(1, {K3: 0.001, "rollout_corr/kl": 0.001})
    (alarm,) = monitor.observe(2, {K3: 0.25, "rollout_corr/kl": 0.2})
    assert alarm.line() == ("step 2: mismatch_kl: rollout_corr/k3_kl 0.25 > bound 0.01 nats/token, k1 0.2; "
                            "at most 0.001 over steps 1-1: the rollout engine's probabilities are not the trainer's")


def test_token_prob_ratio_is_the_exponential_of_the_mean_absolute_log_prob_gap():
    # exp(ln 1.04) = 1.04 <= 1.05 stays quiet; exp(ln 1.06) = 1.06 > 1.05 fires at step 2.
    stream = [{ABS: math.log(1.04)}, {ABS: math.log(1.06), "rollout/log_prob_diff_max": math.log(3.0)}]
    monitor = Monitor(Thresholds())
    assert monitor.observe(1, stream[0]) == []
    (alarm,) = monitor.observe(2, stream[1])
    assert alarm.name == "token_prob_ratio"
    assert "1.06 > bound 1.05, worst token 3x; at most 1.04 over steps 1-1" in alarm.reason


def test_the_geometric_ratio_never_exceeds_nemo_rls_arithmetic_one():
    """The doc's claim: exp(mean |d|) <= mean exp(|d|) (Jensen), so the rule fires only where
    NeMo-RL's token_mult_prob_error would too. Checked on random gaps of several scales."""
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-4, 0.01, 0.1, 1.0):
        d = scale * torch.randn(4096, generator=generator, dtype=torch.float64)
        geometric, arithmetic = math.exp(float(d.abs().mean())), float(d.abs().exp().mean())
        assert geometric <= arithmetic + 1e-15


def test_a_healthy_float32_stream_and_a_synchronous_run_raise_nothing():
    # Float32 hf engine: gaps at rounding level (the tiny run below measures them); no staleness logged.
    stream = [{K3: 1e-12, "rollout_corr/kl": 1e-9, ABS: 2e-6, "rollout/log_prob_diff_max": 1e-5} for _ in range(20)]
    assert _fired(stream, max_staleness=2) == []
    assert Monitor(Thresholds()).summary_line() is None


def test_staleness_over_the_bound_is_an_alarm_and_the_summary_reports_it():
    # Bound 2: max staleness 0, 1, 2 are within it; 3 at step 4 fires (a bug in the loop).
    stream = [{ST_MEAN: m, ST_MAX: x} for m, x in ((0.0, 0), (0.5, 1), (1.25, 2), (1.5, 3), (1.0, 2))]
    monitor = Monitor(Thresholds(max_staleness=2))
    fired = [a for step, m in enumerate(stream, 1) for a in monitor.observe(step, m)]
    assert [(a.step, a.name) for a in fired] == [(4, "staleness_bound")]
    assert fired[0].reason.startswith("rollout/staleness/max 3 (mean 1.50) > max_staleness 2")
    summary = monitor.summary()
    # mean of the per-step means (0 + 0.5 + 1.25 + 1.5 + 1.0) / 5 = 0.85; largest 3; one step over 2.
    assert summary["staleness"] == {"mean": pytest.approx(0.85), "max": 3.0, "bound": 2, "steps_over_bound": 1}
    assert summary["alarms"] == [fired[0].line()]
    assert monitor.summary_line() == "monitor: staleness mean 0.85, max 3 (bound 2, 1 steps over)"


def test_without_a_bound_staleness_is_reported_but_never_judged():
    monitor = Monitor(Thresholds())
    assert monitor.observe(1, {ST_MEAN: 5.0, ST_MAX: 9}) == []
    assert monitor.summary()["staleness"]["max"] == 9.0 and monitor.summary()["staleness"]["bound"] is None


FRESH_K3, FRESH_ABS, SHARE = "rollout_corr/fresh/k3_kl", "rollout/fresh/log_prob_diff_mean", "rollout/fresh/share"


def test_an_async_step_is_judged_on_its_fresh_responses():
    """The async seed-0 run's step 16: the whole batch's k3 0.0111 (over 0.01) came from its stale
    responses (the policy's own change); the fresh ones' gap is float32 rounding -> no alarm. A fresh
    gap over the bound fires with the note; a step with no fresh response is not judged."""
    stale_only_gap = {K3: 0.0111, ABS: 0.013, FRESH_K3: 1e-9, FRESH_ABS: 1e-6, SHARE: 0.625, ST_MAX: 1}
    assert Monitor(Thresholds()).observe(1, stale_only_gap) == []
    monitor = Monitor(Thresholds())
    fired = monitor.observe(1, {K3: 0.2, ABS: 0.2, FRESH_K3: 0.05, "rollout_corr/fresh/kl": 0.04,
                                FRESH_ABS: 0.1, SHARE: 0.25, ST_MAX: 1})
    assert [a.name for a in fired] == ["mismatch_kl", "token_prob_ratio"]
    assert fired[0].reason.startswith("rollout_corr/fresh/k3_kl 0.05 > bound 0.01 nats/token, k1 0.04 (the "
                                      "step's fresh responses, 25% of it; stale ones also hold the policy's own change)")
    assert Monitor(Thresholds()).observe(1, {K3: 0.5, ABS: 0.5, SHARE: 0.0, ST_MAX: 1}) == []
    # A step of the asynchronous loop whose responses are all fresh is judged on the whole batch.
    assert [a.name for a in Monitor(Thresholds()).observe(1, {K3: 0.5, SHARE: 1.0, ST_MAX: 0})] == ["mismatch_kl"]


def test_the_summary_of_an_async_run_keeps_the_engines_own_gap():
    # Step 1 all fresh (0.002), step 2 mixed (fresh 0.003, whole 0.02), step 3 only stale (0.05): 0.003.
    monitor = Monitor(Thresholds())
    monitor.observe(1, {K3: 0.002, SHARE: 1.0})
    monitor.observe(2, {K3: 0.02, FRESH_K3: 0.003, SHARE: 0.5})
    monitor.observe(3, {K3: 0.05, SHARE: 0.0})
    assert monitor.summary()["rollout_mismatch"] == {"k3_kl_max": 0.003}


def test_the_fresh_mismatch_is_measured_on_the_fresh_rows_only():
    """rollout_mismatch_metrics on a batch of 2 fresh rows (version 3, the trainer's) and 2 stale ones
    (version 2): the stale rows' gap is 0.5 a token, the fresh rows' 0.1; masks keep 2 tokens a row.
    By hand: all rows |d| mean (0.1 x 4 + 0.5 x 4) / 8 = 0.3; fresh 0.1; share 0.5."""
    from alignctl.batch import Batch
    from alignctl.trainers.metrics import rollout_mismatch_metrics

    old = torch.zeros(4, 3)
    engine = torch.tensor([[-0.1, -0.1, 9.0], [-0.1, -0.1, 9.0], [-0.5, -0.5, 9.0], [-0.5, -0.5, 9.0]])
    mask = torch.tensor([[1, 1, 0]] * 4)
    batch = Batch({"old_log_probs": old, "rollout_log_probs": engine, "response_mask": mask,
                   "policy_version": torch.tensor([3, 3, 2, 2])}, meta={"old_log_probs_from": "recomputed"})
    metrics = rollout_mismatch_metrics(batch, 3)
    assert metrics["rollout/log_prob_diff_mean"] == pytest.approx(0.3)
    assert metrics["rollout/fresh/log_prob_diff_mean"] == pytest.approx(0.1)
    assert metrics["rollout/fresh/share"] == 0.5 and "rollout_corr/fresh/k3_kl" in metrics
    assert metrics["rollout_corr/fresh/k3_kl"] < metrics["rollout_corr/k3_kl"]
    synchronous = rollout_mismatch_metrics(batch)  # no trainer version given: no split
    assert not any("fresh" in k for k in synchronous)


def test_the_summary_keeps_the_largest_mismatch():
    monitor = Monitor(Thresholds())
    for step, (k3, diff) in enumerate([(0.001, 0.01), (0.004, 0.03), (0.002, 0.02)], 1):
        monitor.observe(step, {K3: k3, ABS: diff})
    assert monitor.summary()["rollout_mismatch"] == {"k3_kl_max": 0.004, "token_prob_ratio_max": pytest.approx(math.exp(0.03))}


def test_the_config_keys_reach_the_monitor_and_a_stop_policy_applies():
    from alignctl.config import load_config
    from alignctl.config.rl import MonitorConfig

    cfg = load_config(MonitorConfig, None, ["mismatch_kl=0.2", "prob_ratio=1.5", "policies={mismatch_kl: stop}"])
    monitor = Monitor.from_config(cfg, max_staleness=1)
    assert (monitor.thresholds.mismatch_kl, monitor.thresholds.prob_ratio, monitor.thresholds.max_staleness) == (0.2, 1.5, 1)
    assert monitor.thresholds.window == cfg.window and monitor.thresholds.kl_budget == cfg.kl_budget
    assert monitor.observe(1, {K3: 0.1}) == []  # under the raised bound
    (alarm,) = monitor.observe(2, {K3: 0.3})
    assert alarm.policy == "stop"
    defaults = Monitor.from_config(MonitorConfig()).thresholds
    assert defaults == Thresholds()  # the config's defaults are the rules' defaults


def test_a_custom_rewards_acc_is_the_gold_even_beside_a_reward_model():
    """With a reward model and a custom reward reporting acc (the exploit suite's PPO stage), the
    rule score holds the bonus: acc is the gold and the whole score the proxy."""
    assert gold_and_proxy({"reward/rm_score/mean", "reward/rule_score/mean", "reward/extra/acc/mean"}) == (
        "reward/extra/acc/mean", "critic/score/mean")
    assert gold_and_proxy({"reward/rm_score/mean", "reward/rule_score/mean"}) == (
        "reward/rule_score/mean", "reward/rm_score/mean")
    assert gold_and_proxy({"reward/rm_score/mean"}) == (None, "reward/rm_score/mean")
    assert gold_and_proxy({"critic/score/mean"}) == (None, "critic/score/mean")


# ------------------------------------------------------------------ a real run with a planted mismatch

HOT_ENGINE = '''
from dataclasses import replace

from alignctl.rollout import EngineCapabilities, EngineEntry, register_rollout_engine
from alignctl.rollout.hf_engine import HFRolloutEngine


class HotHF(HFRolloutEngine):
    """A planted mismatch: samples (and reports log-probs) at a quarter of the temperature it was asked for,
    while the trainer scores the tokens at the asked temperature."""

    def generate(self, prompt_ids, params):
        return super().generate(prompt_ids, replace(params, temperature=params.temperature * 0.25))


register_rollout_engine(EngineEntry("hot_hf", f"{__name__}:HotHF",
                                    EngineCapabilities(trainer_precision=True, sleep=True, dtype_copy=True)))
'''


@pytest.mark.slow
def test_a_planted_engine_mismatch_fires_at_step_1_and_float32_hf_stays_quiet(tmp_path: Path):
    """GRPO, 2 steps, mini-batches of 2 prompts so the old log-probs are recomputed (the mismatch
    metrics need them). The hot engine's gap is far over both bounds at step 1; the plain hf
    engine's is rounding-sized (its float32 log-probs are the trainer's own forward)."""
    from alignctl.trainers.rl_factory import create_trainer

    assets = make_assets(tmp_path / "assets", num_train=16, num_test=4)
    plugin = tmp_path / "hot_engine.py"
    plugin.write_text(HOT_ENGINE)
    common = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
              "trainer.stop_on_flat_reward=false", "monitor.baseline_prompts=0", f"algorithm.plugins=[{plugin}]")
    from alignctl.rollout import ROLLOUT_ENGINES
    runs = {}
    try:
        for engine in ("hf", "hot_hf"):
            run = tmp_path / engine
            import ray
            try:
                create_trainer(rl_config(assets, run, *common, f"actor_rollout_ref.rollout.name={engine}")).fit()
            finally:
                ray.shutdown()
            runs[engine] = read_metrics(run)
    finally:
        ROLLOUT_ENGINES.pop("hot_hf", None)  # the plugin registered itself in this process: later tests see the built-ins only
    healthy, planted = runs["hf"], runs["hot_hf"]
    assert [r["step"] for r in healthy] == [1, 2] and [r["step"] for r in planted] == [1, 2]
    for row in healthy:
        assert row["rollout_corr/k3_kl"] < 1e-6 and math.exp(row[ABS]) < 1.001, row
        assert not any(k.startswith("monitor/alarm/") for k in row)
    first = planted[0]
    assert first["rollout_corr/k3_kl"] > 0.01 and math.exp(first[ABS]) > 1.05, (first["rollout_corr/k3_kl"], first[ABS])
    assert first.get("monitor/alarm/mismatch_kl") == 1.0 and first.get("monitor/alarm/token_prob_ratio") == 1.0
    # The run's summary.json carries the monitor's account: each alarm's line and the largest mismatch.
    import json
    healthy_summary = json.loads((tmp_path / "hf" / "summary.json").read_text())["monitor"]
    planted_summary = json.loads((tmp_path / "hot_hf" / "summary.json").read_text())["monitor"]
    assert healthy_summary["alarms"] == []
    assert [line.split(": ")[1] for line in planted_summary["alarms"]] == ["mismatch_kl", "token_prob_ratio"]
    assert planted_summary["rollout_mismatch"]["k3_kl_max"] >= first["rollout_corr/k3_kl"]
