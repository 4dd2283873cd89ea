"""One home per shared helper (docs/architecture.md): the attention-kernel rule, ``device: auto``,
padding ragged rows, the progress bar, JSON-lines and parquet reading, asking the hub, and atomic
file writes. Each test pins the behaviour chosen where copies used to disagree; the last one keeps
new copies from appearing."""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import pytest
import torch

import alignctl
from alignctl import console
from alignctl import device as device_mod
from alignctl.batch import pad_rows
from alignctl.data.readers import BadRows, parquet_columns, read_jsonl, read_parquet
from alignctl.errors import UserError
from alignctl.models import attention
from alignctl.models.attention import AUTO, SEGMENT_SDPA, resolve_attn_implementation, resolve_packing, resolve_share_prompt
from alignctl.pipeline.atomic import atomic_write_text

PACKAGE = Path(alignctl.__file__).parent


# ----------------------------------------------------------------------------- attention kernel


@pytest.mark.parametrize(("device", "packing", "flash", "expected"), [
    ("cuda", True, True, "flash_attention_2"),
    ("cuda:1", True, True, "flash_attention_2"),
    ("cuda", False, True, "sdpa"),  # the SFT/RM rule used to say flash_attention_2 here
    ("cuda", True, False, SEGMENT_SDPA),
    ("cpu", True, True, SEGMENT_SDPA),
    ("cpu", False, True, "sdpa"),
    ("cpu", False, False, "sdpa"),
])
def test_auto_attention_rule(monkeypatch: pytest.MonkeyPatch, device: str, packing: bool, flash: bool,
                             expected: str) -> None:
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: flash)
    assert resolve_attn_implementation("auto", device=device, packing=packing) == expected


def test_named_attention_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    for name in ("eager", "sdpa", "flash_attention_2", SEGMENT_SDPA):
        assert resolve_attn_implementation(name, device="cuda", packing=True) == name


@pytest.mark.parametrize(("device", "flash", "packing", "share"), [
    ("cpu", False, True, True),  # packing and sharing pay on CPU (docs/rl.md)
    ("cpu", True, True, True),
    ("cuda", False, False, False),  # H200: padded sdpa 3.7-7.7x faster than the segment kernel
    ("cuda:1", False, False, False),
    ("cuda", True, True, False),  # flash-attn's varlen packing; it cannot express a shared prompt
])
def test_auto_packing_rule(monkeypatch: pytest.MonkeyPatch, device: str, flash: bool, packing: bool,
                           share: bool) -> None:
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: flash)
    assert resolve_packing(AUTO, device=device) is packing
    assert resolve_share_prompt(AUTO, device=device, packing=packing) is share


def test_explicit_packing_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)
    for device in ("cpu", "cuda"):
        assert resolve_packing(True, device=device) is True and resolve_packing(False, device=device) is False
        assert resolve_share_prompt(True, device=device, packing=True) is True
        assert resolve_share_prompt(False, device=device, packing=True) is False
        # a shared prompt lives in packed rows: without packing there is nothing to share
        assert resolve_share_prompt(True, device=device, packing=False) is False


def test_rl_workers_resolve_auto_packing_once_for_their_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from alignctl.config.core import build_config
    from alignctl.config.rl import RLConfig
    from alignctl.workers.model_setup import resolve_packing_settings

    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)

    def config(**critic_model: object) -> RLConfig:
        return build_config(RLConfig, {"actor_rollout_ref": {"model": {"path": "unread"}, "rollout": {"n": 2}},
                                       "data": {"train_files": ["unread.parquet"]}, "critic": {"model": critic_model}})

    cfg = config(share_prompt=True)
    arr, critic = cfg.actor_rollout_ref.model, cfg.critic.model
    assert (arr.use_remove_padding, arr.share_prompt, critic.use_remove_padding) == (AUTO, AUTO, AUTO)
    resolve_packing_settings(cfg, "cuda")
    assert (arr.use_remove_padding, arr.share_prompt) == (False, False)
    assert (critic.use_remove_padding, critic.share_prompt) == (False, False)  # explicit True, but nothing packed
    cfg = config(use_remove_padding=True)
    resolve_packing_settings(cfg, "cuda")
    assert (cfg.critic.model.use_remove_padding, cfg.critic.model.share_prompt) == (True, False)
    cfg = config()
    resolve_packing_settings(cfg, "cpu")
    assert (cfg.actor_rollout_ref.model.use_remove_padding, cfg.actor_rollout_ref.model.share_prompt) == (True, True)


