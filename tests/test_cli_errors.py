"""Bad input driven through the real CLI entry point (issue 2).

Every case runs ``alignctl ...`` in-process (``conftest.run_cli``) and checks the user-error
contract: exit status 2, exactly one non-empty stderr line naming the culprit (file / line / key)
and what was expected, no traceback -- and no partial output: the whole test folder is
snapshotted before the run and must be byte-for-byte the same afterwards (so the ``--out``
folder was not created, no hidden ``.NAME.tmp-*`` folder is left beside it, and an existing file
at the output path is untouched).

Layout per test: ``tmp_path/in`` holds the inputs, ``tmp_path/work`` is the (empty) working
directory and ``tmp_path/work/out`` the output folder. In case texts, ``$IN`` and ``$OUT`` stand
for those two paths.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import CliResult, assert_user_error, run_cli

GOOD_GSM8K = '{"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\\n#### 5"}\n'

# A user map_fn for `preprocess custom`: raw {"q", "a"} rows -> RL rows. An empty "q" yields a
# prompt message with empty content, which the schema refuses (the row, not the function, is bad).
MAP_PY = textwrap.dedent('''
    def to_rl(row):
        return {"data_source": "toy", "prompt": [{"role": "user", "content": row["q"]}],
                "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(row["a"])}}

    def listy(row):
        return [row]
''')
MAP_ROWS = '{"q": "1+1?", "a": 2}\n{"q": "", "a": 3}\n'


@dataclass
class Case:
    """One bad invocation: the input files it needs, its argv and what stderr must name."""

    id: str
    args: tuple[str, ...]
    needles: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    out: str = "$OUT"  # the output path that must not appear


def _sub(text: str, inp: Path, out: Path) -> str:
    return text.replace("$IN", str(inp)).replace("$OUT", str(out))


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: files map to their bytes, folders to None. ``__pycache__`` is
    left out: importing a user map_fn file legitimately writes bytecode next to it."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if "__pycache__" not in p.parts}


def _cli(*args: str) -> CliResult:
    """``run_cli`` that also survives an exception escaping ``main`` (a bug): it becomes what the
    console script would show, a traceback and exit status 1, so the assertions report it."""
    try:
        return run_cli(*args)
    except Exception:
        return CliResult(1, "", traceback.format_exc())


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--debug` elsewhere in the session sets ALIGNCTL_DEBUG in os.environ, which would turn every
    # UserError below into a traceback; relative defaults (data/processed, runs/) land in work/.
    monkeypatch.delenv("ALIGNCTL_DEBUG", raising=False)
    (tmp_path / "in").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")


def _check_case(tmp_path: Path, case: Case) -> None:
    inp, out = tmp_path / "in", tmp_path / "work" / "out"
    for name, content in case.files.items():
        path = inp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _snapshot(tmp_path)
    result = _cli(*(_sub(a, inp, out) for a in case.args))
    assert_user_error(result, *(_sub(n, inp, out) for n in case.needles))
    assert_no_partial_output(tmp_path, before, Path(_sub(case.out, inp, out)))


def assert_no_partial_output(root: Path, before: dict[str, bytes | None], out: Path) -> None:
    if str(out.relative_to(root)) not in before:
        assert not out.exists(), f"{out} was created by a failed run"
    if out.parent.is_dir():
        leftovers = sorted(p.name for p in out.parent.glob(f".{out.name}.*"))
        assert not leftovers, f"hidden temporary output left beside {out}: {leftovers}"
    after = _snapshot(root)
    gone = object()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, gone) != after.get(k, gone))
    assert not changed, f"a failed run added, removed or changed: {changed}"


# ------------------------------------------------------------------------- preprocess: input files

INPUT_CASES = [
    Case("missing_input_file", ("preprocess", "gsm8k", "--input", "$IN/nosuch.jsonl", "--out", "$OUT"),
         ("$IN/nosuch.jsonl", "input not found", "expected a local folder/file")),
    Case("missing_input_folder", ("preprocess", "math", "--input", "$IN/nosuch_dir", "--out", "$OUT"),
         ("$IN/nosuch_dir", "input not found", "expected a file or a folder")),
    Case("folder_without_split_files", ("preprocess", "gsm8k", "--input", "$IN", "--out", "$OUT"),
         ("$IN", "no input files found", "expected train.jsonl, test.jsonl"),
         files={"README.txt": "not data\n"}),
    Case("empty_file", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl", "empty file", "expected JSON lines"), files={"train.jsonl": "\n\n"}),
    Case("non_json_line", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl:3:", "invalid JSON", "expected one JSON object per line"),
         files={"train.jsonl": GOOD_GSM8K * 2 + '{"question": "q", "answer": \n'}),
    Case("line_not_an_object", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl:2:", "expected a JSON object per line, got list"),
         files={"train.jsonl": GOOD_GSM8K + "[1, 2]\n"}),
    Case("gsm8k_missing_answer", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl:1:", "missing field 'answer'", "expected a string"),
         files={"train.jsonl": '{"question": "How many?"}\n' + GOOD_GSM8K}),
    Case("gsm8k_wrong_field_type", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl:2:", "field 'question' expected a string, got int 5"),
         files={"train.jsonl": GOOD_GSM8K + '{"question": 5, "answer": "#### 5"}\n'}),
    Case("gsm8k_answer_without_final_line", ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/train.jsonl:1:", "field 'answer' expected a final line '#### <number>'"),
         files={"train.jsonl": '{"question": "How many?", "answer": "five"}\n'}),
    Case("hh_rlhf_row_without_rejected", ("preprocess", "hh-rlhf", "--input", "$IN/pairs.jsonl", "--out", "$OUT"),
         ("$IN/pairs.jsonl:1:", "missing field 'rejected'", "expected a string"),
         files={"pairs.jsonl": json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: hello"}) + "\n"}),
    Case("hh_rlhf_corrupt_gzip", ("preprocess", "hh-rlhf", "--input", "$IN/test.jsonl.gz", "--out", "$OUT"),
         ("$IN/test.jsonl.gz", "cannot read file", "Not a gzipped file"),
         files={"test.jsonl.gz": b"plain text, not gzip\n"}),
    Case("math_row_without_boxed", ("preprocess", "math", "--input", "$IN/math.jsonl", "--out", "$OUT"),
         ("$IN/math.jsonl:2:", "field 'solution' expected a final answer in \\boxed{...}"),
         files={"math.jsonl": json.dumps({"problem": "1+1?", "solution": "So $\\boxed{2}$."}) + "\n"
                + json.dumps({"problem": "2+2?", "solution": "It is 4."}) + "\n"}),
    Case("math_unbalanced_boxed", ("preprocess", "math", "--input", "$IN/math.jsonl", "--out", "$OUT"),
         ("$IN/math.jsonl:1:", "field 'solution'", "unbalanced braces"),
         files={"math.jsonl": json.dumps({"problem": "Half?", "solution": "$\\boxed{\\frac{1}{2}$"}) + "\n"}),
    # With --skip-bad-rows, train.parquet is already written into the temporary folder when the
    # test split turns out empty: the temporary folder must still vanish.
    Case("skip_bad_rows_leaves_a_split_empty",
         ("preprocess", "gsm8k", "--input", "$IN", "--out", "$OUT", "--skip-bad-rows"),
         ("no rows left for test.parquet", "'invalid_json': 1"),
         files={"train.jsonl": GOOD_GSM8K, "test.jsonl": "{broken\n"}),
]


@pytest.mark.parametrize("case", INPUT_CASES, ids=lambda c: c.id)
def test_bad_input_file(tmp_path: Path, case: Case) -> None:
    _check_case(tmp_path, case)


# ------------------------------------------------------------------------- preprocess: custom map_fn

CUSTOM_CASES = [
    Case("map_fn_file_missing",
         ("preprocess", "custom", "--input", "$IN/rows.jsonl", "--map-fn", "$IN/nosuch.py:to_rl", "--out", "$OUT"),
         ("key 'map_fn'", "$IN/nosuch.py", "not found"), files={"rows.jsonl": MAP_ROWS}),
    Case("map_fn_function_missing",
         ("preprocess", "custom", "--input", "$IN/rows.jsonl", "--map-fn", "$IN/map.py:nofn", "--out", "$OUT"),
         ("key 'map_fn'", "$IN/map.py", "has no function 'nofn'"), files={"rows.jsonl": MAP_ROWS, "map.py": MAP_PY}),
    Case("map_fn_row_violates_schema",
         ("preprocess", "custom", "--input", "$IN/rows.jsonl", "--map-fn", "$IN/map.py:to_rl", "--out", "$OUT"),
         ("$IN/rows.jsonl:2:", "invalid rl row", "field 'prompt[0].content' expected a non-empty string"),
         files={"rows.jsonl": MAP_ROWS, "map.py": MAP_PY}),
    Case("map_fn_returns_a_list",
         ("preprocess", "custom", "--input", "$IN/rows.jsonl", "--map-fn", "$IN/map.py:listy", "--out", "$OUT"),
         ("$IN/rows.jsonl:1:", "map_fn returned list", "expected a dict row or None"),
         files={"rows.jsonl": MAP_ROWS, "map.py": MAP_PY}),
]


@pytest.mark.parametrize("case", CUSTOM_CASES, ids=lambda c: c.id)
def test_bad_custom_map_fn(tmp_path: Path, case: Case) -> None:
    _check_case(tmp_path, case)


# ------------------------------------------------------------------------- preprocess: config and output

CONFIG_CASES = [
    Case("unknown_dataset", ("preprocess", "nosuch", "--out", "$OUT"),
         ("'dataset'", "expected one of gsm8k, math, hh-rlhf, arith, tools-arith, custom", "'nosuch'")),
    Case("config_file_key_typo",
         ("preprocess", "gsm8k", "--config", "$IN/cfg.yaml", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         ("$IN/cfg.yaml", "unknown config key 'sed'", "did you mean 'seed'?"),
         files={"cfg.yaml": "seed: 3\nsed: 4\n", "train.jsonl": GOOD_GSM8K}),
    Case("dotted_override_typo", ("preprocess", "arith", "arith.num_trian=3", "--out", "$OUT"),
         ("command-line override", "unknown config key 'arith.num_trian'", "did you mean 'arith.num_train'?")),
    Case("override_wrong_type", ("preprocess", "arith", "seed=abc", "--out", "$OUT"),
         ("command-line override", "key 'seed' expected int", "got 'abc'")),
    Case("config_file_invalid_yaml",
         ("preprocess", "gsm8k", "--config", "$IN/cfg.yaml", "--input", "$IN/train.jsonl", "--out", "$OUT"),
         # The unclosed flow list opened on line 2 is only detected at the end of the stream, line 3.
         ("$IN/cfg.yaml", "line 3, column 1", "invalid YAML", "expected ',' or ']'"),
         files={"cfg.yaml": "seed: 1\nmax_rows: [1, 2\n", "train.jsonl": GOOD_GSM8K}),
    Case("test_fraction_out_of_range",
         ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--test-fraction", "1.5", "--out", "$OUT"),
         ("'test_fraction'", "expected a number in [0, 1)", "1.5"), files={"train.jsonl": GOOD_GSM8K}),
    # Tests run as root, where a chmod'ed folder is still writable: a FILE as the parent of the
    # output path is the unwritable location that holds for every user.
    Case("output_parent_is_a_file",
         ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$IN/afile/out"),
         ("$IN/afile/out", "cannot create output folder", "$IN/afile is a file, not a folder"),
         files={"train.jsonl": GOOD_GSM8K, "afile": "keep me\n"}, out="$IN/afile/out"),
    Case("output_path_is_a_file",
         ("preprocess", "gsm8k", "--input", "$IN/train.jsonl", "--out", "$IN/afile"),
         ("$IN/afile", "output path exists and is a file, expected a folder"),
         files={"train.jsonl": GOOD_GSM8K, "afile": "keep me\n"}, out="$IN/afile"),
    Case("config_show_wrong_type_in_file", ("config", "show", "--config", "$IN/cfg.yaml"),
         ("$IN/cfg.yaml", "key 'arith.max_value' expected int", "got 'big'"),
         files={"cfg.yaml": "stage: preprocess\narith:\n  max_value: big\n"}),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=lambda c: c.id)
def test_bad_config_or_output(tmp_path: Path, case: Case) -> None:
    _check_case(tmp_path, case)


# ------------------------------------------------------------------------- init-model

INIT_MODEL_CASES = [
    Case("tokenizer_data_missing", ("init-model", "--out", "$OUT", "--tokenizer-from", "$IN/nosuch.jsonl"),
         ("tokenizer data path '$IN/nosuch.jsonl' does not exist", "expected a parquet/jsonl file or folder")),
    Case("unknown_tokenizer_kind",
         ("init-model", "--out", "$OUT", "--tokenizer-from", "$IN/train.jsonl", "--tokenizer", "wordpiece"),
         ("--tokenizer expected bpe or char", "'wordpiece'"), files={"train.jsonl": GOOD_GSM8K}),
    Case("output_exists_without_overwrite",
         ("init-model", "--out", "$IN/model", "--tokenizer-from", "$IN/train.jsonl", "--vocab-size", "300",
          "--hidden", "32", "--layers", "1"),
         ("$IN/model", "not written by alignctl"),
         files={"train.jsonl": GOOD_GSM8K, "model/config.json": "{}\n"}, out="$IN/model"),
    Case("output_parent_is_a_file",
         ("init-model", "--out", "$IN/afile/model", "--tokenizer-from", "$IN/train.jsonl", "--vocab-size", "300",
          "--hidden", "32", "--layers", "1"),
         ("$IN/afile",), files={"train.jsonl": GOOD_GSM8K, "afile": "keep me\n"}, out="$IN/afile/model"),
]


@pytest.mark.parametrize("case", INIT_MODEL_CASES, ids=lambda c: c.id)
def test_bad_init_model(tmp_path: Path, case: Case) -> None:
    _check_case(tmp_path, case)


# ------------------------------------------------------------------------- RL (fails in config validation)

_RL_BASE = "data:\n  train_files: [prompts.parquet]\n  train_batch_size: 8\n"
_RL_MODEL = "actor_rollout_ref:\n  model:\n    path: some/model\n"

RL_CASES = [
    Case("model_path_missing", ("grpo", "--config", "$IN/rl.yaml"),
         ("key 'actor_rollout_ref.model.path' is required", "an HF model folder"),
         files={"rl.yaml": _RL_BASE + "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 4\n"}),
    Case("mini_batch_does_not_divide_batch", ("grpo", "--config", "$IN/rl.yaml"),
         ("key 'actor_rollout_ref.actor.ppo_mini_batch_size' (3)", "must divide data.train_batch_size (8)"),
         files={"rl.yaml": _RL_BASE + _RL_MODEL + "  actor:\n    ppo_mini_batch_size: 3\n"}),
    Case("unknown_key_with_suggestion", ("grpo", "--config", "$IN/rl.yaml"),
         ("$IN/rl.yaml", "unknown config key 'actor_rollout_ref.actor.ppo_mini_batchsize'",
          "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?"),
         files={"rl.yaml": _RL_BASE + _RL_MODEL + "  actor:\n    ppo_mini_batchsize: 4\n"}),
    Case("grpo_needs_several_responses", ("grpo", "--config", "$IN/rl.yaml", "actor_rollout_ref.rollout.n=1"),
         ("algorithm.adv_estimator=grpo", "set actor_rollout_ref.rollout.n >= 2 (got 1)"),
         files={"rl.yaml": _RL_BASE + _RL_MODEL + "  actor:\n    ppo_mini_batch_size: 4\n"}),
]


@pytest.mark.parametrize("case", RL_CASES, ids=lambda c: c.id)
def test_bad_rl_config(tmp_path: Path, case: Case) -> None:
    # No run folder either: the default trainer.default_local_dir is runs/ under the cwd (work/).
    _check_case(tmp_path, case)


def test_three_config_mistakes_get_three_lines_most_important_first(tmp_path: Path) -> None:
    """Every mistake in one pass: the missing required key, then the typo, then the list written as a
    word (with how to write a list), one ``error:`` line each, exit 2, no traceback, nothing written."""
    config = tmp_path / "rl.yaml"
    config.write_text("data:\n  train_files: prompts.parquet\nactor_rollout_ref:\n  rollout:\n    tempreature: 0.7\n")
    result = run_cli("grpo", "--config", str(config), "trainer.logger=console")
    assert result.code == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 4, result.stderr
    assert all(line.startswith("error: ") for line in lines)
    assert "key 'actor_rollout_ref.model.path' is required" in lines[0]
    assert "unknown config key 'actor_rollout_ref.rollout.tempreature'; did you mean 'actor_rollout_ref.rollout.temperature'?" in lines[1]
    assert "key 'data.train_files' expected list[str], got 'prompts.parquet'" in lines[2]
    assert "key 'trainer.logger' expected list[str], got 'console'" in lines[3]
    assert "write a list as key=[a, b] on the command line or key: [a, b] in YAML" in lines[3]
    assert not (tmp_path / "runs").exists() and not Path("runs/run").exists()


def test_a_section_written_as_a_value_names_the_section_syntax(tmp_path: Path) -> None:
    result = run_cli("grpo", "actor_rollout_ref.model.path=m", "data.train_files=[p.parquet]", "trainer=5")
    assert_user_error(result, "key 'trainer' expected a section", "key.sub=value", "key: {sub: value}")


def test_config_show_prints_defaults_without_the_required_paths() -> None:
    """`config show --stage grpo` works with no file: required keys shown as <required> and named;
    the grpo defaults are GRPO's own (a group of responses per prompt)."""
    import yaml

    result = run_cli("config", "show", "--stage", "grpo")
    assert result.code == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert first == "# required (shown as <required>): actor_rollout_ref.model.path, data.train_files"
    shown = yaml.safe_load("\n".join(rest))
    assert shown["actor_rollout_ref"]["model"]["path"] == "<required>"
    assert shown["data"]["train_files"] == ["<required>"]
    assert shown["algorithm"]["adv_estimator"] == "grpo" and shown["actor_rollout_ref"]["rollout"]["n"] >= 2


