"""Loading user reward functions from files, and checking what scorers return."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from alignctl.errors import UserError
from alignctl.rewards.reward_function import RewardFunction, Score, check_score, load_reward_function


def _write(tmp_path: Path, text: str, name: str = "reward.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _user_error(path: Path | str, name: str = "compute_score") -> str:
    with pytest.raises(UserError) as info:
        load_reward_function(path, name)
    message = str(info.value)
    assert "\n" not in message
    return message


GOOD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "source": data_source}

def helper():
    return 1
"""


def test_loads_and_calls_a_verl_style_function(tmp_path: Path) -> None:
    fn = load_reward_function(_write(tmp_path, GOOD))
    assert isinstance(fn, RewardFunction)
    assert fn("gsm8k", " 18 ", "18", {}) == {"score": 1.0, "source": "gsm8k"}
    assert check_score(fn("gsm8k", "17", "18", None), fn) == Score(0.0, {"source": "gsm8k"})


def test_pickles_by_path_and_name(tmp_path: Path) -> None:
    fn = load_reward_function(_write(tmp_path, GOOD), "helper")
    clone = pickle.loads(pickle.dumps(fn))
    assert (clone.path, clone.name) == (fn.path, "helper")
    assert clone() == 1
    assert len(pickle.dumps(fn)) < 400  # the state is the path and the name, not the code


def test_missing_file(tmp_path: Path) -> None:
    message = _user_error(tmp_path / "nope.py")
    assert "not found" in message and "nope.py" in message


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "x = 1\ndef compute_score(:\n    pass\n")
    message = _user_error(path)
    assert "syntax error" in message and str(path) in message and "line 2" in message


def test_error_while_importing_the_file(tmp_path: Path) -> None:
    message = _user_error(_write(tmp_path, "RATE = 1 / 0\n"))
    assert "ZeroDivisionError" in message and "reward.py" in message


def test_missing_function_lists_what_is_there(tmp_path: Path) -> None:
    message = _user_error(_write(tmp_path, GOOD), "score_fn")
    assert "no function 'score_fn'" in message and "compute_score" in message and "helper" in message


def test_not_callable(tmp_path: Path) -> None:
    message = _user_error(_write(tmp_path, "compute_score = 3\n"))
    assert "'compute_score'" in message and "not callable" in message and "int" in message


def _bad_return(value: object) -> str:
    def my_scorer() -> object:
        return value

    with pytest.raises(UserError) as info:
        check_score(my_scorer(), my_scorer)
    message = str(info.value)
    assert "my_scorer" in message and "\n" not in message
    return message


def test_bad_returns_name_the_function_and_the_value() -> None:
    assert "'abc' (str)" in _bad_return("abc")
    assert "None (NoneType)" in _bad_return(None)
    assert "a dict without 'score' (keys: acc)" in _bad_return({"acc": 1.0})
    assert "nan (float)" in _bad_return(math.nan)
    assert "inf (float)" in _bad_return(math.inf)
    assert "'1.0' (str)" in _bad_return({"score": "1.0"})
    assert "[1.0] (list)" in _bad_return([1.0])


def test_bad_return_from_a_loaded_file_names_file_and_function(tmp_path: Path) -> None:
    fn = load_reward_function(_write(tmp_path, "def judge(a, b, c, d):\n    return float('nan')\n"), "judge")
    with pytest.raises(UserError, match=r"reward function 'judge' in .*reward\.py returned nan \(float\)"):
        check_score(fn("x", "y", "z", None), fn)


def test_accepted_returns() -> None:
    def f() -> None: ...

    assert check_score(True, f) == Score(1.0)  # "is correct" verifiers
    assert check_score(np.float32(0.25), f) == Score(0.25)
    assert check_score(-2, f) == Score(-2.0)
    assert check_score({"score": 0.5, "acc": False, "pred": "7"}, f) == Score(0.5, {"acc": False, "pred": "7"})
