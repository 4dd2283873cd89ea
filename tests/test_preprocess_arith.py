"""The synthetic arith task: deterministic per seed, every answer right (recomputed here from the
question text by an independent parser), train/test disjoint, wrong answers really wrong."""

from __future__ import annotations

import operator
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alignctl.config.core import build_config
from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess import PreprocessReport, run_preprocess
from alignctl.errors import UserError

FILES = ["train.parquet", "test.parquet", "sft_train.parquet", "sft_test.parquet",
         "pref_train.parquet", "pref_test.parquet"]
SUFFIX = ' Answer after "####".'
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
# The reference reading of the question wording: phrase -> operation.
ACTIONS = [(re.compile(r"^(?:buys|finds) (\d+) more$"), "+"),
           (re.compile(r"^(?:gives away|loses) (\d+)$"), "-"),
           (re.compile(r"^ends up with (\d+) times as many$"), "*")]
QUESTION = re.compile(r"^(Tom|Sam|Ann|Mia) has (\d+) (apples?|pens?|cards?|books?)\. (He|She) (.+)\. "
                      r"How many (apples|pens|cards|books) does \1 have now\?$")
STEP = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)\.$")


def _run(out: Path, seed: int = 0, **arith: Any) -> PreprocessReport:
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(out), "seed": seed,
                                          "arith": {"num_train": 300, "num_test": 60, "num_sft": 200,
                                                    "num_pref": 250, **arith}})
    return run_preprocess(cfg, progress=False)


def solve(question: str) -> tuple[list[tuple[str, int]], int, int]:
    """(operations, start, answer) read off the question text, independently of the generator."""
    match = QUESTION.match(question)
    assert match, question
    start = int(match.group(2))
    actions = re.split(r", | and ", match.group(5))
    steps = []
    for action in actions:
        found = [(op, int(m.group(1))) for pattern, op in ACTIONS if (m := pattern.match(action))]
        assert len(found) == 1, action
        steps.append(found[0])
    value = start
    for op, n in steps:
        value = OPS[op](value, n)
        assert value >= 0, question
    return steps, start, value


def parse_worked(text: str) -> tuple[list[tuple[int, str, int, int]], int]:
    """``7 + 5 = 12. 12 - 3 = 9. #### 9`` -> ([(7, '+', 5, 12), (12, '-', 3, 9)], 9)."""
    body, final = text.split(" #### ")
    steps = [m.groups() for m in map(STEP.match, re.findall(r"\d+ [-+*] \d+ = \d+\.", body))]
    assert " ".join(f"{a} {o} {b} = {c}." for a, o, b, c in steps) == body, text
    return [(int(a), o, int(b), int(c)) for a, o, b, c in steps], int(final)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("arith") / "a"
    _run(path)
    return path


def _frames(out: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(out / name) for name in FILES}


def test_sizes_and_report(out: Path, tmp_path: Path) -> None:
    report = _run(tmp_path / "o")
    assert report.files == {"train.parquet": 300, "test.parquet": 60, "sft_train.parquet": 200,
                            "sft_test.parquet": 60, "pref_train.parquet": 250, "pref_test.parquet": 60}
    assert report.dropped == {} and report.skipped == {}


def test_deterministic_per_seed(out: Path, tmp_path: Path) -> None:
    _run(tmp_path / "same")
    _run(tmp_path / "other", seed=1)
    for name in FILES:
        assert (tmp_path / "same" / name).read_bytes() == (out / name).read_bytes(), name
        assert (tmp_path / "other" / name).read_bytes() != (out / name).read_bytes(), name


