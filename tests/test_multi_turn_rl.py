"""Multi-turn, tool-using batches through the real RL loop: two Ray workers, GRPO with packing and
dynamic micro-batches, checkpoint and resume in the middle of an epoch, and PPO with a critic,
on the tiny model fitted to tool-use traces (tests/tool_helpers.py)."""

from __future__ import annotations

import pytest

from rl_helpers import all_finite, read_metrics

pytestmark = pytest.mark.slow

MULTI_TURN = ["actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.max_turns=3",
              # per-turn terms make the rewards differ between prompts (the fitted model answers them all)
              "actor_rollout_ref.rollout.multi_turn.valid_call_reward=0.1",
              "actor_rollout_ref.rollout.multi_turn.tool_error_penalty=0.2"]
# temperature 0.2 in _config: the fitted traces are followed (nearly) every time, so step contents are known


def _config(tool_model, run_dir, *overrides: str):
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    base = [f"data.train_files=[{tool_model['data']}]", f"actor_rollout_ref.model.path={tool_model['model']}",
            f"trainer.run_dir={run_dir}", "data.train_batch_size=2", "data.max_prompt_length=1024",
            "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-4", "critic.optim.lr=1e-4",
            "trainer.n_gpus_per_node=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
            "data.shuffle=false", "actor_rollout_ref.rollout.temperature=0.2", *MULTI_TURN]
    return load_config(RLConfig, None, [*base, *overrides])


def _fit(cfg):
    import ray

    from alignctl.trainers.rl_factory import create_trainer

    try:
        return create_trainer(cfg).fit()
    finally:
        ray.shutdown()


def test_multi_turn_grpo_steps_and_resume_mid_epoch(tool_model, tmp_path):
    """10 prompts, 2 per step (5 steps an epoch): 2 steps with a checkpoint each, then the same run
    resumed for a third step; the tool metrics and rewards of the rows say the tools ran."""
    overrides = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_dynamic_bsz=true",
                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1400", "trainer.save_freq=1"]
    run = tmp_path / "grpo"
    _fit(_config(tool_model, run, *overrides, "trainer.total_training_steps=2"))
    first = read_metrics(run)
    result = _fit(_config(tool_model, run, *overrides, "trainer.total_training_steps=3"))
    rows = read_metrics(run)
    assert result.steps == 3 and [r["step"] for r in rows] == [1, 2, 3]
    assert rows[:2] == first  # the resumed run kept the first two steps and added the third
    assert rows[2]["training/epoch"] == 0  # still in the first epoch: resumed mid-epoch
    for row in rows:
        assert all_finite(row)
        assert row["multi_turn/calls_per_sample"] > 0 and 1.0 <= row["multi_turn/turns_mean"] <= 3.0
        assert 0.0 <= row["multi_turn/valid_call_share"] <= 1.0 and "multi_turn/tools_s" in row
    # step 1 = prompts 0, 1 (a valid calculator call, a direct answer): 4 responses, 2 valid calls
    assert rows[0]["multi_turn/calls/calculator"] == 2 and rows[0]["multi_turn/valid_call_share"] == 1.0
    assert rows[0]["reward/tool_terms/mean"] == pytest.approx(0.1 * 2 / 4, abs=1e-6)
    # step 2 = prompts 2, 3 (unknown tool, wrongly typed argument): every call failed
    assert rows[1]["multi_turn/errors/unknown_tool"] == 2 and rows[1]["multi_turn/errors/bad_arguments"] == 2
    assert rows[1]["reward/tool_terms/mean"] == pytest.approx(-0.2, abs=1e-6)


def test_multi_turn_ppo_with_a_critic(tool_model, tmp_path):
    run = tmp_path / "ppo"
    # two lanes from the config (each worker holds one prompt here, so one lane decodes at a time)
    result = _fit(_config(tool_model, run, "algorithm.adv_estimator=gae", "trainer.total_training_steps=2",
                          "actor_rollout_ref.rollout.multi_turn.lanes=2"))
    rows = read_metrics(run)
    assert result.steps == 2 and all(all_finite(r) for r in rows)
    assert all("critic/vf_loss" in r and r["multi_turn/calls_per_sample"] > 0 for r in rows)
    assert all(r["multi_turn/tool_wait_s"] >= 0.0 for r in rows)
