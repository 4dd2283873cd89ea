"""The Python API of the product card: a thin layer over the same config and trainer as the CLI.

    from alignctl import PPOConfig, RLHFTrainer, RewardModelTrainer, evaluate

    config = PPOConfig(actor_model="runs/sft", reward_model="runs/rm", kl_coeff=0.05, clip_range=0.2,
                       learning_rate=1e-5, batch_size=16, mini_batch_size=8, ppo_epochs=1)
    trainer = RLHFTrainer(config=config, train_dataset="data/train.parquet", num_gpus=0)
    trainer.train(num_episodes=320)
    trainer.save_model("runs/policy")

Every field maps onto an ``RLConfig`` key (see ``PPOConfig.overrides``); ``extra`` takes any other
dotted key, so nothing the CLI can do is out of reach here.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from alignctl.console import console
from alignctl.device import resolve_device
from alignctl.errors import UserError
from alignctl.eval import evaluate  # noqa: F401  (re-exported)
from alignctl.trainers.rm_trainer import RewardModelTrainer  # noqa: F401  (re-exported)


@dataclass
class PPOConfig:
    actor_model: str
    critic_model: str | None = None  # default: initialised from the actor (PPO's usual choice)
    reward_model: str | None = None  # None: rule / custom reward functions only
    ref_model: str | None = None  # the reference is the initial actor; a different one is not supported
    kl_coeff: float = 0.05
    clip_range: float = 0.2
    learning_rate: float = 1e-6
    critic_learning_rate: float = 1e-5
    batch_size: int = 16  # prompts per step
    mini_batch_size: int = 8  # prompts per optimizer step
    ppo_epochs: int = 1
    responses_per_prompt: int = 1
    max_prompt_length: int = 512
    max_response_length: int = 256
    adv_estimator: str = "gae"
    seed: int = 1
    output_dir: str = "runs/rlhf"
    extra: dict[str, Any] = field(default_factory=dict)

    def overrides(self) -> dict[str, Any]:
        """The dotted RLConfig keys this config sets."""
        if self.ref_model not in (None, self.actor_model):
            raise UserError("PPOConfig.ref_model: the reference policy is the initial actor; pass ref_model=None "
                            "or the actor_model path")
        keys: dict[str, Any] = {
            "actor_rollout_ref.model.path": self.actor_model,
            "actor_rollout_ref.actor.clip_ratio": self.clip_range,
            "actor_rollout_ref.actor.optim.lr": self.learning_rate,
            "actor_rollout_ref.actor.ppo_mini_batch_size": self.mini_batch_size,
            "actor_rollout_ref.actor.ppo_epochs": self.ppo_epochs,
            "actor_rollout_ref.rollout.n": self.responses_per_prompt,
            "critic.model.path": self.critic_model or self.actor_model,
            "critic.optim.lr": self.critic_learning_rate,
            "data.train_batch_size": self.batch_size,
            "data.max_prompt_length": self.max_prompt_length,
            "data.max_response_length": self.max_response_length,
            "algorithm.adv_estimator": self.adv_estimator,
            "algorithm.use_kl_in_reward": True,
            "algorithm.kl_ctrl.kl_coef": self.kl_coeff,
            "trainer.seed": self.seed,
            "trainer.run_dir": self.output_dir,
            "trainer.logger": ["console", "jsonl"],
        }
        if self.reward_model:
            keys |= {"reward_model.enable": True, "reward_model.model.path": self.reward_model}
        return keys | dict(self.extra)


def _dataset_files(data: Any, scratch: Path, what: str = "train_dataset") -> list[str]:
    """Parquet path(s), a pandas DataFrame, a ``datasets.Dataset``, a list of row dicts (the
    preprocess schema), or a list of prompts (strings or chat message lists) -> parquet files."""
    if isinstance(data, (str, Path)):
        return [str(data)]
    if isinstance(data, (list, tuple)) and data and all(_is_file_name(d) for d in data):
        return [str(d) for d in data]
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "train.parquet"
    if isinstance(data, (list, tuple)):
        data = _rows_frame(list(data), what)
    if hasattr(data, "to_parquet"):  # pandas and datasets both have it
        data.to_parquet(str(path))
        return [str(path)]
    raise UserError(f"{what}: expected parquet path(s), a pandas DataFrame, a datasets.Dataset, a list of row "
                    f"dicts or a list of prompts, got {type(data).__name__}")


def _is_file_name(item: Any) -> bool:
    """A list of strings is files when each is a Path, ends in .parquet or names an existing file;
    otherwise the strings are prompts."""
    return isinstance(item, Path) or (isinstance(item, str) and (item.endswith(".parquet") or Path(item).is_file()))


def _rows_frame(items: list[Any], what: str) -> Any:
    """Row dicts as they are; plain prompts become rows with chat messages and no ground truth."""
    import pandas as pd

    if not items:
        raise UserError(f"{what}: the list is empty; expected at least one prompt")
    if all(isinstance(item, dict) for item in items):
        return pd.DataFrame(items)
    rows = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            messages = [{"role": "user", "content": item}]
        elif isinstance(item, (list, tuple)) and item and all(isinstance(m, dict) and "content" in m for m in item):
            messages = [dict(m) for m in item]
        else:
            raise UserError(f"{what}[{i}]: expected a prompt string, a list of chat messages or a row dict, "
                            f"got {type(item).__name__}")
        rows.append({"data_source": "python", "prompt": messages})
    return pd.DataFrame(rows)


def _has_ground_truth(files: list[str]) -> bool:
    from alignctl.data.readers import parquet_columns

    return all("reward_model" in parquet_columns(f, "RL prompt rows", key="train_dataset")
               for f in files if Path(f).is_file())


class RLHFTrainer:
    """PPO (or any estimator) from Python; ``train`` runs the same Ray workers as ``alignctl ppo``.

    Args:
        config: a :class:`PPOConfig`.
        train_dataset: RL prompts: parquet path(s) in the preprocess schema, a DataFrame /
            ``datasets.Dataset`` / list of dicts in that schema, or a list of prompts (strings or
            chat-message lists; no ground truth, so a reward model or ``reward_fn`` scores them).
        num_gpus: workers with one GPU each; without CUDA, that many CPU worker processes (warned).
        num_workers: CPU worker processes when ``num_gpus`` is 0 (default 1).
        reward_fn: ``fn(data_source, solution_str, ground_truth, extra_info) -> float | dict``,
            called in this process for every response (replaces the rule scorers).
        eval_dataset: validation prompts (same forms), scored with the rules before and after.
    """

    def __init__(self, config: PPOConfig, train_dataset: Any, num_gpus: int = 0, num_workers: int = 1,
                 reward_fn: Callable[..., Any] | None = None, eval_dataset: Any = None) -> None:
        self.config = config
        self.scratch = Path(tempfile.mkdtemp(prefix="alignctl-api-"))
        # The prompts written for the workers are ours alone: gone with the trainer (or at exit).
        weakref.finalize(self, shutil.rmtree, self.scratch, ignore_errors=True)
        self.train_files = _dataset_files(train_dataset, self.scratch)
        self.val_files = _dataset_files(eval_dataset, self.scratch / "val", "eval_dataset") if eval_dataset is not None else []
        self.workers = num_gpus or num_workers
        self.device = resolve_device("auto") if num_gpus else "cpu"
        if num_gpus and self.device == "cpu":
            console.print(f"[bold yellow]warning:[/] num_gpus={num_gpus} but no CUDA device is visible: training "
                          f"on the CPU with {num_gpus} worker processes")
        self.reward_fn = reward_fn
        self.result: Any = None

    def _rl_config(self, steps: int) -> Any:
        from alignctl.config import load_config
        from alignctl.config.rl import RLConfig

        extra: dict[str, Any] = {}
        if self.config.reward_model and self.reward_fn is None and not _has_ground_truth(self.train_files) \
                and "reward_model.rule_weight" not in self.config.extra:
            extra["reward_model.rule_weight"] = 0.0  # prompts without answers: the reward model alone scores
        keys = self.config.overrides() | extra | {
            "data.train_files": self.train_files, "data.val_files": self.val_files,
            "trainer.total_training_steps": steps, "trainer.n_gpus_per_node": self.workers,
            "trainer.device": self.device, "trainer.val_before_train": bool(self.val_files)}
        return load_config(RLConfig, None, [], flags=keys)

    def train(self, num_episodes: int) -> Any:
        """Train on ``num_episodes`` prompts (rounded up to whole steps of ``batch_size``); returns
        the ``RunResult`` (``steps``, per-step ``history``, ``val_history``, ``run_dir``, ``policy_dir``)."""
        from alignctl.trainers.rl_factory import create_trainer

        from alignctl.preflight import preflight

        steps = max(1, math.ceil(num_episodes / self.config.batch_size))
        cfg = self._rl_config(steps)
        # The API replaces its own earlier run, never a folder of the user's.
        preflight(cfg, overwrite=True, python_scorer=self.reward_fn is not None)
        trainer = create_trainer(cfg)
        if self.reward_fn is not None:  # runs on the controller, so any Python callable works
            trainer.parts.reward.manager.compute_score = self.reward_fn
        self.result = trainer.fit()
        return self.result

    def save_model(self, path: str | Path) -> Path:
        """Copy the trained policy (an HF folder with its manifest) to ``path`` atomically; a folder
        alignctl did not write is refused. Returns ``path``."""
        if self.result is None:
            raise UserError("save_model: call train() first")
        from alignctl.pipeline.atomic import atomic_output_dir
        from alignctl.pipeline.ownership import protected_reason

        dest = Path(path)
        source = Path(self.result.policy_dir)
        # Replacing the run folder (or the policy itself) would delete what is being copied.
        reason = protected_reason(dest.expanduser().resolve(), [source])
        if reason:
            raise UserError(f"save_model {path}: refusing to write there, it {reason}; choose a new folder")
        with atomic_output_dir(dest, kind="model") as tmp:  # refuses a folder alignctl did not write
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        return dest
