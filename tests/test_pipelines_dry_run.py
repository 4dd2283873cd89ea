"""Every YAML file users start from in ``pipelines/`` is valid, offline and fast.

- pipeline files (``stages:``) resolve and validate under ``alignctl run FILE --dry-run``;
- single-stage config files (top-level ``stage:``) resolve under ``alignctl config show --config``;
- each pipeline's stage graph (names, kinds, upstream edges) is the documented one;
- the GPU starting points carry the hyperparameters their comments promise (verl's);
- the data stage of each GPU pipeline really runs offline on local inputs and writes every file
  the downstream stages reference (the model stages need a GPU and the hub, so they are not run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from alignctl.config.core import read_yaml_mapping
from alignctl.data.rl_dataset import read_prompt_files
from alignctl.pipeline.runner import _downstream, load, run_pipeline
from alignctl.pipeline.spec import PipelineSpec
from conftest import REPO_ROOT, SHARED_DATA, run_cli

PIPELINES = REPO_ROOT / "pipelines"
ALL_FILES = sorted(PIPELINES.glob("*.yaml"))
STAGE_FILES = [p for p in ALL_FILES if "stage" in read_yaml_mapping(p)]
PIPELINE_FILES = [p for p in ALL_FILES if "stages" in read_yaml_mapping(p)]

# name -> (kind, upstream stages), for every pipeline file shipped.
EXPECTED_GRAPHS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "quickstart_tiny.yaml": {
        "data": ("preprocess", []),
        "base_model": ("init-model", ["data"]),
        "sft": ("sft", ["base_model", "data"]),
        "reward_model": ("train-rm", ["data", "sft"]),
        "ppo": ("ppo", ["data", "reward_model", "sft"]),
        "grpo": ("grpo", ["data", "sft"]),
        "eval_ppo": ("eval", ["data", "ppo", "reward_model", "sft"]),
        "eval_grpo": ("eval", ["data", "grpo", "reward_model", "sft"]),
    },
    "arith_grpo.yaml": {
        "data": ("preprocess", []),
        "base_model": ("init-model", ["data"]),
        "sft": ("sft", ["base_model", "data"]),
        "grpo": ("grpo", ["data", "sft"]),
    },
    "smollm2_grpo.yaml": {
        "base_model": ("import-model", []),
        "data": ("preprocess", []),
        "sft": ("sft", ["base_model", "data"]),
        "grpo": ("grpo", ["data", "sft"]),
        "eval": ("eval", ["data", "grpo", "sft"]),
    },
    "quickstart.yaml": {
        "base_model": ("import-model", []), "data": ("preprocess", []), "judge_data": ("preprocess", []),
        "sft": ("sft", ["base_model", "data"]), "verifier": ("sft", ["data", "sft"]),
        "reward_model": ("train-rm", ["data", "verifier"]), "judge_verifier": ("sft", ["judge_data", "sft"]),
        "judge": ("train-rm", ["data", "judge_data", "judge_verifier"]), "grpo": ("grpo", ["data", "sft"]),
        "ppo": ("ppo", ["data", "reward_model", "sft"]), "eval_grpo": ("eval", ["data", "grpo", "judge", "sft"]),
        "eval_ppo": ("eval", ["data", "eval_grpo", "judge", "ppo", "reward_model", "sft"]),
    },
    "hh_smollm2.yaml": {
        "data": ("preprocess", []), "base_model": ("import-model", []),
        "reward_model": ("train-rm", ["base_model", "data"]), "judge": ("train-rm", ["base_model", "data"]),
        "ppo": ("ppo", ["base_model", "data", "reward_model"]),
        "eval": ("eval", ["base_model", "data", "judge", "ppo", "reward_model"]),
    },
    "tools_arith.yaml": {
        "base_model": ("import-model", []), "data": ("preprocess", []), "sft": ("sft", ["base_model", "data"]),
        "grpo": ("grpo", ["data", "sft"]), "eval": ("eval", ["data", "grpo", "sft"]),
    },
    "gsm8k_grpo.yaml": {"data": ("preprocess", []), "grpo": ("grpo", ["data"]), "eval": ("eval", ["data", "grpo"])},
    "gsm8k_ppo.yaml": {"data": ("preprocess", []), "ppo": ("ppo", ["data"]), "eval": ("eval", ["data", "ppo"])},
    "math_grpo.yaml": {"data": ("preprocess", []), "grpo": ("grpo", ["data"]), "eval": ("eval", ["data", "grpo"])},
    "hh_rlhf_rm_ppo.yaml": {
        "data": ("preprocess", []),
        "sft": ("sft", ["data"]),
        "reward_model": ("train-rm", ["data", "sft"]),
        "ppo": ("ppo", ["data", "reward_model", "sft"]),
        "eval": ("eval", ["data", "ppo", "reward_model", "sft"]),
    },
}

GPU_PIPELINES = ("gsm8k_grpo.yaml", "gsm8k_ppo.yaml", "math_grpo.yaml", "hh_rlhf_rm_ppo.yaml")

# Local inputs that make each GPU pipeline's data stage run offline (None: the file's default).
OFFLINE_DATA_OVERRIDES: dict[str, list[str] | None] = {
    "gsm8k_grpo.yaml": [f"data.input={SHARED_DATA / 'gsm8k'}"],
    "gsm8k_ppo.yaml": [f"data.input={SHARED_DATA / 'gsm8k'}"],
    "math_grpo.yaml": None,  # data/math_sample.jsonl ships with the repository
    "hh_rlhf_rm_ppo.yaml": [f"data.input={SHARED_DATA / 'hh-rlhf-harmless' / 'test.jsonl.gz'}",
                            "data.test_fraction=0.1"],
}
# hh_smollm2's header has the user download HH-RLHF into data/; the tests read the team's local copy.
HH_SMOLLM2_DATA = [f"data.input={SHARED_DATA / 'hh-rlhf-harmless' / 'test.jsonl.gz'}"]


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_every_file_is_classified():
    """A new file must be a pipeline or a stage config, and a new pipeline needs an expected graph."""
    assert set(STAGE_FILES) | set(PIPELINE_FILES) == set(ALL_FILES)
    assert not set(STAGE_FILES) & set(PIPELINE_FILES)
    assert {p.name for p in PIPELINE_FILES} == set(EXPECTED_GRAPHS)
    assert set(GPU_PIPELINES) <= set(EXPECTED_GRAPHS)


@pytest.mark.parametrize("path", PIPELINE_FILES, ids=_ids(PIPELINE_FILES))
def test_pipeline_dry_run_validates(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO_ROOT)  # relative inputs (data/math_sample.jsonl) resolve from the repo root
    # The dry run checks that input files exist: a pipeline whose raw data the user downloads
    # first (hh-rlhf) gets the local copy, as its header says.
    inputs = (HH_SMOLLM2_DATA if path.name == "hh_smollm2.yaml" else OFFLINE_DATA_OVERRIDES.get(path.name)) or []
    if inputs and not Path(inputs[0].partition("=")[2]).exists():
        inputs = []
    args = [*inputs, f"workdir={tmp_path / 'work'}"]
    if path.name == "hh_rlhf_rm_ppo.yaml" and not inputs:
        pytest.skip(f"needs the shared HH-RLHF file under {SHARED_DATA}")
    if path.name == "hh_smollm2.yaml" and not (SHARED_DATA / "hh-rlhf-harmless").exists():
        pytest.skip(f"needs the shared HH-RLHF file under {SHARED_DATA}")
    result = run_cli("run", str(path.relative_to(REPO_ROOT)), "--dry-run", *args)
    assert result.code == 0, result.stderr
    assert not (tmp_path / "work").exists()  # a dry run writes nothing
    outcomes = run_pipeline(load(path, args), dry_run=True)
    assert [o.state for o in outcomes] == ["planned (missing)"] * len(outcomes)


@pytest.mark.parametrize("path", PIPELINE_FILES, ids=_ids(PIPELINE_FILES))
def test_pipeline_stage_graph(path: Path):
    spec = load(path, [])
    graph = {name: (stage.kind, stage.upstream) for name, stage in spec.stages.items()}
    assert graph == EXPECTED_GRAPHS[path.name]
    # Run order is topological: every upstream stage comes earlier.
    order = list(spec.stages)
    for name, stage in spec.stages.items():
        assert all(order.index(up) < order.index(name) for up in stage.upstream), name


@pytest.mark.parametrize("path", STAGE_FILES, ids=_ids(STAGE_FILES))
def test_stage_config_resolves(path: Path):
    result = run_cli("config", "show", "--config", str(path))
    assert result.code == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    declared = read_yaml_mapping(path)
    # Every value the file sets survives resolution unchanged (defaults fill in the rest).
    for key, value in declared.items():
        if key != "stage" and not isinstance(value, dict):
            assert resolved[key] == value, key


def _rl_config(name: str, stage: str) -> Any:
    from alignctl.pipeline.cache import typed_config

    spec = load(PIPELINES / name, [])
    return typed_config(spec.stages[stage], {s: f"<{s}>" for s in spec.stages}, "<out>", spec.path)


def test_gsm8k_grpo_uses_verl_hyperparameters():
    """verl examples/grpo_trainer/run_qwen2-7b.sh, on Qwen2.5-0.5B-Instruct (TP 1: one GPU per worker)."""
    cfg = _rl_config("gsm8k_grpo.yaml", "grpo")
    arr, actor, rollout = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (1024, 512, 1024)
    assert arr.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and arr.model.dtype == "bfloat16"
    assert (actor.strategy, actor.optim.lr, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) == \
        ("fsdp2", 1e-6, 256, 40)
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type, actor.entropy_coeff) == \
        (True, 0.001, "low_var_kl", 0.0)
    assert (rollout.name, rollout.n, rollout.gpu_memory_utilization, rollout.tensor_model_parallel_size) == \
        ("vllm", 5, 0.6, 1)
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.use_kl_in_reward, cfg.use_critic) == ("grpo", False, False)
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.total_epochs, cfg.trainer.test_freq) == (8, 15, 5)


def test_gsm8k_ppo_uses_verl_hyperparameters():
    """verl's quickstart 'PPO on GSM8K with Qwen2.5-0.5B-Instruct'."""
    cfg = _rl_config("gsm8k_ppo.yaml", "ppo")
    actor = cfg.actor_rollout_ref.actor
    assert cfg.use_critic and cfg.algorithm.adv_estimator == "gae"
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) == (256, 64, 4)
    assert (actor.optim.lr, cfg.critic.optim.lr) == (1e-6, 1e-5)
    assert cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_ctrl.kl_coef == 0.001
    assert cfg.actor_rollout_ref.rollout.name == "vllm"