# ------------------------------------------------------------------------- argument parsing

def test_flag_of_wrong_type_is_one_line(tmp_path: Path) -> None:
    _check_case(tmp_path, Case("flag_wrong_type", ("preprocess", "arith", "--seed", "abc", "--out", "$OUT"),
                               ("--seed", "valid integer", "alignctl preprocess --help")))


def test_missing_argument_and_unknown_command_are_one_line(tmp_path: Path) -> None:
    _check_case(tmp_path, Case("missing_argument", ("preprocess",), ("Missing argument", "dataset")))
    _check_case(tmp_path, Case("unknown_command", ("nosuch",), ("No such command", "nosuch")))


# ------------------------------------------------------------------------- --skip-bad-rows and --debug

def test_skip_bad_rows_turns_the_failure_into_a_counted_success(tmp_path: Path) -> None:
    src = tmp_path / "in" / "train.jsonl"
    src.write_text(GOOD_GSM8K + "{not json\n" + GOOD_GSM8K.replace("2 apples", "4 apples"))
    out = tmp_path / "work" / "out"

    failed = run_cli("preprocess", "gsm8k", "--input", str(src), "--out", str(out))
    assert_user_error(failed, f"{src}:2:", "invalid JSON")
    assert not out.exists()

    result = run_cli("preprocess", "gsm8k", "--input", str(src), "--out", str(out), "--skip-bad-rows")
    assert result.code == 0, result.stderr
    assert pq.read_table(out / "train.parquet").num_rows == 2  # 3 lines - 1 skipped
    assert json.loads((out / "meta.json").read_text())["skipped"] == {"invalid_json": 1}
    table_row = [line for line in result.stdout.splitlines() if "invalid_json" in line]
    assert len(table_row) == 1 and re.search(r"invalid_json\W+1\W*$", table_row[0]), result.stdout
    assert f"{src}:2:" in result.stdout.replace("\n", "")  # the example names file and line
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no temporary folder left


def test_debug_shows_the_traceback_of_a_user_error(tmp_path: Path) -> None:
    """A real process (``python -m alignctl``): the exit status is the interpreter's, not emulated."""
    missing, out = tmp_path / "in" / "nosuch.jsonl", tmp_path / "work" / "out"
    argv = [sys.executable, "-m", "alignctl", "preprocess", "gsm8k", "--input", str(missing), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "ALIGNCTL_DEBUG"}

    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert_user_error(CliResult(plain.returncode, plain.stdout, plain.stderr), str(missing), "input not found")

    debug = subprocess.run(argv[:3] + ["--debug"] + argv[3:], capture_output=True, text=True, env=env, timeout=120)
    assert debug.returncode not in (0, 2), debug.returncode  # an uncaught exception: status 1
    assert debug.stderr.startswith("Traceback (most recent call last):"), debug.stderr
    last = debug.stderr.strip().splitlines()[-1]
    assert last.startswith("alignctl.errors.UserError: ") and str(missing) in last, last
    assert not out.exists()
