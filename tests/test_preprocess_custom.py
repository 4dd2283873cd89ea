"""custom: a user map_fn turns raw jsonl / parquet / csv rows into validated schema rows."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from alignctl.config.core import build_config
from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess import PreprocessReport, run_preprocess
from alignctl.errors import UserError

MAP_FNS = textwrap.dedent('''
    def to_rl(row):
        if row["q"].startswith("skip"):
            return None
        return {"data_source": "mine", "prompt": [{"role": "user", "content": row["q"]}],
                "ability": "qa", "reward_model": {"style": "rule", "ground_truth": str(row["a"])},
                "extra_info": {"split": "ignored", "index": 99, "source_id": row["id"]}}

    def to_pref(row):
        return {"data_source": "mine", "prompt": [{"role": "user", "content": row["q"]}],
                "chosen": [{"role": "assistant", "content": row["good"]}],
                "rejected": [{"role": "assistant", "content": row["bad"]}]}

    def to_sft(row):
        return {"data_source": "mine", "prompt": [{"role": "user", "content": row["q"]}],
                "completion": [{"role": "assistant", "content": row["a"]}]}

    def with_system(row):
        return {"data_source": "mine", "ability": "qa",
                "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["q"]}],
                "reward_model": {"style": "rule", "ground_truth": str(row["a"])}}

    def broken(row):
        return {"data_source": "mine", "prompt": [{"role": "bot", "content": row["q"]}],
                "ability": "qa", "reward_model": {"style": "rule", "ground_truth": "1"}}

    def raises(row):
        return {"prompt": [{"role": "user", "content": row["missing_key"]}]}

    def listy(row):
        return [row]

    NOT_A_FUNCTION = 3
''')


@pytest.fixture
def fns(tmp_path: Path) -> Path:
    path = tmp_path / "my_map.py"
    path.write_text(MAP_FNS)
    return path


def _run(tmp_path: Path, **keys: Any) -> PreprocessReport:
    cfg = build_config(PreprocessConfig, {"dataset": "custom", "out": str(tmp_path / "o"), **keys})
    return run_preprocess(cfg, progress=False)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rl_rows_from_jsonl_with_drops(tmp_path: Path, fns: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"id": 1, "q": "one?", "a": 1}, {"id": 2, "q": "skip me", "a": 0},
                                         {"id": 3, "q": "three?", "a": 3}])
    report = _run(tmp_path, input=str(src), map_fn=f"{fns}:to_rl")
    assert report.files == {"train.parquet": 2}
    assert report.dropped == {"map_fn_returned_none": 1}
    df = pd.read_parquet(tmp_path / "o" / "train.parquet")
    assert [r["ground_truth"] for r in df["reward_model"]] == ["1", "3"]
    # split/index are alignctl's; the user's other extra_info keys are kept.
    assert list(df["extra_info"]) == [{"split": "train", "index": 0, "source_id": 1},
                                      {"split": "train", "index": 1, "source_id": 3}]


def test_preference_rows_from_parquet_folder(tmp_path: Path, fns: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for split, n in (("train", 3), ("test", 2)):
        rows = [{"q": f"{split} {i}?", "good": "yes", "bad": "no"} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}.parquet")
    report = _run(tmp_path, input=str(src), map_fn=f"{fns}:to_pref", kind="preference")
    assert report.files == {"train.parquet": 3, "test.parquet": 2}
    test = pd.read_parquet(tmp_path / "o" / "test.parquet")
    assert list(test["extra_info"]) == [{"split": "test", "index": 0}, {"split": "test", "index": 1}]
    assert list(test.iloc[1]["chosen"]) == [{"role": "assistant", "content": "yes"}]


def test_sft_rows_from_csv(tmp_path: Path, fns: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text('q,a\n"Say hi, please",hi\nCount to 2,"1, 2"\n')
    report = _run(tmp_path, input=str(src), map_fn=f"{fns}:to_sft", kind="sft")
    assert report.files == {"train.parquet": 2}
    df = pd.read_parquet(tmp_path / "o" / "train.parquet")
    assert [list(c) for c in df["completion"]] == [[{"role": "assistant", "content": "hi"}],
                                                   [{"role": "assistant", "content": "1, 2"}]]


def test_invalid_mapped_row_names_input_line_and_field(tmp_path: Path, fns: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"q": "a"}, {"q": "b"}])
    with pytest.raises(UserError) as info:
        _run(tmp_path, input=str(src), map_fn=f"{fns}:broken")
    assert str(info.value) == (f"{src}:1: invalid rl row: field 'prompt[0].role' expected one of "
                               "system/user/assistant, got 'bot'")
    assert not (tmp_path / "o").exists()
    with pytest.raises(UserError, match="no rows left for train.parquet"):
        _run(tmp_path, input=str(src), map_fn=f"{fns}:broken", skip_bad_rows=True)


def test_map_fn_exceptions_and_non_dicts(tmp_path: Path, fns: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"q": "a"}])
    with pytest.raises(UserError) as info:
        _run(tmp_path, input=str(src), map_fn=f"{fns}:raises")
    assert str(info.value) == f"{src}:1: map_fn raised KeyError: 'missing_key'"
    with pytest.raises(UserError, match=r"in.jsonl:1: map_fn returned list, expected a dict row or None"):
        _run(tmp_path, input=str(src), map_fn=f"{fns}:listy")


def test_skip_bad_rows_counts_every_reason(tmp_path: Path, fns: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "q": "ok?", "a": 1}\n{"id": 2, "a": 2}\nnot json\n{"id": 4, "q": "fine?", "a": 4}\n')
    report = _run(tmp_path, input=str(src), map_fn=f"{fns}:to_rl", skip_bad_rows=True)
    assert report.files == {"train.parquet": 2}
    assert report.skipped == {"invalid_json": 1, "map_fn_error": 1}
    assert report.examples == [f"{src}:2: map_fn raised KeyError: 'q'",
                               f"{src}:3: expected one JSON object per line, got invalid JSON "
                               "(Expecting value)"]


@pytest.mark.parametrize(("spec", "message"), [
    ("no_colon.py", "key 'map_fn' expected 'path/to/file.py:function'"),
    ("{dir}/absent.py:f", "key 'map_fn': file '{dir}/absent.py' not found"),
    ("{fns}:nope", "key 'map_fn': '{fns}' has no function 'nope'"),
    ("{fns}:NOT_A_FUNCTION", "key 'map_fn': {fns}:NOT_A_FUNCTION is not a function (got int)"),
    ("{bad}:f", "key 'map_fn': importing '{bad}' failed: ZeroDivisionError: division by zero"),
])
def test_map_fn_loading_errors(tmp_path: Path, fns: Path, spec: str, message: str) -> None:
    bad = tmp_path / "bad_module.py"
    bad.write_text("x = 1 / 0\n")
    names = {"dir": tmp_path, "fns": fns, "bad": bad}
    src = _jsonl(tmp_path / "in.jsonl", [{"q": "a"}])
    with pytest.raises(UserError) as info:
        _run(tmp_path, input=str(src), map_fn=spec.format(**names))
    assert str(info.value).startswith(message.format(**names)), str(info.value)


def test_custom_only_keys_are_refused_elsewhere(tmp_path: Path) -> None:
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "o"), "map_fn": "f.py:g"})
    with pytest.raises(UserError, match="preprocess arith: key 'map_fn' is only used by dataset 'custom'"):
        run_preprocess(cfg, progress=False)


def test_system_prompt_refuses_rows_that_have_one(tmp_path: Path, fns: Path) -> None:
    """A second system message would be silently stacked on the row's own: one line naming the row
    instead, and no output folder."""
    src = _jsonl(tmp_path / "in.jsonl", [{"id": 1, "q": "2+2?", "a": 4}])
    with pytest.raises(UserError, match=r"in\.jsonl:1: the prompt already starts with a system message; "
                                        r"key 'system_prompt' would add a second one"):
        _run(tmp_path, input=str(src), map_fn=f"{fns}:with_system", system_prompt="Solve it.")
    assert not (tmp_path / "o").exists()
    _run(tmp_path, input=str(src), map_fn=f"{fns}:to_rl", system_prompt="Solve it.")
    prompt = list(pd.read_parquet(tmp_path / "o" / "train.parquet")["prompt"][0])
    assert prompt == [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2+2?"}]


def test_system_prompt_rows_that_have_one_can_be_skipped(tmp_path: Path, fns: Path) -> None:
    """With skip_bad_rows the rows with their own system message are counted and left out, like any
    bad row; the others get the system message."""
    fns_with = tmp_path / "mixed.py"
    fns_with.write_text(
        "def f(row):\n"
        "    user = [{'role': 'user', 'content': row['q']}]\n"
        "    own = [{'role': 'system', 'content': 'Be brief.'}] if row['id'] == 2 else []\n"
        "    return {'data_source': 'mine', 'ability': 'qa', 'prompt': own + user,\n"
        "            'reward_model': {'style': 'rule', 'ground_truth': str(row['a'])}}\n")
    src = _jsonl(tmp_path / "in.jsonl", [{"id": i, "q": f"{i}+{i}?", "a": 2 * i} for i in (1, 2, 3)])
    report = _run(tmp_path, input=str(src), map_fn=f"{fns_with}:f", system_prompt="Solve it.", skip_bad_rows=True)
    assert report.files == {"train.parquet": 2}
    assert report.skipped == {"system_message_present": 1}
    assert report.examples == [f"{src}:2: the prompt already starts with a system message; key 'system_prompt' "
                               "would add a second one (leave the key out, drop that message, or skip such rows "
                               "with skip_bad_rows)"]
    prompts = [list(p) for p in pd.read_parquet(tmp_path / "o" / "train.parquet")["prompt"]]
    assert prompts == [[{"role": "system", "content": "Solve it."}, {"role": "user", "content": f"{i}+{i}?"}]
                       for i in (1, 3)]