def test_every_answer_is_right(out: Path) -> None:
    frames = _frames(out)
    for name in ("train.parquet", "test.parquet"):
        for _, row in frames[name].iterrows():
            question = row["extra_info"]["question"]
            assert list(row["prompt"]) == [{"role": "user", "content": question + SUFFIX}]
            steps, start, answer = solve(question)
            assert row["reward_model"] == {"style": "rule", "ground_truth": str(answer)}
            lines, final = parse_worked(row["extra_info"]["answer"])
            assert final == answer
            # The worked steps redo the question's operations in order, each one right.
            assert [(o, b) for _, o, b, _ in lines] == steps
            assert lines[0][0] == start
            for (a, o, b, c), nxt in zip(lines, lines[1:] + [(answer,)]):
                assert OPS[o](a, b) == c == nxt[0]
    for name in ("sft_train.parquet", "sft_test.parquet"):
        for _, row in frames[name].iterrows():
            _, _, answer = solve(row["extra_info"]["question"])
            assert row["completion"][0]["role"] == "assistant"
            assert parse_worked(row["completion"][0]["content"])[1] == answer


def test_first_rows_golden(out: Path) -> None:
    """Seed 0 pinned (a change here changes every cached arith artifact: bump FORMAT_VERSION)."""
    rl = pd.read_parquet(out / "train.parquet").iloc[0]
    assert rl["extra_info"]["question"] == ("Sam has 7 pens. He finds 19 more and buys 12 more. "
                                            "How many pens does Sam have now?")
    # By hand: 7 + 19 = 26, 26 + 12 = 38.
    assert rl["extra_info"]["answer"] == "7 + 19 = 26. 26 + 12 = 38. #### 38"
    assert rl["reward_model"]["ground_truth"] == "38"
    pref = pd.read_parquet(out / "pref_train.parquet").iloc[0]
    assert pref["chosen"][0]["content"] == "7 + 19 = 26. 26 + 12 = 38. #### 38"
    # Off by one in the second step (26 + 12 written as 37).
    assert pref["rejected"][0]["content"] == "7 + 19 = 26. 26 + 12 = 37. #### 37"
    assert pref["extra_info"]["rejected_kind"] == "off_by_one"


def test_train_and_test_are_disjoint(out: Path) -> None:
    frames = _frames(out)
    questions = {name: [e["question"] for e in df["extra_info"]] for name, df in frames.items()}
    train = set().union(*(questions[n] for n in FILES if "train" in n))
    test = set(questions["test.parquet"])
    assert not train & test
    assert questions["sft_test.parquet"] == questions["pref_test.parquet"] == questions["test.parquet"]
    for name in FILES:
        assert len(set(questions[name])) == len(questions[name]), f"duplicate question in {name}"


def test_rejected_answers_are_plausible_and_wrong(out: Path) -> None:
    kinds = set()
    for _, row in pd.read_parquet(out / "pref_train.parquet").iterrows():
        steps, _, answer = solve(row["extra_info"]["question"])
        chosen, chosen_final = parse_worked(row["chosen"][0]["content"])
        rejected, final = parse_worked(row["rejected"][0]["content"])
        assert chosen_final == answer and final != answer and final >= 0
        assert [o for _, o, _, _ in rejected] and set(o for _, o, _, _ in rejected) <= {"+", "-"}
        kind = row["extra_info"]["rejected_kind"]
        kinds.add(kind)
        errors = [c - OPS[o](a, b) for a, o, b, c in rejected]
        chained = all(x[3] == y[0] for x, y in zip(rejected, rejected[1:]))
        if kind == "wrong_final":
            assert rejected == chosen and final != rejected[-1][3]
        else:
            assert chained and final == rejected[-1][3]
        if kind in ("slip", "off_by_one"):
            bad = [e for e in errors if e]
            assert len(bad) == 1 and abs(bad[0]) in ({1} if kind == "off_by_one" else {2, 3})
        if kind == "wrong_operation":
            assert not any(errors) and [o for _, o, _, _ in rejected] != [o for o, _ in steps]
    assert kinds == {"slip", "off_by_one", "wrong_operation", "wrong_final"}


