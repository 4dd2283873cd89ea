"""Shared set-up for RL tests: tiny arith data, a tiny char-level model, and config building."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from alignctl.batch import Batch
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


def make_vllm_assets(root: Path) -> dict[str, Path]:
    """``make_assets`` with a char-level Llama of head_dim 64 (vLLM's CPU attention kernel refuses 16)."""
    from alignctl.models.tiny import init_model

    assets = make_assets(root, num_train=16, num_test=8)
    model = root / "model128"
    init_model(out=model, tokenizer_from=[assets["data"] / "sft_train.parquet", assets["data"] / "train.parquet"],
               hidden=128, layers=2, heads=2, tokenizer_kind="char", seed=0)
    return {**assets, "model": model}


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


def prompt_batch(assets: dict[str, Path], count: int = 4, *, do_sample: bool = True, first: int = 0) -> Batch:
    """Prompts ``first .. first+count-1`` of the tiny training data as the controller sends them to
    ``generate_sequences`` (2 samples each, seeded)."""
    from alignctl.data.rl_dataset import RLPromptDataset, to_batch
    from alignctl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(assets["model"], padding_side="left")
    data = RLPromptDataset([str(assets["data"] / "train.parquet")], tokenizer, max_prompt_length=128)
    index = list(range(first, first + count))
    prompts = to_batch([data[i] for i in index], index)
    prompts.meta.update(n=2, do_sample=do_sample, temperature=1.0, top_p=1.0, top_k=-1, seed=3,
                        prompt_width=max(len(p) for p in prompts["prompt_ids"]))
    return prompts


def with_advantages(batch: Batch, seed: int = 0) -> Batch:
    """``batch`` with seeded random advantages on its response tokens (real gradients, no reward)."""
    gen = torch.Generator().manual_seed(seed)
    return batch.union(Batch({"advantages": torch.randn(batch["response_mask"].shape, generator=gen)
                              * batch["response_mask"]}))


KILL_DRIVER = Path(__file__).parent / "drivers" / "kill_at.py"


def launch_kill_driver(kill: str, overrides: list[str], timeout: float = 400) -> "subprocess.CompletedProcess[str]":
    """Run tests/drivers/kill_at.py (``kill`` = POINT:STEP or none) in its own session, one OMP thread;
    whatever the job left behind is killed with its process group."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(KILL_DRIVER), kill, *overrides], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:  # nothing is left when the kill took the whole group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)



@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """A local Ray session for a test module's RL runs (import it into the module to use it)."""
    import ray

    from alignctl.workers.ray_session import init_ray

    init_ray(None, num_cpus=4)
    yield
    ray.shutdown()