def test_packing_keys_take_booleans_or_auto_only() -> None:
    from alignctl.config.core import build_config
    from alignctl.config.train_rm import RewardModelConfig
    from alignctl.config.rl import RLConfig

    rm = {"model": {"path": "unread"}, "data": {"train_files": ["unread.parquet"]}}
    assert build_config(RewardModelConfig, {**rm, "share_prompt": False}).share_prompt is False
    assert build_config(RewardModelConfig, rm).share_prompt == AUTO
    with pytest.raises(UserError, match=r"key 'actor_rollout_ref.model.use_remove_padding' expected bool or one of "
                                        r"'auto', got 'yes'"):
        build_config(RLConfig, {"actor_rollout_ref": {"model": {"path": "unread", "use_remove_padding": "yes"},
                                                      "rollout": {"n": 2}}, "data": {"train_files": ["unread.parquet"]}})


# --------------------------------------------------------------------------------------- device


def test_auto_device_follows_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    assert device_mod.resolve_device("auto") == "cuda"
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    assert device_mod.resolve_device() == "cpu"
    assert device_mod.resolve_device("cpu") == "cpu"


def test_cuda_without_cuda_checked_only_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    # RL controller / plan: the workers may sit on GPU nodes of a cluster.
    assert device_mod.resolve_device("cuda") == "cuda"
    with pytest.raises(UserError, match=r"^--device is 'cuda:0' but CUDA is not available on this machine; use"):
        device_mod.resolve_device("cuda:0", key="--device")


def test_plan_and_eval_use_the_device_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from alignctl.config.core import build_config
    from alignctl.config.rl import RLConfig
    from alignctl.plan import memory as mem
    from alignctl.plan.estimate import plan_rl

    shape = mem.ModelShape(params=1000, layers=2, hidden=4, intermediate=8, vocab=10, kv_width=2)
    base = {"algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"model": {"path": "unread"}, "rollout": {"n": 2}},
            "data": {"train_files": ["unread.parquet"]}}
    cfg = build_config(RLConfig, base)
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    assert plan_rl(cfg, 2**40, {"actor": shape}).device == "cuda"
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    assert plan_rl(cfg, 2**40, {"actor": shape}).device == "cpu"
    cuda = build_config(RLConfig, {**base, "trainer": {"device": "cuda"}})
    assert plan_rl(cuda, 2**40, {"actor": shape}).device == "cuda"  # for workers elsewhere: not refused


# -------------------------------------------------------------------------------------- padding


