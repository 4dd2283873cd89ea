"""Bad runs are refused before they start, and no user file is ever touched (issue 20).

Every case drives the real CLI in-process (``conftest.run_cli``) and checks the user-error
contract: exit status 2, one stderr line naming the key or file and what was expected, no
traceback -- and the whole test folder (inputs, the user's own folders, an earlier run with its
metrics) byte-identical before and after. All RL cases fail in the preflight pass, before Ray
starts: the suite runs in seconds, and a case that got as far as starting workers would show up
as a changed run folder or a slow test.

Layout: ``assets`` (module-scoped) holds arith data, a tiny model and a reward function;
``tmp_path/work`` is the current folder, ``tmp_path/work/run`` an earlier alignctl run (metrics,
config, no checkpoint) and ``tmp_path/work/mine`` a folder of the user's. In case texts ``$A`` is
the assets folder, ``$W`` the work folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from alignctl.pipeline.ownership import MARKER
from conftest import assert_user_error, run_cli
from rl_helpers import make_assets


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    needles: tuple[str, ...]


def _rl(*extra: str, cmd: str = "grpo", run: str = "$W/new_run") -> tuple[str, ...]:
    base = (cmd, "data.train_files=[$A/arith/train.parquet]", "actor_rollout_ref.model.path=$A/model",
            f"trainer.run_dir={run}", "custom_reward_function.path=$A/digit_reward.py", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=16", "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1",
            "trainer.logger=[jsonl]", "trainer.val_before_train=false")
    return (*base, *extra)


def _rule(*extra: str, files: str = "$A/arith/train.parquet") -> tuple[str, ...]:
    """An RL run scored by the default rule scorer (no custom reward function)."""
    args = [a for a in _rl(*extra) if not a.startswith("custom_reward_function.path=")]
    return tuple(f"data.train_files=[{files}]" if a.startswith("data.train_files=") else a for a in args)


RL_CASES = [
    # ranges and choices: found when the config is built
    Case("top_p_above_1", _rl("actor_rollout_ref.rollout.top_p=2"), ("actor_rollout_ref.rollout.top_p", "<= 1", "2")),
    Case("top_p_zero", _rl("actor_rollout_ref.rollout.top_p=0"), ("actor_rollout_ref.rollout.top_p", "> 0")),
    Case("val_top_p_zero", _rl("actor_rollout_ref.rollout.val_kwargs.top_p=0"), ("val_kwargs.top_p", "> 0")),
    Case("response_length_zero", _rl("data.max_response_length=0"), ("data.max_response_length", ">= 1")),
    Case("response_length_negative", _rl("data.max_response_length=-5"), ("data.max_response_length", ">= 1")),
    Case("prompt_length_zero", _rl("data.max_prompt_length=0"), ("data.max_prompt_length", ">= 1")),
    Case("temperature_zero_sampling", _rl("actor_rollout_ref.rollout.temperature=0"),
         ("actor_rollout_ref.rollout.temperature", "> 0 when sampling")),
    Case("temperature_negative", _rl("actor_rollout_ref.rollout.temperature=-1"),
         ("actor_rollout_ref.rollout.temperature", ">= 0")),
    Case("lr_zero", _rl("actor_rollout_ref.actor.optim.lr=0"), ("actor_rollout_ref.actor.optim.lr", "> 0")),
    Case("lr_negative", _rl("actor_rollout_ref.actor.optim.lr=-1e-5"), ("actor_rollout_ref.actor.optim.lr", "> 0")),
    Case("critic_lr_negative", _rl("critic.optim.lr=-1", cmd="ppo"), ("critic.optim.lr", "> 0")),
    Case("unknown_kl_loss_type", _rl("actor_rollout_ref.actor.kl_loss_type=foo"),
         ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", "'foo'")),
    Case("unknown_kl_penalty", _rl("algorithm.kl_penalty=bar"), ("algorithm.kl_penalty", "'bar'")),
    Case("batch_size_zero", _rl("data.train_batch_size=0"), ("data.train_batch_size", ">= 1")),
    Case("batch_size_negative", _rl("data.train_batch_size=-4"), ("data.train_batch_size", ">= 1", "-4")),
    Case("mini_batch_zero", _rl("actor_rollout_ref.actor.ppo_mini_batch_size=0"), ("ppo_mini_batch_size", ">= 1")),
    Case("mini_batch_not_dividing", _rl("actor_rollout_ref.actor.ppo_mini_batch_size=3"),
         ("ppo_mini_batch_size", "must divide data.train_batch_size")),
    Case("micro_batch_not_dividing", _rl("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
         ("ppo_micro_batch_size_per_gpu", "must divide")),
    Case("critic_mini_batch_not_dividing", _rl("critic.ppo_mini_batch_size=3", cmd="ppo"),
         ("critic.ppo_mini_batch_size", "must divide data.train_batch_size")),
    Case("critic_micro_batch_not_dividing", _rl("critic.ppo_micro_batch_size_per_gpu=3", cmd="ppo"),
         ("critic.ppo_micro_batch_size_per_gpu", "must divide")),
    Case("zero_gpus_per_node", _rl("trainer.n_gpus_per_node=0"), ("trainer.n_gpus_per_node", ">= 1")),
    Case("zero_nodes", _rl("trainer.nnodes=0"), ("trainer.nnodes", ">= 1")),
    Case("batch_not_divisible_by_workers", _rl("trainer.n_gpus_per_node=3"), ("divisible by the number of workers",)),
    Case("total_steps_zero", _rl("trainer.total_training_steps=0"), ("trainer.total_training_steps", ">= 1")),
    Case("total_epochs_zero", _rl("trainer.total_epochs=0"), ("trainer.total_epochs", ">= 1")),
    Case("clip_ratio_negative", _rl("actor_rollout_ref.actor.clip_ratio=-0.2"), ("clip_ratio", "> 0")),
    Case("dual_clip_below_1", _rl("actor_rollout_ref.actor.clip_ratio_c=0.5"), ("clip_ratio_c", "> 1")),
    Case("rollout_n_zero", _rl("actor_rollout_ref.rollout.n=0"), ("actor_rollout_ref.rollout.n", ">= 1")),
    Case("grpo_with_one_sample", _rl("actor_rollout_ref.rollout.n=1"), ("rollout.n >= 2",)),
    Case("ppo_epochs_zero", _rl("actor_rollout_ref.actor.ppo_epochs=0"), ("ppo_epochs", ">= 1")),
    Case("gamma_above_1", _rl("algorithm.gamma=1.5", cmd="ppo"), ("algorithm.gamma", "<= 1")),
    Case("lora_rank_negative", _rl("actor_rollout_ref.model.lora_rank=-1"), ("lora_rank", ">= 0")),
    Case("save_freq_zero", _rl("trainer.save_freq=0"), ("trainer.save_freq", "-1 (off)")),
    Case("unknown_logger", _rl("trainer.logger=[nope]"), ("trainer.logger", "nope")),
    Case("nan_learning_rate", _rl("actor_rollout_ref.actor.optim.lr=.nan"), ("actor_rollout_ref.actor.optim.lr",)),
    # found by an independent replay: non-finite numbers, "~", empty paths, string prompts
    Case("infinite_learning_rate", _rl("actor_rollout_ref.actor.optim.lr=inf"), ("optim.lr", "finite number")),
    Case("infinite_temperature", _rl("actor_rollout_ref.rollout.temperature=.inf"), ("rollout.temperature", "finite")),
    Case("run_dir_tilde_is_home", _rl("--overwrite", run="~"), ("trainer.run_dir", "is the home folder")),
    Case("model_path_empty", _rl("actor_rollout_ref.model.path="), ("actor_rollout_ref.model.path", "required")),
    Case("train_rows_with_string_prompts", _rl("data.train_files=[$A/string_prompt.parquet]"),
         ("string_prompt.parquet row 0", "holds str", "expected chat messages")),
    Case("policy_without_tokenizer", _rl("actor_rollout_ref.model.path=$A/lm_no_tokenizer"),
         ("actor_rollout_ref.model.path", "no tokenizer files")),
    Case("wrong_type", _rl("data.train_batch_size=abc"), ("data.train_batch_size", "expected int", "abc")),
    Case("unknown_key", _rl("actor_rollout_ref.rollout.temprature=1.0"), ("unknown config key", "temperature")),
    # models: exist, are folders, are the right kind; local-looking paths never go to a hub
    Case("model_missing_local", _rl("actor_rollout_ref.model.path=$W/models/nope"),
         ("actor_rollout_ref.model.path", "models/nope", "does not exist")),
    Case("model_missing_relative", _rl("actor_rollout_ref.model.path=models/nope"),
         ("actor_rollout_ref.model.path", "models/nope", "no such local folder")),
    Case("model_is_a_file", _rl("actor_rollout_ref.model.path=$A/digit_reward.py"),
         ("actor_rollout_ref.model.path", "is a file")),
    Case("model_without_config", _rl("actor_rollout_ref.model.path=$A/arith"),
         ("actor_rollout_ref.model.path", "no config.json")),
    Case("policy_is_a_reward_model", _rl("actor_rollout_ref.model.path=$A/rm_head"),
         ("actor_rollout_ref.model.path", "not a causal language model")),
    Case("tokenizer_missing", _rl("actor_rollout_ref.model.tokenizer_path=$W/tok"), ("tokenizer_path", "does not exist")),
    Case("reward_model_missing", _rl("reward_model.enable=true", "reward_model.model.path=$W/rm_nope"),
         ("reward_model.model.path", "rm_nope", "does not exist")),
    Case("reward_model_is_causal_lm", _rl("reward_model.enable=true", "reward_model.model.path=$A/model"),
         ("reward_model.model.path", "not a reward model", "LlamaForCausalLM")),
    Case("reward_model_enabled_without_path", _rl("reward_model.enable=true"), ("reward_model.model.path", "required")),
    Case("critic_model_missing", _rl("critic.model.path=$W/critic_nope", cmd="ppo"), ("critic.model.path", "does not exist")),
    # data: exists, is RL prompts, holds what the reward needs
    Case("train_file_missing", _rl("data.train_files=[$W/nope.parquet]"), ("data.train_files", "nope.parquet", "not found")),
    Case("train_file_not_parquet", _rl("data.train_files=[$A/digit_reward.py]"), ("data.train_files", "not a readable parquet")),
    Case("train_file_is_preference_data", _rl("data.train_files=[$A/arith/pref_train.parquet]"),
         ("pref_train.parquet", "a preference file")),
    Case("train_rows_without_ground_truth", _rule(files="$A/no_truth.parquet"), ("no_truth.parquet", "ground truth")),
    Case("train_rows_with_empty_ground_truth", _rule(files="$A/empty_truth.parquet"),
         ("empty_truth.parquet row 1", "ground_truth is missing")),
    Case("train_rows_with_empty_prompt", _rl("data.train_files=[$A/empty_prompt.parquet]"),
         ("empty_prompt.parquet row 2", "empty prompt")),
    Case("train_rows_of_unknown_source", _rule(files="$A/unknown_source.parquet"),
         ("unknown_source.parquet", "no default reward scorer", "'quiz'")),
    Case("train_file_without_rows", _rl("data.train_files=[$A/no_rows.parquet]"), ("no_rows.parquet", "no rows")),
    Case("val_rows_without_ground_truth", _rule("data.val_files=[$A/no_truth.parquet]"),
         ("no_truth.parquet", "ground truth")),
    Case("prompt_key_missing", _rl("data.prompt_key=question"), ("missing column", "question")),
    # user code is read (not run) before the start
    Case("reward_file_missing", _rl("custom_reward_function.path=$W/nope.py"), ("custom_reward_function.path", "not found")),
    Case("reward_function_missing", _rl("custom_reward_function.name=score_it"),
         ("custom_reward_function.path", "has no function 'score_it'", "compute_score")),
    Case("reward_file_syntax_error", _rl("custom_reward_function.path=$A/broken.py"), ("broken.py", "syntax error line 1")),
    Case("dataset_class_missing", _rl("data.custom_cls.path=$W/ds.py", "data.custom_cls.name=DS"), ("data.custom_cls.path", "not found")),
    # run folders and resume
    Case("resume_from_nowhere", _rl("trainer.resume_mode=$W/nope/global_step_3"), ("trainer.resume_mode", "not a complete checkpoint")),
    Case("run_dir_is_users_folder", _rl(run="$W/mine"), ("trainer.run_dir", "mine", "not written by alignctl")),
    Case("run_dir_is_current_folder", _rl(run="."), ("trainer.run_dir", "is the current folder")),
    Case("run_dir_holds_current_folder", _rl(run=".."), ("trainer.run_dir", "holds the current folder")),
    Case("rerun_without_checkpoint", _rl(run="$W/run"), ("trainer.run_dir", "holds an earlier run", "--overwrite")),
    Case("rerun_with_bad_value", _rl("actor_rollout_ref.rollout.top_p=2", run="$W/run"), ("rollout.top_p",)),
    Case("rerun_resume_disabled", _rl("trainer.resume_mode=disable", run="$W/run"), ("resume_mode=disable", "--overwrite")),
    Case("run_dir_holds_the_model", _rl("--overwrite", run="$A"), ("trainer.run_dir", "holds the input")),
]

OUTPUT_CASES = [
    Case("preprocess_into_current_folder", ("preprocess", "arith", "--out", "."), ("--out .", "is the current folder")),
    Case("preprocess_into_current_folder_overwrite", ("preprocess", "arith", "--out", ".", "--overwrite"),
         ("is the current folder",)),
    Case("preprocess_into_users_folder", ("preprocess", "arith", "--out", "$W/mine"), ("$W/mine", "not written by alignctl")),
    Case("preprocess_into_users_folder_overwrite", ("preprocess", "arith", "--out", "$W/mine", "--overwrite"),
         ("not written by alignctl",)),
    Case("preprocess_over_its_input", ("preprocess", "custom", "--input", "$W/mine/rows.jsonl", "--map-fn",
                                       "$W/mine/map.py:to_rl", "--out", "$W/mine", "--overwrite"), ("holds the input",)),
    Case("preprocess_into_home", ("preprocess", "arith", "--out", "$W/home"), ("is the home folder",)),
    Case("preprocess_over_earlier_output", ("preprocess", "arith", "--out", "$W/data_out"),
         ("$W/data_out", "earlier alignctl output", "--overwrite")),
    Case("preprocess_into_filesystem_root", ("preprocess", "arith", "--out", "/"), ("filesystem root",)),
    Case("preprocess_blank_system_prompt", ("preprocess", "arith", "--system-prompt", " ", "--out", "$W/sp"),
         ("system_prompt", "non-empty string")),
    Case("sft_into_users_folder", ("sft", "model.path=$A/model", "data.train_files=[$A/arith/sft_train.parquet]",
                                   "output_dir=$W/mine"), ("output_dir", "not written by alignctl")),
    Case("sft_nan_learning_rate", ("sft", "model.path=$A/model", "data.train_files=[$A/arith/sft_train.parquet]",
                                   "optim.lr=nan", "output_dir=$W/sft"), ("optim.lr", "finite number")),
    Case("sft_model_missing", ("sft", "model.path=$W/nope", "data.train_files=[$A/arith/sft_train.parquet]",
                               "output_dir=$W/sft"), ("model.path", "does not exist")),
    Case("sft_data_missing_column", ("sft", "model.path=$A/model", "data.train_files=[$A/arith/train.parquet]",
                                     "output_dir=$W/sft"), ("data.train_files", "missing column", "completion")),
    Case("train_rm_on_rl_prompts", ("train-rm", "model.path=$A/model", "data.train_files=[$A/arith/train.parquet]",
                                    "output_dir=$W/rm"), ("data.train_files", "missing column", "chosen")),
    Case("train_rm_into_users_folder", ("train-rm", "model.path=$A/model", "data.train_files=[$A/arith/pref_train.parquet]",
                                        "output_dir=$W/mine"), ("output_dir", "not written by alignctl")),
    Case("eval_into_users_folder", ("eval", "--policy", "$A/model", "--prompts", "$A/arith/test.parquet", "--out", "$W/mine"),
         ("--out", "not written by alignctl")),
    Case("eval_reward_model_is_causal_lm", ("eval", "--policy", "$A/model", "--reference", "$A/model", "--reward-model",
                                            "$A/model", "--prompts", "$A/arith/test.parquet", "--out", "$W/ev"),
         ("reward_model", "not a reward model")),
    Case("eval_prompts_missing", ("eval", "--policy", "$A/model", "--prompts", "$W/nope.parquet", "--out", "$W/ev"),
         ("prompts", "not found")),
    Case("eval_policy_missing", ("eval", "--policy", "$W/nope", "--prompts", "$A/arith/test.parquet", "--out", "$W/ev"),
         ("policy", "does not exist")),
    Case("init_model_into_users_folder", ("init-model", "--out", "$W/mine", "--tokenizer-from", "$A/arith/train.parquet",
                                          "--overwrite"), ("not written by alignctl",)),
    Case("pipeline_workdir_is_users_folder", ("run", "$A/pipe.yaml", "workdir=$W/mine"),
         ("workdir", "not created by alignctl")),
    Case("pipeline_duplicate_stage_names", ("run", "$A/dup_stages.yaml", "workdir=$W/wd"), ("duplicate key 'data'",)),
    Case("eval_prompts_are_preference_pairs", ("eval", "--policy", "$A/model", "--prompts", "$A/arith/pref_test.parquet",
                                               "--out", "$W/ev"), ("prompts", "a preference file")),
    Case("eval_reward_model_without_tokenizer", ("eval", "--policy", "$A/model", "--reward-model", "$A/rm_head",
                                                 "--prompts", "$A/arith/test.parquet", "--out", "$W/ev"),
         ("reward_model", "no tokenizer files")),
    Case("init_model_corrupt_tokenizer_data", ("init-model", "--out", "$W/m", "--tokenizer-from", "$A/digit_reward.py.parquet"),
         ("digit_reward.py.parquet", "not a readable parquet file")),
    Case("init_model_binary_jsonl", ("init-model", "--out", "$W/m", "--tokenizer-from", "$A/binary.jsonl"),
         ("binary.jsonl:1", "not valid UTF-8")),
    Case("pipeline_workdir_holds_an_input", ("run", "$A/pipe.yaml", "workdir=$A"), ("workdir", "holds the input")),
    Case("pipeline_workdir_tilde", ("run", "$A/pipe.yaml", "workdir=~"), ("workdir", "is the home folder")),
    Case("config_duplicate_key", ("sft", "--config", "$A/dup_keys.yaml"), ("dup_keys.yaml", "line 3", "duplicate key 'lr'")),
    Case("pipeline_bad_stage_value", ("run", "$A/pipe.yaml", "workdir=$W/wd", "rl.actor_rollout_ref.rollout.top_p=2"),
         ("stage 'rl'", "top_p")),
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad_runs_assets")
    make_assets(root, num_train=16, num_test=8)
    rows = pd.read_parquet(root / "arith" / "train.parquet")
    rows.drop(columns=["reward_model"]).to_parquet(root / "no_truth.parquet")
    empty_truth = rows.copy()
    empty_truth.at[1, "reward_model"] = {"style": "rule", "ground_truth": ""}
    empty_truth.to_parquet(root / "empty_truth.parquet")
    empty_prompt = rows.copy()
    empty_prompt.at[2, "prompt"] = [{"role": "user", "content": "  "}]
    empty_prompt.to_parquet(root / "empty_prompt.parquet")
    rows.assign(data_source="quiz").to_parquet(root / "unknown_source.parquet")
    rows.iloc[:0].to_parquet(root / "no_rows.parquet")
    (root / "broken.py").write_text("def compute_score(:\n")
    rows.assign(prompt=[m[0]["content"] for m in rows["prompt"]]).to_parquet(root / "string_prompt.parquet")
    (root / "digit_reward.py.parquet").write_text("garbage, not parquet\n")
    (root / "binary.jsonl").write_bytes(b"\x89binary\x00\xff\n")
    (root / "lm_no_tokenizer").mkdir()
    (root / "lm_no_tokenizer" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (root / "rm_head").mkdir()
    (root / "rm_head" / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"]}))
    (root / "dup_keys.yaml").write_text("optim:\n  lr: 1e-3\n  lr: 2e-3\n")
    (root / "dup_stages.yaml").write_text("stages:\n  data: {kind: preprocess, config: {dataset: arith}}\n"
                                          "  data: {kind: preprocess, config: {dataset: gsm8k}}\n")
    (root / "pipe.yaml").write_text(
        "stages:\n  data: {kind: preprocess, config: {dataset: arith, arith: {num_train: 8, num_test: 4}}}\n"
        f"  rl: {{kind: grpo, config: {{data: {{train_files: ['${{data}}/train.parquet'], train_batch_size: 4}}, "
        f"actor_rollout_ref: {{model: {{path: {root / 'model'}}}, rollout: {{n: 2}}, "
        f"actor: {{ppo_mini_batch_size: 4}}}}}}}}\n")
    return root


def _world(tmp_path: Path) -> Path:
    """The work folder: an earlier run, a folder of the user's, an earlier preprocess output."""
    work = tmp_path / "work"
    run = work / "run"
    run.mkdir(parents=True)
    (run / MARKER).write_text("{}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n')
    (run / "config.yaml").write_text("earlier: config\n")
    mine = work / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own file\n")
    (mine / "rows.jsonl").write_text('{"q": "1+1?", "a": 2}\n')
    (mine / "map.py").write_text("def to_rl(row):\n    return row\n")
    earlier = work / "data_out"
    earlier.mkdir()
    (earlier / MARKER).write_text("{}\n")
    (earlier / "train.parquet").write_bytes(b"earlier output")
    (work / "home").mkdir()
    (work / "home" / "dotfile").write_text("x\n")
    return work


def _snapshot(*roots: Path) -> dict[str, bytes | None]:
    files: dict[str, bytes | None] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            files[str(path)] = path.read_bytes() if path.is_file() else None
    return files


def _run_case(case: Case, assets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = _world(tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the one hub-shaped name must fail offline at once
    before = _snapshot(tmp_path, assets)
    args = [a.replace("$A", str(assets)).replace("$W", str(work)) for a in case.args]
    result = run_cli(*args)
    assert_user_error(result, *(n.replace("$A", str(assets)).replace("$W", str(work)) for n in case.needles))
    assert _snapshot(tmp_path, assets) == before, "files changed by a refused command"


@pytest.mark.parametrize("case", RL_CASES, ids=lambda c: c.id)
def test_bad_rl_run_is_refused_before_it_starts(case: Case, assets: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _run_case(case, assets, tmp_path, monkeypatch)


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=lambda c: c.id)
def test_bad_output_or_stage_is_refused(case: Case, assets: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _run_case(case, assets, tmp_path, monkeypatch)


def test_the_suite_is_large_enough() -> None:
    """Issue 20 asks for at least 60 fault/bad-input cases in this style."""
    assert len({c.id for c in RL_CASES + OUTPUT_CASES}) == len(RL_CASES + OUTPUT_CASES) >= 60


def test_overwrite_replaces_an_earlier_alignctl_output(assets: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The positive side of the rule: with --overwrite an alignctl output is replaced (and marked),
    and the files next to it are untouched."""
    work = _world(tmp_path)
    monkeypatch.chdir(work)
    neighbours = _snapshot(work / "mine", work / "run")
    result = run_cli("preprocess", "arith", "--out", str(work / "data_out"), "--overwrite", "arith.num_train=8",
                     "arith.num_test=4", "arith.num_sft=4", "arith.num_pref=4")
    assert result.code == 0, result.stderr
    assert len(pd.read_parquet(work / "data_out" / "train.parquet")) == 8
    assert (work / "data_out" / MARKER).is_file()
    assert _snapshot(work / "mine", work / "run") == neighbours
    assert not [p for p in work.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_an_empty_existing_folder_may_be_an_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    result = run_cli("preprocess", "arith", "--out", "empty", "arith.num_train=8", "arith.num_test=4",
                     "arith.num_sft=4", "arith.num_pref=4")
    assert result.code == 0, result.stderr
    assert (tmp_path / "empty" / "train.parquet").is_file()
    assert os.listdir(tmp_path) == ["empty"]


def test_overwrite_through_a_symlink_keeps_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--overwrite on a link to an alignctl output replaces the folder it points at, keeps the
    user's link, and leaves no hidden .old-/.tmp- entry beside the link."""
    monkeypatch.chdir(tmp_path)
    small = ["arith.num_train=8", "arith.num_test=4", "arith.num_sft=4", "arith.num_pref=4"]
    assert run_cli("preprocess", "arith", "--out", "real", *small).code == 0
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = run_cli("preprocess", "arith", "--out", "link", "--overwrite", "--seed", "3", *small)
    assert result.code == 0, result.stderr
    assert (tmp_path / "link").is_symlink() and (tmp_path / "link").resolve() == tmp_path / "real"
    assert (tmp_path / "real" / "train.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
