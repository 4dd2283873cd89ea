"""Reward managers: score placement, batch calls, the DAPO overlong penalty, worker-pool timeouts.

User scorers live in a real Python file written per test; it counts its own calls by appending
lines to a file, so calls made inside worker processes are counted too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from alignctl.errors import UserError
from alignctl.rewards import load_reward_function
from alignctl.rewards.managers import (
    REWARD_MANAGERS,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    RewardInputs,
    build_reward_manager,
    overlong_penalty,
)

USER_FILE = """
import os, signal, time

CALLS = {calls!r}


def _count(tag):
    with open(CALLS, "a") as f:
        f.write(tag + "\\n")


def per_sample(data_source, solution_str, ground_truth, extra_info):
    _count(f"item:{{os.getpid()}}")
    if solution_str == "slow":
        time.sleep(60)
    if solution_str == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if solution_str == "dict":
        return {{"score": 0.5, "acc": True}}
    return float(solution_str == ground_truth)


def whole_batch(data_sources, solution_strs, ground_truths, extra_infos):
    _count(f"batch:{{len(solution_strs)}}")
    return [{{"score": float(s == g), "chars": len(s)}} for s, g in zip(solution_strs, ground_truths)]


def short_batch(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0]


def slow_batch(data_sources, solution_strs, ground_truths, extra_infos):
    time.sleep(60)


def says_yes(data_source, solution_str, ground_truth, extra_info):
    return "yes"
