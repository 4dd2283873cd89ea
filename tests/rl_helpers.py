"""Shared set-up for RL tests: tiny arith data, a tiny char-level model, and config building."""

from __future__ import annotations

import json
import math
from pathlib import Path

from alignctl.config import load_config
from alignctl.config.preprocess import ArithConfig, PreprocessConfig
from alignctl.config.rl import RLConfig

# A dense custom reward (fraction of response characters that are digits): a random tiny model gets
# varied, non-zero scores, so every estimator produces non-zero advantages and real gradients.
DIGIT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not solution_str:
        return 0.0
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str)
'''


def make_assets(root: Path, *, num_train: int = 64, num_test: int = 16, hidden: int = 64, layers: int = 2) -> dict[str, Path]:
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model

    data = root / "arith"
    arith = ArithConfig(num_train=num_train, num_test=num_test, num_sft=64, num_pref=64)
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), seed=0, arith=arith), progress=False)
    model = root / "model"
    init_model(out=model, tokenizer_from=[data / "sft_train.parquet", data / "train.parquet"], hidden=hidden,
               layers=layers, tokenizer_kind="char", seed=0)
    reward = root / "digit_reward.py"
    reward.write_text(DIGIT_REWARD)
    return {"data": data, "model": model, "reward": reward}


def rl_config(assets: dict[str, Path], run_dir: Path, *overrides: str) -> RLConfig:
    base = [
        f"data.train_files=[{assets['data'] / 'train.parquet'}]",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"trainer.run_dir={run_dir}",
        f"custom_reward_function.path={assets['reward']}",
        "data.train_batch_size=4", "data.max_prompt_length=128", "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "critic.optim.lr=1e-3",
        "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]",
        "trainer.val_before_train=false",
    ]
    return load_config(RLConfig, None, [*base, *overrides])


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def numeric_items(row: dict[str, object]) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, (int, float))}


def all_finite(row: dict[str, object]) -> bool:
    return all(math.isfinite(v) for v in numeric_items(row).values())
