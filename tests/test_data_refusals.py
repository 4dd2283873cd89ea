"""Refusals driven through the real CLI (issue 20): bad ``init-model`` sizes, data that would train
on nothing (an empty problem or question, preference pairs whose chosen == rejected, empty pairs),
and OS errors while writing (disk full, read-only, no permission).

User mistakes follow the contract of ``test_cli_errors``: exit status 2, one stderr line naming the
culprit (flag, file and row) and what was expected, no traceback, and the test folder byte-for-byte
the same afterwards. A full disk is the machine's state, not the user's input: exit status 1, one
line naming the path and "disk full (ENOSPC)", and no temporary folder left on that disk.

The OS-error cases write onto real small file systems (``mount -t tmpfs``; we run as root in the
test container). Where mounting is not permitted they are skipped, saying why. EACCES needs a
process without root's permission override: the case switches the effective user to ``nobody``
for the duration of the command (``os.seteuid``) and back.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from alignctl.errors import UserError, find_os_failure
from conftest import CliResult, assert_user_error, run_cli

NOBODY = 65534


# ------------------------------------------------------------------------------ helpers


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--debug` elsewhere in the session sets ALIGNCTL_DEBUG, which turns errors into tracebacks.
    monkeypatch.delenv("ALIGNCTL_DEBUG", raising=False)


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: files map to their bytes, folders to None (bytecode left out:
    importing a user map_fn legitimately writes it)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if "__pycache__" not in p.parts}


def _refused(root: Path, *args: str) -> CliResult:
    """Run the CLI and check that it changed nothing under ``root``."""
    before = _snapshot(root)
    result = run_cli(*args)
    assert _snapshot(root) == before, "a refused command added, removed or changed files"
    return result


def _one_line(result: CliResult, code: int, *needles: str) -> str:
    assert result.code == code, (result.code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _msgs(role: str, content: str) -> list[dict[str, str]]:
    return [{"role": role, "content": content}]


def _pref(prompt: str, chosen: str, rejected: str) -> dict:
    return {"data_source": "toy", "prompt": _msgs("user", prompt), "chosen": _msgs("assistant", chosen),
            "rejected": _msgs("assistant", rejected)}


# ------------------------------------------------------------------------------ init-model

QA = [{"question": f"What is {i}+{i}?", "answer": f"{i}+{i} = {2 * i}\n#### {2 * i}"} for i in range(10)]

BAD_SIZES = [
    (("--hidden", "0"), ("--hidden", "hidden=0", "expected a positive integer")),
    (("--hidden", "-8"), ("--hidden", "hidden=-8", "expected a positive integer")),
    (("--layers", "0"), ("--layers", "layers=0", "expected a positive integer")),
    (("--layers", "-1"), ("--layers", "layers=-1", "expected a positive integer")),
    (("--max-positions", "0"), ("--max-positions", "max_position_embeddings=0", "expected a positive integer")),
    (("--heads", "0"), ("--heads", "heads=0", "expected a positive integer")),
    (("--heads", "-2"), ("--heads", "heads=-2", "expected a positive integer")),
    (("--hidden", "64", "--heads", "3"), ("--hidden/--heads", "hidden=64, heads=3", "multiple of heads")),
    (("--hidden", "30", "--heads", "2"), ("hidden=30, heads=2", "expected an even head size")),
    (("--intermediate", "0"), ("--intermediate", "intermediate=0", "expected a positive integer")),
    (("--vocab-size", "100"), ("--vocab-size", "vocab_size=100", "expected >= 263")),
    (("--vocab-size", "-5"), ("--vocab-size", "vocab_size=-5", "expected a positive integer")),
    (("--arch", "gpt9"), ("--arch", "'gpt9'", "expected one of llama, qwen2")),
]


@pytest.mark.parametrize(("flags", "needles"), BAD_SIZES, ids=[" ".join(f) for f, _ in BAD_SIZES])
def test_init_model_refuses_bad_sizes_before_reading_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], needles: tuple[str, ...]) -> None:
    data = _jsonl(tmp_path / "in" / "qa.jsonl", QA)

    def no_reading(paths: object) -> None:
        raise AssertionError("init-model read the tokenizer data before checking the sizes")

    monkeypatch.setattr("alignctl.models.tiny.iter_texts", no_reading)
    result = _refused(tmp_path, "init-model", "--out", str(tmp_path / "m"), "--tokenizer-from", str(data), *flags)
    assert_user_error(result, "init-model", *needles)
    assert not (tmp_path / "m").exists()


def test_init_model_kv_heads_must_divide_heads(tmp_path: Path) -> None:
    """kv_heads has no CLI flag (Python API and pipeline only): the key is named instead."""
    from alignctl.models.tiny import init_model

    data = _jsonl(tmp_path / "qa.jsonl", QA)
    for kv_heads, needle in ((3, "heads=4, kv_heads=3"), (0, "kv_heads=0")):
        with pytest.raises(UserError, match=needle):
            init_model(out=tmp_path / "m", tokenizer_from=data, hidden=64, heads=4, kv_heads=kv_heads)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.jsonl"]


# ------------------------------------------------------------------------------ empty problems

GOOD_MATH = {"problem": "What is 1+1?", "solution": "So $1+1=\\boxed{2}$."}
GOOD_GSM8K = {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}

EMPTY_TEXT_CASES = [
    ("math", [GOOD_MATH, {"problem": "", "solution": "\\boxed{3}"}], "math.jsonl:2:", "field 'problem'"),
    ("math", [GOOD_MATH, {"problem": " \n\t ", "solution": "\\boxed{3}"}], "math.jsonl:2:", "field 'problem'"),
    ("math", [{"problem": "2+2?", "solution": "  "}, GOOD_MATH], "math.jsonl:1:", "field 'solution'"),
    ("gsm8k", [GOOD_GSM8K, {"question": "   ", "answer": "#### 4"}], "gsm8k.jsonl:2:", "field 'question'"),
    ("gsm8k", [{"question": "How many?", "answer": ""}, GOOD_GSM8K], "gsm8k.jsonl:1:", "field 'answer'"),
]


@pytest.mark.parametrize(("dataset", "rows", "where", "field"), EMPTY_TEXT_CASES,
                         ids=[f"{c[0]}-{c[3].split()[1]}-{i}" for i, c in enumerate(EMPTY_TEXT_CASES)])
def test_empty_problem_is_a_bad_row(tmp_path: Path, dataset: str, rows: list[dict], where: str, field: str) -> None:
    source = _jsonl(tmp_path / "in" / f"{dataset}.jsonl", rows)
    out = tmp_path / "out"
    result = _refused(tmp_path, "preprocess", dataset, "--input", str(source), "--out", str(out))
    assert_user_error(result, f"{tmp_path}/in/{where}", field, "expected a non-empty string")
    # Like every bad row: --skip-bad-rows skips it and counts it by reason.
    result = run_cli("preprocess", dataset, "--input", str(source), "--out", str(out), "--skip-bad-rows")
    assert result.code == 0, result.stderr
    assert pd.read_parquet(out / "train.parquet").shape[0] == 1
    reason = f"empty_field:{field.split()[1].strip(chr(39))}"
    assert json.loads((out / "meta.json").read_text())["skipped"] == {reason: 1}


# ------------------------------------------------------------------------------ identical pairs


def _hh(prompt: str, chosen: str, rejected: str) -> dict:
    return {"chosen": f"\n\nHuman: {prompt}\n\nAssistant: {chosen}",
            "rejected": f"\n\nHuman: {prompt}\n\nAssistant: {rejected}"}


def _hh_rows(good: int, identical: int) -> list[dict]:
    rows = [_hh(f"Question {i}?", f"Helpful answer {i}.", f"Rude answer {i}.") for i in range(good)]
    # whitespace around the reply does not make a pair different
    return rows + [_hh(f"Same {i}?", f"Same reply {i}.", f"  Same reply {i}.  ") for i in range(identical)]


def test_hh_drops_a_small_minority_of_identical_pairs_and_counts_them(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "hh.jsonl", _hh_rows(good=40, identical=2))  # 2 of 42: under 5%
    result = run_cli("preprocess", "hh-rlhf", "--input", str(source), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.stderr
    assert "identical_replies" in result.stdout  # the report's "dropped by design" table
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["dropped"] == {"identical_replies": 2} and meta["files"] == {"train.parquet": 40, "rl_train.parquet": 40}


def test_hh_with_many_identical_pairs_is_refused(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "in" / "hh.jsonl", _hh_rows(good=10, identical=5))
    result = _refused(tmp_path, "preprocess", "hh-rlhf", "--input", str(source), "--out", str(tmp_path / "out"))
    assert_user_error(result, f"{source}:11:", "same final reply", "5 of 15 pairs", "--skip-bad-rows")
    result = run_cli("preprocess", "hh-rlhf", "--input", str(source), "--out", str(tmp_path / "out"), "--skip-bad-rows")
    assert result.code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["skipped"] == {"identical_pair": 5}


def test_hh_made_only_of_identical_pairs_is_refused(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "in" / "hh.jsonl", _hh_rows(good=0, identical=3))
    result = _refused(tmp_path, "preprocess", "hh-rlhf", "--input", str(source), "--out", str(tmp_path / "out"))
    assert_user_error(result, f"{source}:1:", "same final reply", "3 of 3 pairs")


def test_real_hh_file_has_no_identical_pairs(shared_data: Path, tmp_path: Path) -> None:
    """Measured: the shared HH harmless test split (2312 pairs) has 0 pairs with the same final
    reply, so the default run drops none for that reason."""
    source = shared_data / "hh-rlhf-harmless" / "test.jsonl.gz"
    result = run_cli("preprocess", "hh-rlhf", "--input", str(source), "--out", str(tmp_path / "out"))
    assert result.code == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert "identical_replies" not in meta["dropped"] and meta["skipped"] == {}


MAP_PY = '''
def pref(row):
    return {"data_source": "toy", "prompt": [{"role": "user", "content": row["q"]}],
            "chosen": [{"role": "assistant", "content": row["a"]}],
            "rejected": [{"role": "assistant", "content": row["b"]}]}
'''


def test_custom_map_fn_producing_identical_pairs_is_a_bad_row(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "map.py").write_text(MAP_PY)
    source = _jsonl(tmp_path / "in" / "pairs.jsonl", [{"q": "hi", "a": "hello", "b": "go away"},
                                                      {"q": "hey", "a": "same ", "b": "\nsame"}])
    args = ("preprocess", "custom", "--input", str(source), "--map-fn", f"{tmp_path}/in/map.py:pref",
            "--kind", "preference", "--out", str(tmp_path / "out"))
    result = _refused(tmp_path, *args)
    assert_user_error(result, f"{source}:2:", "field 'rejected'", "different from 'chosen'")
    result = run_cli(*args, "--skip-bad-rows")
    assert result.code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["skipped"] == {"identical_pair": 1}


def test_schema_refuses_identical_pairs_for_every_producer() -> None:
    from alignctl.data.schema import SchemaError, check_row, identical_pair

    row = {**_pref("q", " same", "same\n"), "extra_info": {"split": "train", "index": 0}}
    with pytest.raises(SchemaError, match="'rejected' expected a reply different from 'chosen'") as info:
        check_row("preference", row)
    assert info.value.reason == "identical_pair"
    check_row("preference", {**row, "rejected": _msgs("assistant", "other")})
    # strings, one message, a list ending in the compared turn
    assert identical_pair("a ", _msgs("assistant", "a")) and identical_pair({"role": "assistant", "content": "a"}, "a")
    assert not identical_pair(_msgs("assistant", "a"), _msgs("assistant", "b"))


def test_arith_preference_pairs_always_differ(tmp_path: Path) -> None:
    """arith writes preference files too; the schema check (run on every emitted row) passes."""
    result = run_cli("preprocess", "arith", "--out", str(tmp_path / "a"), "arith.num_pref=64", "arith.num_sft=0",
                     "arith.num_train=4", "arith.num_test=16")
    assert result.code == 0, result.stderr
    rows = pd.read_parquet(tmp_path / "a" / "pref_train.parquet")
    assert len(rows) == 64 and all(c[0]["content"] != r[0]["content"] for c, r in zip(rows.chosen, rows.rejected))


# ------------------------------------------------------------------------------ train-rm


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from alignctl.models.tiny import init_model

    root = tmp_path_factory.mktemp("rm-model")
    data = _jsonl(root / "text.jsonl", [{"question": "Say hi. Be kind or rude.", "answer": "Hello there! Go away."}])
    init_model(out=root / "m", tokenizer_from=data, tokenizer_kind="char", hidden=16, layers=1, heads=1, seed=0)
    return root / "m"


def _rm_args(model: Path, train: Path, out: Path, *more: str) -> tuple[str, ...]:
    return ("train-rm", f"model.path={model}", f"data.train_files=[{train}]", f"output_dir={out}",
            "data.val_fraction=0", "trainer.micro_batch_size=2", "data.max_length=64", *more)


GOOD_PAIRS = [_pref(f"Say hi {i}", "Hello there!", "Go away.") for i in range(4)]

RM_BAD_DATA = [
    ("all_identical", [_pref("Say hi", "Hello", "Hello "), _pref("Hi", "Go", "Go")],
     ("row 0", "same final reply in all 2 pairs", "expected pairs with two different replies")),
    ("empty_prompt", [GOOD_PAIRS[0], _pref("   ", "Hello", "Go away")], ("row 1 'prompt'", "empty prompt")),
    ("empty_chosen", [GOOD_PAIRS[0], GOOD_PAIRS[1], _pref("Hi", " ", "Go away")], ("row 2 'chosen'", "empty")),
    ("empty_rejected_string", [{"prompt": "Hi", "chosen": "Hello", "rejected": ""}], ("row 0 'rejected'", "empty")),
]


@pytest.mark.parametrize(("rows", "needles"), [c[1:] for c in RM_BAD_DATA], ids=[c[0] for c in RM_BAD_DATA])
def test_train_rm_refuses_pairs_that_teach_nothing(tiny_model: Path, tmp_path: Path, rows: list[dict],
                                                   needles: tuple[str, ...]) -> None:
    train = tmp_path / "pairs.parquet"
    pd.DataFrame(rows).to_parquet(train)
    result = _refused(tmp_path, *_rm_args(tiny_model, train, tmp_path / "rm"))
    assert_user_error(result, str(train), *needles)


def test_train_rm_refuses_an_empty_preference_file(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "pairs.parquet"
    pd.DataFrame(GOOD_PAIRS).head(0).to_parquet(train)
    result = _refused(tmp_path, *_rm_args(tiny_model, train, tmp_path / "rm"))
    assert_user_error(result, str(train), "no rows")


def test_train_rm_drops_some_identical_pairs_with_a_warning(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "pairs.parquet"
    pd.DataFrame([*GOOD_PAIRS, _pref("Hi", "Same.", " Same.")]).to_parquet(train)
    result = run_cli(*_rm_args(tiny_model, train, tmp_path / "rm"))
    assert result.code == 0, result.stderr
    assert f"warning: {train}: dropped 1 of 5 pairs whose chosen and rejected final replies are identical " \
           f"(first: row 4)" in result.stderr
    manifest = json.loads((tmp_path / "rm" / "manifest.json").read_text())
    assert manifest["metrics"]["train/pairs"] == 4


# ------------------------------------------------------------------------------ OS errors on writes


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and `mount` to create a small tmpfs (a real full / read-only disk)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")


@contextlib.contextmanager
def small_disk(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (remounted read-only if asked), unmounted afterwards."""
    _mount_tmpfs(path, size)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _leftovers(disk: Path) -> list[str]:
    """Temporary and partial folders anywhere on ``disk``."""
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*")
                  if ".tmp-" in p.name or p.name.startswith(".partial-") or p.name.endswith(".staging"))


