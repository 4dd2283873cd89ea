"""Input readers: every format, and errors that name the file and line (or skip and count)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from alignctl.data.readers import BadRows, read_records, split_files
from alignctl.errors import UserError

FIELDS = {"question": str, "answer": str}

# Lines 1 and 6 are good; the others each break one rule (line 3 is blank and carries no row).
MIXED = "\n".join([
    json.dumps({"question": "q1", "answer": "a1"}),
    "{not json",
    "",
    "[1, 2]",
    json.dumps({"question": "q4"}),
    json.dumps({"question": "q5", "answer": "a5"}),
    json.dumps({"question": "q6", "answer": 6}),
]) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_jsonl_gz_parquet_and_csv_alike(tmp_path: Path) -> None:
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "And 2, 3?", "answer": "5"}]
    jsonl = _write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl.read_bytes()))
    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    csv = _write(tmp_path / "a.csv", 'question,answer\nWhat is 1 + 1?,2\n"And 2, 3?",5\n')
    for path, wheres in [(jsonl, ["a.jsonl:1", "a.jsonl:2"]), (gz, ["a.jsonl.gz:1", "a.jsonl.gz:2"]),
                         (parquet, ["a.parquet:row 1", "a.parquet:row 2"]), (csv, ["a.csv:2", "a.csv:3"])]:
        records = list(read_records(path, BadRows(), FIELDS))
        assert [r.data for r in records] == rows, path
        assert [r.where for r in records] == [f"{tmp_path}/{w}" for w in wheres]


def test_first_bad_line_raises_with_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "in.jsonl", MIXED)
    records = read_records(path, BadRows(), FIELDS)
    assert next(records).data["question"] == "q1"
    with pytest.raises(UserError) as info:
        next(records)
    assert str(info.value).startswith(f"{path}:2: expected one JSON object per line, got invalid JSON")


@pytest.mark.parametrize(("text", "line", "expected"), [
    ('{"question": "q"}\n', 1, "missing field 'answer' (expected a string)"),
    ('{"question": "q", "answer": 6}\n', 1, "field 'answer' expected a string, got int 6"),
    ('\n{"question": null, "answer": "a"}\n', 2, "field 'question' expected a string, got null"),
    ('"just a string"\n', 1, "expected a JSON object per line, got str"),
])
def test_each_bad_row_kind_names_line_and_expectation(tmp_path: Path, text: str, line: int,
                                                      expected: str) -> None:
    path = _write(tmp_path / "in.jsonl", text)
    with pytest.raises(UserError) as info:
        list(read_records(path, BadRows(), FIELDS))
    assert str(info.value) == f"{path}:{line}: {expected}"


def test_skip_bad_rows_counts_reasons_and_keeps_examples(tmp_path: Path) -> None:
    path = _write(tmp_path / "in.jsonl", MIXED)
    bad = BadRows(skip=True, max_examples=2)
    records = list(read_records(path, bad, FIELDS))
    assert [r.where for r in records] == [f"{path}:1", f"{path}:6"]
    assert dict(bad.counts) == {"invalid_json": 1, "not_object": 1, "missing_field:answer": 1,
                                "wrong_type:answer": 1}
    assert bad.examples == [f"{path}:2: expected one JSON object per line, got invalid JSON "
                            f"(Expecting property name enclosed in double quotes)",
                            f"{path}:4: expected a JSON object per line, got list"]


def test_optional_fields_are_typed_when_present(tmp_path: Path) -> None:
    path = _write(tmp_path / "in.jsonl", '{"question": "q", "answer": "a", "level": 3}\n')
    with pytest.raises(UserError, match=r"in.jsonl:1: field 'level' expected a string, got int 3"):
        list(read_records(path, BadRows(), FIELDS, {"level": str}))
    path = _write(tmp_path / "ok.jsonl", '{"question": "q", "answer": "a", "level": null}\n')
    assert len(list(read_records(path, BadRows(), FIELDS, {"level": str}))) == 1


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("missing.jsonl", None, "input file not found"),
    ("empty.jsonl", "\n\n", "empty file, expected JSON lines"),
    ("empty.csv", "", "empty file, expected a CSV header"),
    ("header.csv", "question,answer\n", "empty file, expected CSV rows"),
    ("data.txt", "x", "unknown input format, expected jsonl, jsonl.gz, parquet or csv"),
    ("broken.jsonl.gz", "not gzip", "cannot read file"),
])
def test_file_level_problems_always_raise(tmp_path: Path, name: str, content: str | None,
                                          expected: str) -> None:
    path = tmp_path / name
    if content is not None:
        _write(path, content)
    with pytest.raises(UserError) as info:
        list(read_records(path, BadRows(skip=True), FIELDS))
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


def test_split_files_file_folder_and_errors(tmp_path: Path) -> None:
    single = _write(tmp_path / "x.jsonl", "{}\n")
    assert split_files(single) == {"train": single}
    folder = tmp_path / "ds"
    folder.mkdir()
    with pytest.raises(UserError, match="no input files found, expected train.jsonl, test.jsonl"):
        split_files(folder)
    test = _write(folder / "test.jsonl", "{}\n")
    assert split_files(folder) == {"test": test}
    train = _write(folder / "train.csv", "a\n1\n")
    assert split_files(folder) == {"train": train, "test": test}
    _write(folder / "train.jsonl", "{}\n")
    with pytest.raises(UserError, match=r"ambiguous input for split 'train' \(train.jsonl, train.csv\)"):
        split_files(folder)
    with pytest.raises(UserError, match="input not found"):
        split_files(tmp_path / "nope")