def test_rm_ppo_scores_with_the_reward_model_only():
    cfg = _rl_config("hh_rlhf_rm_ppo.yaml", "ppo")
    assert cfg.reward_model.enable and cfg.reward_model.model.path == "<reward_model>"
    assert cfg.reward_model.rule_weight == 0.0 and cfg.use_critic


def test_hh_smollm2_judge_never_saw_what_the_policy_optimized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The PPO reward model and the judge train on disjoint halves, and the eval prompts come from
    the judge's half, which PPO never trained on (the file's header promises this)."""
    if not (SHARED_DATA / "hh-rlhf-harmless").exists():
        pytest.skip(f"needs the shared HH-RLHF file under {SHARED_DATA}")
    monkeypatch.chdir(REPO_ROOT)
    spec = load(PIPELINES / "hh_smollm2.yaml", [*HH_SMOLLM2_DATA, f"workdir={tmp_path}"])
    stages = spec.stages
    assert stages["reward_model"].config["data"]["train_files"] == ["${data}/train.parquet"]
    assert stages["judge"].config["data"]["train_files"] == ["${data}/test.parquet"]
    assert stages["ppo"].config["data"]["train_files"] == ["${data}/rl_train.parquet"]
    assert stages["ppo"].config["reward_model"]["model"]["path"] == "${reward_model}"
    assert stages["eval"].config["prompts"] == "${data}/rl_test.parquet"
    assert stages["eval"].config["judge_model"] == "${judge}"
    # the reward model's held-out accuracy is read on all of half B, not a leading slice of it
    assert stages["eval"].config["preference_data"] == "${data}/test.parquet"
    assert stages["eval"].config.get("max_preference_pairs") is None
    (outcome,) = run_pipeline(spec, until="data")  # data comes first in the file: no model import here
    halves = [pd.read_parquet(outcome.path / f"{split}.parquet") for split in ("train", "test")]
    prompts = [{str(list(p)) for p in half["prompt"]} for half in halves]
    assert min(len(h) for h in halves) > 1000 and not prompts[0] & prompts[1]
    rl_halves = [pd.read_parquet(outcome.path / f"rl_{split}.parquet") for split in ("train", "test")]
    assert [{str(list(p)) for p in half["prompt"]} for half in rl_halves] == prompts


def _referenced_files(spec: PipelineSpec, stage: str) -> set[str]:
    """Sub-paths of ``stage``'s artifact that other stages read (``${stage}/file``)."""
    pattern = re.compile(r"\$\{" + re.escape(stage) + r"\}/([^\"'\s]+)")
    return {m for other in spec.stages.values() for m in pattern.findall(yaml.safe_dump(other.config))}