def _gsm8k_rows(n: int) -> list[dict]:
    """Rows whose text does not compress (random letters), so the parquet outgrows a small disk."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(4000)]
    return [{"question": " ".join(rng.choices(words, k=20)) + "?", "answer": f"so {i}\n#### {i}"} for i in range(n)]


def test_preprocess_onto_a_full_disk_is_one_line_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "train.jsonl", _gsm8k_rows(3000))
    with small_disk(tmp_path / "disk", "64k") as disk:
        result = run_cli("preprocess", "gsm8k", "--input", str(source), "--out", str(disk / "out"))
        _one_line(result, 1, f"{disk}/out", "disk full (ENOSPC)")
        assert _leftovers(disk) == [] and not (disk / "out").exists()


def test_init_model_onto_a_full_disk_is_one_line_and_leaves_no_temporary_folder(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "qa.jsonl", QA)
    with small_disk(tmp_path / "disk", "64k") as disk:  # the weights alone are ~400 KB
        result = run_cli("init-model", "--out", str(disk / "m"), "--tokenizer-from", str(data),
                         "--tokenizer", "char", "--hidden", "64", "--layers", "2")
        _one_line(result, 1, f"{disk}/m", "disk full (ENOSPC)")
        assert _leftovers(disk) == [] and not (disk / "m").exists()


def test_train_rm_onto_a_full_disk_is_one_line_and_leaves_no_staging_folder(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "pairs.parquet"
    pd.DataFrame(GOOD_PAIRS).to_parquet(train)
    with small_disk(tmp_path / "disk", "32k") as disk:  # the model (~30 KB) + tokenizer do not fit
        result = run_cli(*_rm_args(tiny_model, train, disk / "rm"))
        _one_line(result, 1, f"{disk}/rm", "disk full (ENOSPC)")
        assert _leftovers(disk) == [] and not (disk / "rm").exists()


@pytest.mark.parametrize("command", ["preprocess", "init-model"])
def test_a_read_only_output_folder_is_refused_in_one_line(tmp_path: Path, command: str) -> None:
    source = _jsonl(tmp_path / "in" / "train.jsonl", [GOOD_GSM8K] * 3 + QA)
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        out = ro / "sub" / "out"
        args = (("preprocess", "gsm8k", "--input", str(source), "--out", str(out)) if command == "preprocess" else
                ("init-model", "--out", str(out), "--tokenizer-from", str(source), "--tokenizer", "char"))
        line = _one_line(_refused(tmp_path / "in", *args), 2, str(ro))
        assert "read-only file system (EROFS)" in line or "not writable" in line, line
        assert list(ro.iterdir()) == []


@contextlib.contextmanager
def _without_root() -> Iterator[None]:
    """Drop root's permission override (effective uid/gid nobody) so mode bits apply; restored
    after. The real uid stays root, which is what allows switching back."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize("command", ["preprocess", "init-model"])