def test_pad_rows_by_hand() -> None:
    rows = [[5, 6, 7], [8], []]
    ids, mask = pad_rows(rows, 0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert ids.dtype == torch.long and mask.dtype == torch.long

    ids, mask = pad_rows(rows, 9, width=4, side="left")
    assert ids.tolist() == [[9, 5, 6, 7], [9, 9, 9, 8], [9, 9, 9, 9]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]

    logps, mask = pad_rows([[-0.5, -1.5], [-2.0]], 0.0, dtype=torch.float32)
    assert logps.tolist() == [[-0.5, -1.5], [-2.0, 0.0]] and logps.dtype == torch.float32
    assert mask.tolist() == [[1, 1], [1, 0]]

    ids, mask = pad_rows([torch.tensor([1, 2]), (3,)], 0)  # tensors and tuples as rows
    assert ids.tolist() == [[1, 2], [3, 0]]
    assert pad_rows([], 0)[0].shape == (0, 0)


def test_pad_rows_refuses_a_row_wider_than_width() -> None:
    with pytest.raises(ValueError, match="row 1 has 3 entries, more than the width 2"):
        pad_rows([[1], [1, 2, 3]], 0, width=2, side="left")
    with pytest.raises(ValueError, match="pad side"):
        pad_rows([[1]], 0, side="middle")  # type: ignore[arg-type]


def test_rollout_output_and_batch_assembly_pad_alike() -> None:
    from alignctl.rollout.engine import RolloutOutput
    from alignctl.workers.sequences import assemble

    out = RolloutOutput.from_ragged([[5, 6], [7]], [[-0.1, -0.2], [-0.3]], ["stop", "length"], n=1,
                                    pad_token_id=0)
    assert out.response_ids.tolist() == [[5, 6], [7, 0]]
    assert out.response_mask.tolist() == [[1, 1], [1, 0]]
    assert torch.allclose(out.log_probs, torch.tensor([[-0.1, -0.2], [-0.3, 0.0]]))
    with pytest.raises(ValueError, match="one entry per response token"):
        RolloutOutput.from_ragged([[5, 6]], [[-0.1]], ["stop"], n=1, pad_token_id=0)
    tensors = assemble([[1, 2], [3]], out, prompt_width=3, response_width=3, pad_id=0)
    assert tensors["prompts"].tolist() == [[0, 1, 2], [0, 0, 3]]
    assert tensors["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]]


# ---------------------------------------------------------------------------------- progress bar


def test_one_progress_bar_look(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = console.progress_bar()
    assert len(bar.columns) == 4 and bar.live.transient and bar.console.stderr

    made = []

    def spy():
        made.append(1)
        return bar

    monkeypatch.setattr(console, "progress_bar", spy)
    assert list(console.track([1, 2, 3], "items", enabled=True)) == [1, 2, 3]
    assert list(console.track([1, 2], "items", enabled=False)) == [1, 2]
    assert made == [1]


def test_preprocess_progress_uses_the_console_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.data.preprocess.common import Context

    made = []
    monkeypatch.setattr(console, "progress_bar", lambda: made.append(1) or console.Progress())
    ctx = Context(PreprocessConfig(), tmp_path, progress=True)
    monkeypatch.setattr(console, "progress_enabled", lambda: False)  # a log file, not a terminal
    assert list(ctx.track([1, 2], "rows")) == [1, 2] and made == []
    monkeypatch.setattr(console, "progress_enabled", lambda: True)
    assert list(ctx.track([1, 2], "rows")) == [1, 2] and made == [1]


# ------------------------------------------------------------------------------------ json lines


def test_read_jsonl_where_blank_lines_and_gzip(tmp_path: Path) -> None:
    text = '{"a": 1}\n\n[2]\n"three"\n'
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    assert list(read_jsonl(path)) == [(f"{path}:1", {"a": 1}), (f"{path}:3", [2]), (f"{path}:4", "three")]
    gz = tmp_path / "x.jsonl.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert [value for _, value in read_jsonl(gz)] == [{"a": 1}, [2], "three"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert list(read_jsonl(empty)) == []
    with pytest.raises(UserError, match="empty file"):
        list(read_jsonl(empty, allow_empty=False))


def test_read_jsonl_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n{oops\n\xff\xfe\n{"b": 2}')
    with pytest.raises(UserError, match=rf"^{path}:2: expected one JSON object per line, got invalid JSON"):
        list(read_jsonl(path))
    bad = BadRows(skip=True)
    assert [v for _, v in read_jsonl(path, bad)] == [{"a": 1}, {"b": 2}]
    assert dict(bad.counts) == {"invalid_json": 1, "invalid_utf8": 1}


def test_torn_tail_only_when_the_last_line_is_unterminated(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x"')
    assert [v for _, v in read_jsonl(path, torn_tail=True)] == [{"step": 1}]
    with pytest.raises(UserError, match=":2: "):
        list(read_jsonl(path))
    path.write_text('{"step": 1}\n{"step": 2, "x"\n')  # complete line, just wrong: reported
    with pytest.raises(UserError, match=":2: "):
        list(read_jsonl(path, torn_tail=True))


def test_metrics_readers_share_the_rule(tmp_path: Path) -> None:
    from alignctl.eval.curves import read_metrics
    from alignctl.trainers.checkpoint_folders import read_metric_rows

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    assert [r["step"] for r in read_metric_rows(path)] == [1, 2]
    assert read_metrics(tmp_path)["a"] == [(1.0, 1.0), (2.0, 2.0)]  # eval of a run being written
    # A broken line in the middle is an error, not the silent end of the file (truncating on
    # resume would then drop every later row).
    path.write_text('{"step": 1}\n{broken\n{"step": 3}\n')
    for read in (lambda: read_metric_rows(path), lambda: read_metrics(tmp_path)):
        with pytest.raises(UserError, match=rf"{path}:2: expected one JSON object per line"):
            read()


def test_tokenizer_text_reader_names_file_and_line(tmp_path: Path) -> None:
    from alignctl.models.tiny import iter_texts

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"text": "hello"}) + "\n{bad\n")
    texts = iter_texts([path])
    assert next(texts) == "hello"
    with pytest.raises(UserError, match=rf"^{path}:2: expected one JSON object per line"):
        next(texts)


# --------------------------------------------------------------------------------------- parquet


def _frame_file(path: Path, rows: list[dict]) -> Path:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)
    return path


def test_read_parquet_errors_are_one_line_and_name_the_file(tmp_path: Path) -> None:
    import pandas as pd

    good = _frame_file(tmp_path / "good.parquet", [{"prompt": "p", "data_source": "s", "n": 1}])
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(good).head(0).to_parquet(empty)
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = [
        (tmp_path / "absent.parquet", {}, "file not found; expected a parquet file of RL rows"),
        (folder, {}, "is a folder; expected a parquet file of RL rows"),
        (text, {}, "not a readable parquet file (ArrowInvalid: "),
        (good, {"required": ["prompt", "answer", "reward_model.ground_truth"]},
         "missing columns 'answer', 'reward_model.ground_truth'; expected RL rows (found: prompt, data_source, n)"),
        (good, {"columns": ["answer"]}, "missing column 'answer'; expected RL rows"),
        (empty, {"allow_empty": False}, "no rows; expected RL rows"),
    ]
    for path, kw, needle in cases:
        with pytest.raises(UserError) as info:
            read_parquet(path, "RL rows", key="data.train_files", **kw)
        message = str(info.value)
        assert message.startswith(f"data.train_files {path}: ") and needle in message, message
        assert "\n" not in message
    with pytest.raises(UserError, match=rf"^{text}: not a readable parquet file"):
        parquet_columns(text)

    table = read_parquet(good, required=["prompt"], columns=["n"])
    assert table.column_names == ["n"] and table.to_pylist() == [{"n": 1}]
    assert read_parquet(good, columns=[]).num_rows == 1  # the row count without reading a column
    assert read_parquet(empty).num_rows == 0  # empty is allowed unless the caller says otherwise
    assert parquet_columns(good) == ["prompt", "data_source", "n"]
    frame = read_parquet(good).to_pandas()
    assert frame.equals(pd.read_parquet(good))  # the DataFrame callers see what pandas would read


def test_every_parquet_caller_uses_the_one_reader(tmp_path: Path) -> None:
    """A file that is not parquet gets the same refusal from every reader of parquet files."""
    from alignctl.api import _has_ground_truth
    from alignctl.audit.pairs import read_frame
    from alignctl.data.readers import read_records
    from alignctl.data.rl_dataset import read_prompt_files
    from alignctl.eval.data import load_preference_pairs
    from alignctl.models.tiny import iter_texts
    from alignctl.preflight.context import Context
    from alignctl.preflight.data_checks import check_columns, check_rl_prompts
    from alignctl.trainers.sft_common import read_parquet_files

    bad = tmp_path / "bad.parquet"
    bad.write_text("prompt,chosen\n")
    callers = {
        "preprocess input": lambda: list(read_records(bad, BadRows())),
        "RL prompts": lambda: read_prompt_files([str(bad)], "prompt"),
        "SFT / RM data": lambda: read_parquet_files([str(bad)], "data.train_files"),
        "tokenizer text": lambda: list(iter_texts([bad])),
        "eval preference pairs": lambda: load_preference_pairs(bad),
        "audit": lambda: read_frame(str(bad), "preference pairs", ("prompt",)),
        "preflight columns": lambda: check_columns([str(bad)], "data.train_files", Context(), ["prompt"], "rows"),
        "preflight RL prompts": lambda: check_rl_prompts([str(bad)], "data.train_files", Context(),
                                                         prompt_key="prompt", default_scorer=False),
        "Python API": lambda: _has_ground_truth([str(bad)]),
    }
    for caller, call in callers.items():
        with pytest.raises(UserError) as info:
            call()
        assert f"{bad}: not a readable parquet file (ArrowInvalid: " in str(info.value), (caller, str(info.value))


def test_parquet_callers_share_the_missing_column_and_empty_wording(tmp_path: Path) -> None:
    from alignctl.data.rl_dataset import read_prompt_files
    from alignctl.eval.data import load_preference_pairs
    from alignctl.preflight.context import Context
    from alignctl.preflight.data_checks import check_columns
    from alignctl.trainers.sft_common import read_parquet_files

    import pandas as pd

    rows = _frame_file(tmp_path / "rows.parquet", [{"prompt": "p", "data_source": "s"}])
    for call in (lambda: read_prompt_files([str(rows)], "question"),
                 lambda: load_preference_pairs(rows),
                 lambda: check_columns([str(rows)], "prompts", Context(), ["prompt", "chosen"], "pairs")):
        with pytest.raises(UserError, match=r"rows.parquet: missing columns? '(question|chosen)'"):
            call()
    empty = tmp_path / "empty.parquet"
    pd.read_parquet(rows).head(0).to_parquet(empty)
    for call in (lambda: read_parquet_files([str(empty)], "data.val_files"),
                 lambda: check_columns([str(empty)], "data.val_files", Context(), ["prompt"], "rows")):
        with pytest.raises(UserError, match=rf"^data.val_files {empty}: no rows; expected"):
            call()


# ------------------------------------------------------------------------------------------- hub


@pytest.fixture
def refused_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Port 9 (discard) on localhost refuses connections at once: an offline hub, deterministically."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def test_hub_problem_is_fast_and_says_network(refused_hub: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import huggingface_hub
    from huggingface_hub import constants

    from alignctl.hub import hub_problem, is_network_problem

    start = time.monotonic()
    for repo_type in ("model", "dataset"):
        why = hub_problem("someone/nothing-here", repo_type)
        assert why is not None and is_network_problem(why), why
    assert time.monotonic() - start < 15
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/cache/config.json")
    assert hub_problem("someone/cached", cached_file="config.json") is None  # the cache answers first
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    why = hub_problem("someone/cached", cached_file="config.json")
    assert why is not None and "offline" in why and is_network_problem(why)
    assert not is_network_problem("the hub answered RepositoryNotFoundError")


def test_preflight_and_gsm8k_ask_the_hub_the_same_way(refused_hub: None, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    import datasets

    from alignctl import hub
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.data.preprocess import gsm8k
    from alignctl.data.preprocess.common import Context as PreprocessContext
    from alignctl.preflight.context import Context
    from alignctl.preflight.models import check_model

    asked: list[tuple[str, str]] = []
    real = hub.hub_problem

    def spy(repo_id: str, repo_type: hub.RepoType = "model", **kw) -> str | None:
        asked.append((repo_id, repo_type))
        return real(repo_id, repo_type, **kw)

    monkeypatch.setattr("alignctl.preflight.models.hub_problem", spy)
    monkeypatch.setattr("alignctl.data.preprocess.gsm8k.hub_problem", spy)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(UserError, match=r"^actor someone/policy: no such local folder, and not usable as a hub "
                                        r"model id \(the hub answered ConnectError\)"):
        check_model("someone/policy", "actor", Context())
    check_model("someone/policy", "actor", Context(offline_ok=True))  # a dry run offline: a note only
    ctx = PreprocessContext(PreprocessConfig(dataset="gsm8k"), tmp_path, progress=False)
    with pytest.raises(UserError, match=r"^gsm8k: cannot reach the dataset hub to load 'openai/gsm8k' \(offline\?\)"):
        gsm8k._sources(ctx)
    assert asked == [("someone/policy", "model"), ("someone/policy", "model"), ("openai/gsm8k", "dataset")]

    # The hub answered "no such data set": not an offline machine, so datasets' own error is shown.
    monkeypatch.setattr("alignctl.data.preprocess.gsm8k.hub_problem",
                        lambda *a, **k: "the hub answered RepositoryNotFoundError")

    def no_such_dataset(*args, **kwargs):
        raise FileNotFoundError("no such data set")

    monkeypatch.setattr(datasets, "load_dataset", no_such_dataset)
    with pytest.raises(UserError, match=r"^gsm8k: cannot load 'openai/gsm8k' \(config 'main'\) from the dataset hub"):
        gsm8k._sources(ctx)


# ---------------------------------------------------------------------------------- atomic files


def test_atomic_write_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "latest.txt"
    atomic_write_text(path, "1\n")
    atomic_write_text(path, "2\n")
    assert path.read_text() == "2\n" and [p.name for p in tmp_path.iterdir()] == ["latest.txt"]

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr("alignctl.pipeline.atomic.os.replace", fail)
    with pytest.raises(OSError):
        atomic_write_text(path, "3\n")
    assert path.read_text() == "2\n" and [p.name for p in tmp_path.iterdir()] == ["latest.txt"]


# ------------------------------------------------------------------------------- no new copies


def _calls_and_defs() -> list[tuple[str, str, str]]:
    """(module path, 'def'|'call'|'method'|'attr', name) for every function definition and call in
    alignctl ('method': a call on a name, ``pd.read_parquet``, as well)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((rel, "def", node.name))
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                found.append((rel, "call", name))
                if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
                    found.append((rel, "method", f"{fn.value.id}.{fn.attr}"))  # pd.read_parquet, ...
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "cuda" and node.attr == "is_available":
                found.append((rel, "attr", "cuda.is_available"))
    return found


def test_each_job_is_written_once() -> None:
    found = _calls_and_defs()
    homes = {
        "resolve_attn_implementation": {"alignctl/models/attention.py"},
        "resolve_device": {"alignctl/device.py"},
        "cuda_available": {"alignctl/device.py"},
        "pad_rows": {"alignctl/batch.py"},
        "left_pad": set(),
        "read_jsonl": {"alignctl/data/readers.py"},
        "progress_bar": {"alignctl/console.py"},
        "atomic_write_text": {"alignctl/pipeline/atomic.py"},
        "import_file": {"alignctl/user_code.py"},
        "read_parquet": {"alignctl/data/readers.py"},
        "parquet_columns": {"alignctl/data/readers.py"},
        "require_columns": {"alignctl/data/readers.py"},
        "read_parquet_file": set(),
        "hub_problem": {"alignctl/hub.py"},
        "is_network_problem": {"alignctl/hub.py"},
        "_hub_reachable": set(),
        "_network_failure": set(),
    }
    for name, where in homes.items():
        assert {rel for rel, kind, n in found if kind == "def" and n == name} == where, name
    # Parquet files are opened by the one reader only (pyarrow's and pandas' readers, the footer).
    for name in ("read_table", "read_schema", "ParquetFile", "read_metadata"):
        assert {rel for rel, kind, n in found if kind == "call" and n == name} <= {"alignctl/data/readers.py"}, name
    assert not {rel for rel, kind, n in found if kind == "method" and n in ("pd.read_parquet", "pandas.read_parquet")}
    # The hub is asked in one place (a socket to it, its API, its cache).
    for name in ("create_connection", "HfApi", "try_to_load_from_cache", "model_info", "dataset_info", "repo_info"):
        assert {rel for rel, kind, n in found if kind == "call" and n == name} <= {"alignctl/hub.py"}, name
    # torch.cuda.is_available: the device rule, plus the checkpoint RNG state (is CUDA state there to save?)
    assert {rel for rel, kind, _ in found if kind == "attr"} <= {"alignctl/device.py", "alignctl/workers/checkpoint.py"}
    # rich's Progress is built in one place
    assert {rel for rel, kind, n in found if kind == "call" and n == "Progress"} == {"alignctl/console.py"}
    # Report templates: one jinja environment (its loader, filters and escaping) for eval and audit
    assert {rel for rel, kind, n in found if kind == "call" and n in ("Environment", "PackageLoader")} \
        == {"alignctl/templating.py"}
    for name in ("template_environment", "fmt", "pct", "md_fence"):
        assert {rel for rel, kind, n in found if kind == "def" and n == name} == {"alignctl/templating.py"}, name