def test_multiplication_and_longer_problems(tmp_path: Path) -> None:
    _run(tmp_path / "m", num_train=200, num_sft=0, num_pref=0, operations=["+", "-", "*"],
         max_steps=3, max_value=9)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [".alignctl-output", "meta.json", "test.parquet",
                                                                   "train.parquet"]
    seen_ops = set()
    for _, row in pd.read_parquet(tmp_path / "m" / "train.parquet").iterrows():
        steps, _, answer = solve(row["extra_info"]["question"])
        seen_ops |= {op for op, _ in steps}
        assert row["reward_model"]["ground_truth"] == str(answer)
        assert parse_worked(row["extra_info"]["answer"])[1] == answer
    assert seen_ops == {"+", "-", "*"}


def test_vocabulary_is_small(out: Path) -> None:
    texts = []
    for name, df in _frames(out).items():
        texts += [m["content"] for p in df["prompt"] for m in p]
        for col in ("completion", "chosen", "rejected"):
            if col in df:
                texts += [m[0]["content"] for m in df[col]]
    words = {w for t in texts for w in re.findall(r"[A-Za-z]+", t)}
    chars = {c for t in texts for c in t}
    assert len(words) <= 40, sorted(words)
    assert len(chars) <= 60, sorted(chars)


def test_test_set_does_not_depend_on_train_size(out: Path, tmp_path: Path) -> None:
    _run(tmp_path / "big", num_train=500)
    for name in ("test.parquet", "sft_test.parquet", "pref_test.parquet"):
        assert (tmp_path / "big" / name).read_bytes() == (out / name).read_bytes(), name


def test_progress_bars_go_to_stderr_and_leave_results_unchanged(out: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "p"),
                                          "arith": {"num_train": 300, "num_test": 60, "num_sft": 200,
                                                    "num_pref": 250}})
    run_preprocess(cfg, progress=True)
    assert capsys.readouterr().out == ""
    for name in FILES:
        assert (tmp_path / "p" / name).read_bytes() == (out / name).read_bytes(), name


def test_failed_run_keeps_the_previous_output(out: Path, tmp_path: Path) -> None:
    dest = tmp_path / "keep"
    _run(dest)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(UserError):
        _run(dest, operations=["/"])
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_max_rows_truncates_every_file(tmp_path: Path) -> None:
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "o"), "max_rows": 7})
    report = run_preprocess(cfg, progress=False)
    assert report.files == {name: 7 for name in FILES}


def test_terse_sft_rows_give_only_the_right_final_answer(out: Path, tmp_path: Path) -> None:
    _run(tmp_path / "t", sft_terse_fraction=0.5)
    for name in FILES:
        same = (tmp_path / "t" / name).read_bytes() == (out / name).read_bytes()
        assert same == (not name.startswith("sft_")), name  # only the SFT files change
    for name in ("sft_train.parquet", "sft_test.parquet"):
        df = pd.read_parquet(tmp_path / "t" / name)
        terse = 0
        for _, row in df.iterrows():
            _, _, answer = solve(row["extra_info"]["question"])
            text = row["completion"][0]["content"]
            if text.startswith("####"):
                terse += 1
                assert text == f"#### {answer}"
            else:
                assert text == row["extra_info"]["answer"] and parse_worked(text)[1] == answer
        # A Binomial(n, 0.5) count: 200 rows -> 100 +- 7 (std), 60 rows -> 30 +- 3.9; 4 std either way.
        assert abs(terse - len(df) / 2) <= 4 * (len(df) / 4) ** 0.5, (name, terse)
    _run(tmp_path / "all", sft_terse_fraction=1.0)
    texts = [r[0]["content"] for r in pd.read_parquet(tmp_path / "all" / "sft_train.parquet")["completion"]]
    assert all(t.startswith("#### ") for t in texts)