def test_an_output_folder_without_write_permission_is_refused_in_one_line(command: str) -> None:
    # Under /tmp, not pytest's tmp_path: nobody must be able to reach the inputs (tmp_path's
    # parents are private to root).
    base = Path(tempfile.mkdtemp(prefix="alignctl-eacces-", dir="/tmp"))
    try:
        base.chmod(0o755)
        source = _jsonl(base / "in" / "train.jsonl", [GOOD_GSM8K] * 3 + QA)
        locked = base / "locked"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        def args(out: Path) -> tuple[str, ...]:
            if command == "preprocess":
                return ("preprocess", "gsm8k", "--input", str(source), "--out", str(out))
            return ("init-model", "--out", str(out), "--tokenizer-from", str(source), "--tokenizer", "char")

        # Once as root first: the command's lazy imports come from folders nobody cannot read
        # (the interpreter's standard library lives under /root here).
        assert run_cli(*args(base / "warm-up" / "out")).code == 0
        shutil.rmtree(base / "warm-up")
        before = _snapshot(base)
        with _without_root():
            result = run_cli(*args(locked / "out"))
        line = _one_line(result, 2, str(locked))
        assert "permission denied (EACCES)" in line or "not writable" in line, line
        assert _snapshot(base) == before
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_os_failures_are_found_behind_library_wrappers() -> None:
    """torch.save / safetensors / DCP wrap the OS error; the cause is still named in plain words."""
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    except RuntimeError as exc:
        failure = find_os_failure(exc)
    assert failure is not None and failure.message() == "disk full (ENOSPC)" and failure.exit_code == 1
    safetensors = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert find_os_failure(safetensors).cause == "disk full (ENOSPC)"  # type: ignore[union-attr]
    ro = find_os_failure(OSError(30, "Read-only file system", "/x/y"))
    assert ro is not None and ro.message() == "/x/y: read-only file system (EROFS)" and ro.exit_code == 2
    assert find_os_failure(ValueError("bad value")) is None