"""


class UserScorers:
    def __init__(self, tmp_path: Path) -> None:
        self.calls_file = tmp_path / "calls.txt"
        self.path = tmp_path / "scorers.py"
        self.path.write_text(USER_FILE.format(calls=str(self.calls_file)))

    def load(self, name: str):  # type: ignore[no-untyped-def]
        return load_reward_function(self.path, name)

    def calls(self) -> list[str]:
        return self.calls_file.read_text().split() if self.calls_file.exists() else []


@pytest.fixture
def user(tmp_path: Path) -> UserScorers:
    return UserScorers(tmp_path)


def _inputs(responses: list[str], truths: list[str], lengths: list[int], width: int, source: str = "gsm8k") -> RewardInputs:
    return RewardInputs(
        data_sources=[source] * len(responses),
        responses=responses,
        ground_truths=truths,
        response_lengths=lengths,
        response_width=width,
    )


def test_score_goes_on_the_last_response_token_and_empty_rows_stay_zero() -> None:
    batch = _inputs(["#### 18", "#### 2", "so #### 7", ""], ["18", "3", "7", "5"], [3, 1, 4, 0], width=4)
    out = NaiveRewardManager()(batch)
    expected = torch.tensor(
        [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.float32
    )
    assert out.token_level_scores.dtype == torch.float32
    assert torch.equal(out.token_level_scores, expected)
    assert out.scores == [1.0, 0.0, 1.0, 0.0]
    assert (out.num_timeouts, out.num_crashes, out.extra) == (0, 0, {})


def test_response_mask_places_on_the_last_unmasked_token() -> None:
    mask = [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    for given in (mask, torch.tensor(mask)):
        batch = {
            "data_sources": ["gsm8k"] * 3,
            "responses": ["#### 1", "#### 1", "#### 1"],
            "ground_truths": ["1", "1", "1"],
            "response_mask": given,
            "response_width": 5,
        }
        out = NaiveRewardManager()(batch)
        assert out.token_level_scores.nonzero().tolist() == [[0, 3], [2, 0]]


def test_pool_and_in_process_give_the_same_output(user: UserScorers) -> None:
    fn = user.load("per_sample")
    batch = _inputs(["a", "b", "dict", "c"], ["a", "x", "-", "c"], [1, 2, 3, 4], width=4, source="any")
    local = NaiveRewardManager(fn)(batch)
    with_pool = NaiveRewardManager(fn, num_workers=2, timeout_s=10.0)
    try:
        remote = with_pool(batch)
    finally:
        with_pool.close()
    assert torch.equal(local.token_level_scores, remote.token_level_scores)
    assert local.scores == remote.scores == [1.0, 0.0, 0.5, 1.0]
    # Extras from the one dict return, None for the float returns.
    assert local.extra == remote.extra == {"acc": [None, None, True, None]}
    pids = {int(tag.split(":")[1]) for tag in user.calls()}
    assert os.getpid() in pids and len(pids) >= 2  # the pool's calls ran in other processes


def test_pool_timeouts_and_crashes_are_counted_and_score_zero(user: UserScorers) -> None:
    timeout_s = 1.0
    manager = NaiveRewardManager(user.load("per_sample"), num_workers=2, timeout_s=timeout_s)
    try:
        manager(_inputs(["a", "b"], ["a", "b"], [1, 1], width=2, source="any"))  # start both workers
        start = time.monotonic()
        out = manager(_inputs(["slow", "a", "crash", "b"], ["slow", "a", "crash", "x"], [1, 2, 2, 1], width=2, source="any"))
        wall = time.monotonic() - start
        assert out.scores == [0.0, 1.0, 0.0, 0.0]
        assert (out.num_timeouts, out.num_crashes) == (1, 1)
        assert wall < timeout_s + 3.0  # the crash's replacement worker may have to start: ~1 s
        # Killed workers were replaced: the pool still scores.
        assert manager(_inputs(["a"], ["a"], [1], width=1, source="any")).scores == [1.0]
    finally:
        manager.close()


def test_in_process_math_timeouts_are_counted() -> None:
    batch = _inputs([r"\boxed{9^{9^{9^{9}}}}", r"\boxed{\frac{1}{2}}"], ["1", "0.5"], [3, 3], width=3, source="math")
    out = NaiveRewardManager(timeout_s=1.0)(batch)
    assert out.scores == [0.0, 1.0]
    assert out.num_timeouts == 1


def test_batch_manager_calls_the_user_function_once_per_batch(user: UserScorers) -> None:
    batch = _inputs(["a", "b", "c", "d"], ["a", "x", "c", "x"], [1, 1, 2, 2], width=2, source="any")
    out = BatchRewardManager(user.load("whole_batch"))(batch)
    assert user.calls() == ["batch:4"]
    assert out.scores == [1.0, 0.0, 1.0, 0.0]
    assert out.extra == {"chars": [1, 1, 1, 1]}
    assert out.token_level_scores[:, 1].tolist() == [0.0, 0.0, 1.0, 0.0]

    in_worker = BatchRewardManager(user.load("whole_batch"), num_workers=1, timeout_s=10.0)
    try:
        assert in_worker(batch).scores == out.scores
    finally:
        in_worker.close()
    assert user.calls() == ["batch:4", "batch:4"]


def test_batch_manager_default_scores_by_data_source() -> None:
    out = BatchRewardManager()(_inputs(["#### 4", "#### 5"], ["4", "4"], [2, 2], width=2))
    assert out.scores == [1.0, 0.0]


def test_batch_result_of_wrong_length_is_a_user_error(user: UserScorers) -> None:
    batch = _inputs(["a", "b", "c"], ["a", "b", "c"], [1, 1, 1], width=1, source="any")
    with pytest.raises(UserError, match=r"'short_batch' .* returned 1 results for a batch of 3"):
        BatchRewardManager(user.load("short_batch"))(batch)


def test_batch_timeout_counts_every_sample(user: UserScorers) -> None:
    manager = BatchRewardManager(user.load("slow_batch"), num_workers=1, timeout_s=1.0)
    try:
        out = manager(_inputs(["a", "b", "c"], ["a", "b", "c"], [1, 1, 1], width=1, source="any"))
    finally:
        manager.close()
    assert out.scores == [0.0, 0.0, 0.0] and out.num_timeouts == 3


def test_bad_return_through_a_manager_names_the_function(user: UserScorers) -> None:
    with pytest.raises(UserError, match=r"'says_yes' in .*scorers\.py returned 'yes' \(str\)"):
        NaiveRewardManager(user.load("says_yes"))(_inputs(["a"], ["a"], [1], width=1, source="any"))


def test_overlong_penalty_golden_numbers() -> None:
    # L = 10, b = 4, p = 0.5: no penalty up to L - b = 6, then -(l - 6) / 4 * 0.5.
    assert overlong_penalty(5, 10, 4, 0.5) == 0.0  # min(0, +0.125)
    assert overlong_penalty(6, 10, 4, 0.5) == 0.0
    assert overlong_penalty(8, 10, 4, 0.5) == -0.25  # -(8 - 6) / 4 * 0.5
    assert overlong_penalty(10, 10, 4, 0.5) == -0.5  # -(10 - 6) / 4 * 0.5 = -p at l = L


def test_dapo_adds_the_penalty_and_reports_it() -> None:
    batch = _inputs(["#### 1", "#### 1", "#### 1", "#### 2"], ["1", "1", "1", "1"], [5, 6, 8, 10], width=10)
    out = DAPORewardManager(max_resp_len=10, overlong_buffer_len=4, overlong_penalty_factor=0.5)(batch)
    # 1 + 0, 1 + 0, 1 - 0.25, 0 - 0.5 (the last answer is wrong)
    assert out.scores == [1.0, 1.0, 0.75, -0.5]
    assert out.extra == {"overlong_reward": [0.0, 0.0, -0.25, -0.5], "overlong": [False, False, True, True]}
    expected = torch.zeros(4, 10)
    expected[0, 4], expected[1, 5], expected[2, 7], expected[3, 9] = 1.0, 1.0, 0.75, -0.5
    assert torch.equal(out.token_level_scores, expected)
    # max_resp_len defaults to the response width (10 here): same numbers.
    assert DAPORewardManager(overlong_buffer_len=4, overlong_penalty_factor=0.5)(batch).scores == out.scores
    # Buffer 0 switches the penalty off.
    assert DAPORewardManager(max_resp_len=10)(batch).scores == [1.0, 1.0, 1.0, 0.0]


def test_dapo_penalty_keeps_growing_past_max_resp_len() -> None:
    # L = 8, b = 4, p = 1, l = 10: -(10 - 4) / 4 * 1 = -1.5, beyond -p.
    batch = _inputs(["#### 1"], ["1"], [10], width=10)
    out = build_reward_manager("dapo", max_resp_len=8, overlong_buffer_len=4, overlong_penalty_factor=1.0)(batch)
    assert out.scores == [1.0 - 1.5]


def test_build_reward_manager_errors() -> None:
    assert isinstance(build_reward_manager("batch"), BatchRewardManager)
    with pytest.raises(UserError, match=r"unknown reward manager 'prime' \(known: batch, dapo, naive\)"):
        build_reward_manager("prime")
    with pytest.raises(UserError, match=r"reward manager 'naive' has no option 'max_resp_len'"):
        build_reward_manager("naive", max_resp_len=10)
    with pytest.raises(UserError, match="overlong_buffer_len must be in"):
        build_reward_manager("dapo", max_resp_len=4, overlong_buffer_len=8)
    with pytest.raises(UserError, match="timeout_s must be > 0"):
        build_reward_manager("naive", timeout_s=0)


def test_the_documented_manager_is_validated_and_built_from_the_config_keys_it_declares() -> None:
    """docs/customize.md's LengthBonus: the rule score plus length / data.max_response_length."""
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.trainers.reward import manager_options
    from doc_blocks import python_file_block

    flags = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "data.max_response_length": 8,
             "actor_rollout_ref.rollout.n": 2}
    exec(compile(python_file_block("customize.md", "my_managers.py"), "docs/customize.md", "exec"), {})
    try:
        cfg = load_config(RLConfig, None, [], flags={**flags, "reward_model.reward_manager": "length_bonus"})
        assert manager_options(cfg, "length_bonus") == {"max_len": 8}
        manager = build_reward_manager("length_bonus", **manager_options(cfg, "length_bonus"))
        assert manager(_inputs(["#### 1", "#### 2"], ["1", "1"], [4, 2], width=8)).scores == [1.5, 0.25]
        assert manager_options(cfg, "dapo") == {"max_resp_len": 8, "overlong_buffer_len": 0,
                                                "overlong_penalty_factor": 1.0}
        with pytest.raises(UserError, match=r"key 'reward_model.reward_manager' expected one of batch, dapo, "
                                            r"length_bonus, naive, got 'prime'; .*'algorithm.plugins'"):
            load_config(RLConfig, None, [], flags={**flags, "reward_model.reward_manager": "prime"})
    finally:
        REWARD_MANAGERS.unregister("length_bonus")


def test_inconsistent_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="disagree"):
        _inputs(["a", "b"], ["a"], [1, 1], width=2)
    with pytest.raises(ValueError, match="outside"):
        _inputs(["a"], ["a"], [3], width=2)
    with pytest.raises(ValueError, match="exactly one"):
        RewardInputs(["s"], ["a"], ["a"], response_width=1)


def test_unpicklable_scorer_with_workers_says_how_to_fix_it() -> None:
    manager = NaiveRewardManager(lambda *args: 1.0, num_workers=1)
    try:
        with pytest.raises(TypeError, match="load_reward_function"):
            manager(_inputs(["a"], ["a"], [1], width=1, source="any"))
    finally:
        manager.close()