def test_disjoint_rl_prompts_follow_every_sft_and_preference_question(out: Path, tmp_path: Path) -> None:
    """The default fixture (300 RL, 200 SFT, 250 preference rows) shares its first questions between the
    RL and SFT files; disjoint_rl moves only train.parquet, onto questions after the 250th."""
    questions = {name: [e["question"] for e in df["extra_info"]] for name, df in _frames(out).items()}
    assert questions["train.parquet"][:200] == questions["sft_train.parquet"]  # the default overlaps
    _run(tmp_path / "d", disjoint_rl=True)
    for name in FILES:
        same = (tmp_path / "d" / name).read_bytes() == (out / name).read_bytes()
        assert same == (name != "train.parquet"), name
    rl = [e["question"] for e in pd.read_parquet(tmp_path / "d" / "train.parquet")["extra_info"]]
    assert len(rl) == len(set(rl)) == 300
    assert not set(rl) & (set(questions["sft_train.parquet"]) | set(questions["pref_train.parquet"]))
    assert not set(rl) & set(questions["test.parquet"])
    # The same question stream, read further: a 550-question RL file starts with the default
    # run's first 250 (the preference questions) and continues with the disjoint file.
    _run(tmp_path / "long", num_train=550)
    long = [e["question"] for e in pd.read_parquet(tmp_path / "long" / "train.parquet")["extra_info"]]
    assert long[:250] == questions["pref_train.parquet"] and long[250:] == rl


@pytest.mark.parametrize(("keys", "message"), [
    ({"arith": {"operations": ["+", "/"]}}, "key 'arith.operations' expected a non-empty list of +, -, *"),
    ({"arith": {"min_value": 5, "max_value": 2}}, "expected 0 <= min_value <= max_value"),
    ({"arith": {"min_steps": 0}}, "expected 1 <= min_steps <= max_steps"),
    ({"arith": {"num_test": 0}}, "key 'arith.num_test' expected a positive integer"),
    # max_value 1, one step: 4 names x 4 objects x 4 phrasings ("+ 1" twice, "- 1" twice) = 64 problems.
    ({"arith": {"max_value": 1, "max_steps": 1, "num_test": 10, "num_train": 60}}, "arith: found only"),
    ({"arith": {"sft_terse_fraction": 1.5}}, "key 'arith.sft_terse_fraction' expected a number in [0, 1]"),
    ({"input": "x.jsonl"}, "preprocess arith: key 'input' is not used"),
    ({"test_fraction": 0.1}, "key 'test_fraction' is not used; set arith.num_test"),
])
def test_config_errors(tmp_path: Path, keys: dict[str, Any], message: str) -> None:
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "o"), **keys})
    with pytest.raises(UserError, match=re.escape(message)):
        run_preprocess(cfg, progress=False)
    assert not (tmp_path / "o").exists()


def test_system_prompt_goes_first_and_leaves_the_rows_and_splits_alone(out: Path, tmp_path: Path) -> None:
    """With ``system_prompt`` every file's prompts gain that system message in front; everything
    else, the held-out split included, is the same as without it (compared with the fixture run)."""
    cfg = build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "s"), "seed": 0,
                                          "system_prompt": "Solve the math problem.",
                                          "arith": {"num_train": 300, "num_test": 60, "num_sft": 200,
                                                    "num_pref": 250}})
    run_preprocess(cfg, progress=False)
    system = {"role": "system", "content": "Solve the math problem."}
    for name in FILES:
        plain, with_system = pd.read_parquet(out / name), pd.read_parquet(tmp_path / "s" / name)
        assert len(plain) == len(with_system), name
        for before, after in zip(plain["prompt"], with_system["prompt"]):
            assert list(after) == [system, *before], name
        rest = [c for c in plain.columns if c != "prompt"]
        pd.testing.assert_frame_equal(plain[rest], with_system[rest])


def test_blank_system_prompt_is_refused(tmp_path: Path) -> None:
    """Refused when the config is built; that nothing is written is checked through the CLI
    (test_bad_runs: preprocess_blank_system_prompt)."""
    with pytest.raises(UserError, match=r"^key 'system_prompt' expected a non-empty string"):
        build_config(PreprocessConfig, {"dataset": "arith", "out": str(tmp_path / "o"), "system_prompt": "  "})