@pytest.mark.parametrize("name", GPU_PIPELINES)
def test_data_stage_runs_offline_and_writes_what_downstream_reads(name: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    overrides = OFFLINE_DATA_OVERRIDES[name]
    if overrides is not None and not SHARED_DATA.exists():
        pytest.skip(f"needs the shared data folder at {SHARED_DATA}")
    monkeypatch.chdir(REPO_ROOT)
    spec = load(PIPELINES / name, [*(overrides or []), f"workdir={tmp_path}"])
    (outcome,) = run_pipeline(spec, until="data")
    assert outcome.state == "ran"
    wanted = _referenced_files(spec, "data")
    assert wanted, "no stage reads the data stage"
    for file in sorted(wanted):
        assert (outcome.path / file).is_file(), file


def test_hh_preference_rows_are_readable_as_rl_prompts(tmp_path: Path):
    if not SHARED_DATA.exists():
        pytest.skip(f"needs the shared data folder at {SHARED_DATA}")
    overrides = OFFLINE_DATA_OVERRIDES["hh_rlhf_rm_ppo.yaml"] or []
    spec = load(PIPELINES / "hh_rlhf_rm_ppo.yaml", [*overrides, f"workdir={tmp_path}"])
    (outcome,) = run_pipeline(spec, until="data")
    frame = read_prompt_files([str(outcome.path / "train.parquet")], "prompt")
    assert len(frame) > 0


def test_dry_run_names_a_missing_input_of_any_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The HH pipeline's raw data is a download the user makes first: without it the dry run fails
    at once, naming the stage, the key and the path (before any stage runs or any folder exists)."""
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("run", "pipelines/hh_rlhf_rm_ppo.yaml", "--dry-run", f"workdir={tmp_path / 'work'}")
    assert result.code == 2
    assert "stage 'data'" in result.stderr and "data/hh-rlhf/harmless-base" in result.stderr
    assert not (tmp_path / "work").exists()


def test_tools_arith_sft_traces_match_the_rollout_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """SFT tokenizes its traces with the tools the GRPO rollouts offer (else the prompts differ);
    the data stage writes every file the other stages read, with held-out questions in none of them."""
    monkeypatch.chdir(REPO_ROOT)
    spec = load(PIPELINES / "tools_arith.yaml", [f"workdir={tmp_path}"])
    stages = spec.stages
    multi_turn = stages["grpo"].config["actor_rollout_ref"]["rollout"]["multi_turn"]
    assert multi_turn["enable"] and stages["sft"].config["data"]["tools"] == multi_turn["tools"] == ["calculator"]
    assert stages["grpo"].config["data"]["val_files"] == stages["eval"].config["prompts"].split() == ["${data}/test.parquet"]
    data = tmp_path / "data"
    options = [f"tools_arith.{key}={value}" for key, value in stages["data"].config["tools_arith"].items()]
    assert run_cli("preprocess", "tools-arith", "--out", str(data), *options).code == 0
    assert _referenced_files(spec, "data") <= {p.name for p in data.glob("*.parquet")}
    questions = {name: {str(list(p)) for p in pd.read_parquet(data / name)["prompt"]}
                 for name in ("train.parquet", "test.parquet", "sft_train.parquet")}
    assert not questions["test.parquet"] & (questions["train.parquet"] | questions["sft_train.parquet"])


def test_quickstart_critic_starts_from_the_ppo_reward_model_never_the_judge():
    """The judge scores both policies, so no weight of it may train them: the critic starts from the
    PPO reward model (OpenRLHF's default), and nothing upstream of either RL stage is the judge."""
    ppo = _rl_config("quickstart.yaml", "ppo")
    assert ppo.critic.model.path == ppo.reward_model.model.path == "<reward_model>"
    # The runner's own closure (what --force reruns): every stage that transitively reads the judge's.
    reads_judge = _downstream(load(PIPELINES / "quickstart.yaml", []), {"judge", "judge_verifier", "judge_data"})
    assert not {"grpo", "ppo"} & reads_judge
    assert {"eval_grpo", "eval_ppo"} <= reads_judge  # the closure is live: the evals do read the judge
