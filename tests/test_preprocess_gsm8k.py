"""GSM8K -> RL parquet on the real dataset: counts, golden rows checked by hand, splits, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alignctl.config.core import build_config
from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess import PreprocessReport, run_preprocess
from alignctl.data.preprocess.gsm8k import INSTRUCTION, extract_answer
from alignctl.errors import UserError


def _run(out: Path, **keys: Any) -> PreprocessReport:
    cfg = build_config(PreprocessConfig, {"dataset": "gsm8k", "out": str(out), **keys})
    return run_preprocess(cfg, progress=False)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreprocessReport, Path]:
    from conftest import SHARED_DATA

    if not SHARED_DATA.exists():
        pytest.skip(f"needs the shared data folder at {SHARED_DATA}")
    out = tmp_path_factory.mktemp("gsm8k") / "out"
    return _run(out, input=str(SHARED_DATA / "gsm8k")), out


def test_full_dataset_counts(full: tuple[PreprocessReport, Path]) -> None:
    report, out = full
    assert report.out_dir == out.absolute()
    assert report.files == {"train.parquet": 7473, "test.parquet": 1319}
    assert report.dropped == {} and report.skipped == {} and report.examples == []
    assert sorted(p.name for p in out.iterdir()) == [".alignctl-output", "meta.json", "test.parquet", "train.parquet"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dataset"] == "gsm8k" and meta["files"] == report.files
    assert meta["config"]["input"].endswith("gsm8k")


def test_first_test_row_golden(full: tuple[PreprocessReport, Path]) -> None:
    row = pd.read_parquet(full[1] / "test.parquet").iloc[0]
    # Janet: 16 - 3 - 4 = 9 eggs sold, 9 * $2 = 18 (the reference answer says "#### 18").
    assert row["reward_model"] == {"style": "rule", "ground_truth": "18"}
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    question = row["extra_info"]["question"]
    assert question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert list(row["prompt"]) == [{"role": "user", "content": question + " " + INSTRUCTION}]
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == 0
    assert row["extra_info"]["answer"].endswith("#### 18")


def test_train_rows_golden(full: tuple[PreprocessReport, Path]) -> None:
    train = pd.read_parquet(full[1] / "train.parquet")
    first = train.iloc[0]
    # Natalia sold 48 clips in April and half as many (48 / 2 = 24) in May: 48 + 24 = 72.
    assert first["extra_info"]["question"].startswith("Natalia sold clips to 48 of her friends")
    assert first["reward_model"]["ground_truth"] == "72"
    # Line 346 of train.jsonl ends "#### 1,080": the thousands separator is dropped.
    assert train.iloc[345]["extra_info"]["answer"].endswith("#### 1,080")
    assert train.iloc[345]["reward_model"]["ground_truth"] == "1080"
    assert list(train["extra_info"].map(lambda e: e["index"])) == list(range(7473))


def test_reads_back_with_datasets(full: tuple[PreprocessReport, Path], tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_parquet(str(full[1] / "test.parquet"), cache_dir=str(tmp_path))
    assert len(ds) == 1319
    assert ds[0]["reward_model"] == {"style": "rule", "ground_truth": "18"}
    assert ds[0]["prompt"][0]["role"] == "user"


@pytest.mark.parametrize(("answer", "expected"), [
    ("2 + 2 = 4\n#### 4", "4"),
    ("...\n#### 1,080", "1080"),
    ("...\n#### -10", "-10"),
    ("a #### b\n#### 7 ", "7"),  # the last marker wins
    ("no marker here", None),
    ("#### ", None),
])
def test_extract_answer(answer: str, expected: str | None) -> None:
    assert extract_answer(answer) == expected


def _small_file(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_single_file_test_fraction_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    src = _small_file(tmp_path)
    a = _run(tmp_path / "a", input=str(src), test_fraction=0.25, seed=3)
    b = _run(tmp_path / "b", input=str(src), test_fraction=0.25, seed=3)
    assert a.files == b.files and sum(a.files.values()) == 40 and a.files["test.parquet"] > 0
    for name in a.files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    train = pd.read_parquet(tmp_path / "a" / "train.parquet")
    test = pd.read_parquet(tmp_path / "a" / "test.parquet")
    questions = lambda df: {e["question"] for e in df["extra_info"]}  # noqa: E731
    assert not questions(train) & questions(test)
    assert questions(train) | questions(test) == {f"What is {i} + {i}?" for i in range(40)}
    assert list(test["extra_info"].map(lambda e: (e["split"], e["index"]))) == \
        [("test", i) for i in range(len(test))]


def test_max_rows_truncates_each_split(tmp_path: Path) -> None:
    report = _run(tmp_path / "o", input=str(_small_file(tmp_path)), max_rows=5)
    assert report.files == {"train.parquet": 5}
    gt = [r["ground_truth"] for r in pd.read_parquet(tmp_path / "o" / "train.parquet")["reward_model"]]
    assert gt == ["0", "2", "4", "6", "8"]


def test_bad_rows_raise_or_are_skipped(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"question": "q1", "answer": "#### 1"}\n{"question": "q2", "answer": "2"}\n'
                   '{"question": "q3"}\n{"question": "q4", "answer": "#### 4"}\n')
    with pytest.raises(UserError) as info:
        _run(tmp_path / "o", input=str(src))
    assert str(info.value) == f"{src}:2: field 'answer' expected a final line '#### <number>'"
    assert not (tmp_path / "o").exists()  # nothing left behind on error
    report = _run(tmp_path / "o", input=str(src), skip_bad_rows=True)
    assert report.files == {"train.parquet": 2}
    assert report.skipped == {"missing_field:answer": 1, "no_final_answer": 1}
    assert report.examples == [f"{src}:2: field 'answer' expected a final line '#### <number>'",
                               f"{src}:3: missing field 'answer' (expected a string)"]


def test_hub_unreachable_is_a_fast_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 (discard) on localhost refuses connections at once: an offline hub, deterministically.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    with pytest.raises(UserError, match="openai/gsm8k"):
        _run(tmp_path / "o")
    assert time.monotonic() - start < 15
    assert not (tmp_path / "o").exists()


def test_missing_local_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\./nope/gsm8k: input not found"):
        _run(tmp_path / "o", input="./nope/gsm8k")


def test_test_fraction_refused_when_the_source_has_both_splits(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        _small_file(tmp_path, 4).rename(src / f"{split}.jsonl")
    with pytest.raises(UserError, match="key 'test_fraction': the source already has splits train, test"):
        _run(tmp_path / "o", input=str(src), test_fraction=0.2)