# ------------------------------------------------------------------------------ RL checkpoint


def test_a_full_disk_during_an_rl_checkpoint_is_one_line(tmp_path: Path) -> None:
    from rl_helpers import make_assets

    assets = make_assets(tmp_path / "assets", num_train=8, num_test=4)  # ~100k parameters
    with small_disk(tmp_path / "disk", "300k") as disk:  # config + metrics fit, weights + Adam do not
        start = time.perf_counter()
        result = run_cli(
            "grpo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
            f"actor_rollout_ref.model.path={assets['model']}", f"trainer.run_dir={disk / 'run'}",
            f"custom_reward_function.path={assets['reward']}", "data.train_batch_size=4",
            "data.max_prompt_length=128", "data.max_response_length=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
            "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.save_freq=1")
        # A guard against a hang (a worker left waiting on a failed peer), not a speed test: the run takes
        # under 17 s alone, and 96 s once on 2 cores busy with a training run beside the suite.
        assert time.perf_counter() - start < 300
        _one_line(result, 1, "checkpoint", f"{disk}/run", "disk full (ENOSPC)")
        assert _leftovers(disk) == []


def test_train_rm_warns_about_what_the_cheap_audit_finds(tiny_model: Path, tmp_path: Path) -> None:
    """Two extra copies of a pair, one chosen == rejected, a held-out prompt also in training, and
    the chosen reply always longer: one warning line each; audit=false prints none."""
    rows = [_pref(f"Say hi {i}", "Hello there, friend!", "Go away.") for i in range(4)]
    rows += [rows[0], rows[0], _pref("Same", "Hi", "Hi")]
    train, val = tmp_path / "pairs.parquet", tmp_path / "held_out.parquet"
    pd.DataFrame(rows).to_parquet(train)
    pd.DataFrame([_pref("Say hi 3", "Hello!", "Bye."), _pref("Other", "Yes please.", "No.")]).to_parquet(val)
    args = ("train-rm", f"model.path={tiny_model}", f"data.train_files=[{train}]", f"data.val_files=[{val}]",
            "trainer.micro_batch_size=2", "data.max_length=64")
    result = run_cli(*args, f"output_dir={tmp_path / 'rm'}")
    assert result.code == 0, result.stderr
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert "seeds: trainer.seed=0" in out  # the run names the seed it used (issue 16)
    for needle in ("exact duplicate: 2 of 7 pairs (28.6%)", "identical: 1 of 7 pairs",
                   "held out prompt in train: 1 of 7 pairs", "length bias: the chosen reply is longer in 100.0%"):
        assert needle in out, needle
    quiet = run_cli(*args, f"output_dir={tmp_path / 'rm2'}", "audit=false")
    assert quiet.code == 0 and "audit warning" not in quiet.stdout
