"""benchmarks/grpo_vs_trl.py: its building blocks (shared reward, step clock, config parity between
alignctl and TRL) and one ``--quick`` run end to end. No timing assertions: the machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import grpo_vs_trl as bench  # noqa: E402


def test_score_is_gsm8k_rule_plus_half_the_digit_fraction():
    # "so #### 42": 10 characters ("so", space, "####", space, "42"), 2 digits; the strict answer 42
    # equals the ground truth -> 1 + 0.5 * 2/10 = 1.1.
    assert bench.score_response("so #### 42", "42") == pytest.approx(1.1, abs=1e-12)
    # Wrong answer: the rule scorer gives 0, the dense term 0.5 * 2/10 = 0.1 remains.
    assert bench.score_response("so #### 41", "42") == pytest.approx(0.1, abs=1e-12)
    # "ab1": 1 digit of 3 and no "####" -> 0 + 0.5 * 1/3; empty -> 0.
    assert bench.score_response("ab1", "1") == pytest.approx(0.5 / 3, abs=1e-12)
    assert bench.score_response("", "1") == 0.0


def test_both_reward_interfaces_give_the_same_scores():
    texts, truths = ["so #### 42", "ab1", "no digits"], ["42", "7", "3"]
    ours = [bench.bench_reward("openai/gsm8k", t, g, {"index": 0}) for t, g in zip(texts, truths)]
    conversational = [[{"role": "assistant", "content": t}] for t in texts]
    theirs = bench.trl_reward(prompts=[None] * 3, completions=conversational, ground_truth=truths, trainer_state=None)
    assert theirs == ours
    assert bench.trl_reward(prompts=[None] * 3, completions=texts, ground_truth=truths) == ours  # plain-text format


def test_step_intervals_start_after_the_warmup():
    ends = [10.0, 13.0, 15.0, 20.0]  # steps 1..4 end here; step k lasted ends[k-1] - ends[k-2]
    assert bench.step_intervals(ends, 1) == [3.0, 2.0, 5.0]
    assert bench.step_intervals(ends, 2) == [2.0, 5.0]
    with pytest.raises(ValueError):
        bench.step_intervals(ends, 0)


def test_alignctl_and_trl_configs_describe_the_same_training(tmp_path):
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    w = bench.FULL
    assets = bench.Assets(tmp_path / "train.parquet", tmp_path / "model", 0)
    ours = load_config(RLConfig, None, bench.alignctl_overrides(w, assets, tmp_path / "run", w.ours_rows[0]))
    theirs = bench.trl_args(w, tmp_path / "trl")
    actor, rollout = ours.actor_rollout_ref.actor, ours.actor_rollout_ref.rollout
    # Responses per step and per optimizer step: prompts x n on both sides, one update per batch.
    assert ours.data.train_batch_size * rollout.n == theirs.per_device_train_batch_size == 32
    assert actor.ppo_mini_batch_size == ours.data.train_batch_size and actor.ppo_epochs == 1
    assert theirs.gradient_accumulation_steps == theirs.steps_per_generation == theirs.num_iterations == 1
    assert rollout.n == theirs.num_generations == 4
    assert ours.data.max_response_length == theirs.max_completion_length == 64
    assert rollout.temperature == theirs.temperature == 1.0
    assert actor.use_kl_loss and actor.kl_loss_coef == theirs.beta == 0.04 and actor.kl_loss_type == "low_var_kl"
    assert actor.optim.lr == theirs.learning_rate and actor.optim.weight_decay == theirs.weight_decay == 0.0
    assert actor.clip_ratio == theirs.epsilon == 0.2 and actor.grad_clip == theirs.max_grad_norm == 1.0
    # token-mean over the whole batch is TRL's "dapo" aggregation; group-std advantages on both.
    assert actor.loss_agg_mode == "token-mean" and theirs.loss_type == "dapo"
    assert ours.algorithm.norm_adv_by_std_in_grpo and theirs.scale_rewards == "group"
    assert not ours.data.shuffle and not theirs.shuffle_dataset  # same prompts in the same order
    assert not theirs.bf16 and not theirs.activation_checkpointing and not theirs.gradient_checkpointing and ours.actor_rollout_ref.model.dtype == "float32"
    assert ours.trainer.total_training_steps == theirs.max_steps == w.warmup_steps + w.measured_steps


@pytest.mark.slow
@pytest.mark.skipif(not bench.GSM8K_DIR.exists(), reason=f"needs the GSM8K jsonl files in {bench.GSM8K_DIR}")
def test_quick_run_writes_a_consistent_record(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "grpo_vs_trl.py"), "--quick", "--json", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["name"] == "grpo_vs_trl" and record["unit"] == "s/step" and record["higher_is_better"] is False
    assert record["ours"] > 0 and record["baseline"] > 0
    assert record["ratio"] == pytest.approx(record["baseline"] / record["ours"], rel=1e-12)
    w = bench.QUICK
    sides = record["setup"]["sides"]
    assert len(sides) == 1 + len(w.ours_rows)
    for side in sides.values():
        assert len(side["step_seconds"]) == w.measured_steps
        assert 1 <= side["mean_response_length"] <= w.max_new_tokens
        assert side["grad_norm_mean"] > 0  # the dense reward gave non-zero advantages: a real backward pass
    assert record["setup"]["responses_per_step"] == w.prompts * w.n
    assert w.ours_rows[0].name in sides and "GRPOTrainer" in proc.stdout
