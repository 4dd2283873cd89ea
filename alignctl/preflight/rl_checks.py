"""Preflight of an RL run (ppo / grpo and friends): models, data, reward, run folder, resume.

The run folder is a live folder rather than an artifact renamed into place: a run writes into it
step by step and a later run resumes from its checkpoints. So an existing alignctl run folder is
reused without ``--overwrite`` only when there is a checkpoint to continue from; starting over
on top of an earlier run's metrics needs ``--overwrite``.
"""

from __future__ import annotations

from pathlib import Path

from alignctl.config.rl import RLConfig
from alignctl.errors import UserError
from alignctl.pipeline.ownership import MARKER, check_output_dir, is_empty_dir, is_owned
from alignctl.preflight.context import Context
from alignctl.preflight.data_checks import check_rl_prompts
from alignctl.preflight.models import check_layer_count, check_model
from alignctl.preflight.stage_checks import check_python_function
from alignctl.trainers.checkpoint_folders import STATE_FILE, checkpoint_root, complete_checkpoints


def _check_resume_path(cfg: RLConfig) -> None:
    mode = cfg.trainer.resume_mode
    if mode in ("auto", "disable"):
        return
    if not (Path(mode) / STATE_FILE).is_file():
        raise UserError(f"trainer.resume_mode {mode}: not a complete checkpoint (expected a global_step_N folder "
                        f"holding {STATE_FILE}); use auto, disable or such a path")


def check_run_dir(cfg: RLConfig, ctx: Context, inputs: list[str]) -> None:
    """Refuse a run folder that belongs to the user, or an earlier run that would be overwritten."""
    run_dir = cfg.trainer.resolved_run_dir
    key = "trainer.run_dir" if cfg.trainer.run_dir else "trainer.default_local_dir/experiment_name"
    if not run_dir.is_dir() or is_empty_dir(run_dir) or not is_owned(run_dir):
        check_output_dir(run_dir, key=key, overwrite=ctx.overwrite, inputs=inputs)
        return
    check_output_dir(run_dir, key=key, overwrite=True, inputs=inputs)  # protected folders, inputs
    mode = cfg.trainer.resume_mode
    resumable = mode not in ("auto", "disable") or (mode == "auto" and complete_checkpoints(checkpoint_root(run_dir)))
    earlier = [p.name for p in run_dir.iterdir() if p.name != MARKER]
    if not resumable and earlier and not ctx.overwrite:
        why = "resume_mode=disable" if mode == "disable" else "no checkpoint to resume from"
        raise UserError(f"{key} {run_dir}: holds an earlier run ({why}); pass --overwrite to start it over "
                        f"(its metrics are replaced), or choose a new run folder")


def _default_scorer_used(cfg: RLConfig, key: str, ctx: Context) -> bool:
    """Whether rows of ``key`` are scored by the default data_source scorer (which needs a ground
    truth): not with a custom reward function, and for training not when the reward model alone
    scores (rule_weight 0) or a Python callable does; validation always scores with the rules."""
    rm = cfg.reward_model
    if key == "data.train_files" and ctx.python_scorer:
        return False
    rules = key == "data.val_files" or not (rm.enable and rm.rule_weight == 0)
    return rules and not cfg.custom_reward_function.path


def _check_local_cluster(cfg: RLConfig) -> None:
    """A run that will start its own local Ray cluster: the pools must fit this one machine (a
    cluster given by address is checked against its nodes once joined, before any worker starts)."""
    import ray

    from alignctl.trainers.rl_setup import check_local_fit
    from alignctl.workers.ray_session import cluster_address

    if cluster_address(cfg.trainer.ray_address) is None and not ray.is_initialized():
        check_local_fit(cfg)


def check_rl(cfg: RLConfig, ctx: Context) -> None:
    arr = cfg.actor_rollout_ref
    check_model(arr.model.path, "actor_rollout_ref.model.path", ctx, "causal",
                needs_tokenizer=not arr.model.tokenizer_path)
    check_model(arr.model.tokenizer_path, "actor_rollout_ref.model.tokenizer_path", ctx, "tokenizer")
    check_layer_count(arr.model.path, arr.model.freeze_layers, "actor_rollout_ref.model.freeze_layers", ctx)
    if cfg.use_critic:
        check_model(cfg.critic.model.path, "critic.model.path", ctx, "critic")
        check_layer_count(cfg.critic.model.path or arr.model.path, cfg.critic.model.freeze_layers,
                          "critic.model.freeze_layers", ctx)
    if cfg.reward_model.enable:
        check_model(cfg.reward_model.model.path, "reward_model.model.path", ctx, "reward",
                    needs_tokenizer=not cfg.reward_model.model.input_tokenizer)
    custom = cfg.custom_reward_function
    check_python_function(custom.path, custom.name, "custom_reward_function.path", ctx)
    dataset = cfg.data.custom_cls
    if dataset.path:
        check_python_function(dataset.path, dataset.name, "data.custom_cls.path", ctx)
    else:
        for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
            check_rl_prompts(files, key, ctx, prompt_key=cfg.data.prompt_key,
                             default_scorer=_default_scorer_used(cfg, key, ctx))
    _check_resume_path(cfg)
    _check_local_cluster(cfg)
    if ctx.outputs:
        inputs = [p for p in (arr.model.path, cfg.critic.model.path, cfg.reward_model.model.path,
                              *cfg.data.train_files, *cfg.data.val_files) if p]
        check_run_dir(cfg, ctx, inputs)
