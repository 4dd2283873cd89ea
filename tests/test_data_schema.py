"""The parquet row schemas: valid rows pass, and every violation names the offending field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from alignctl.data.schema import validate_row
from alignctl.errors import UserError

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
INFO = {"split": "train", "index": 0}

VALID: dict[str, dict[str, Any]] = {
    "rl": {"data_source": "openai/gsm8k", "prompt": PROMPT, "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": INFO},
    "preference": {"data_source": "Anthropic/hh-rlhf", "prompt": PROMPT,
                   "chosen": [{"role": "assistant", "content": "4"}],
                   "rejected": [{"role": "assistant", "content": "5"}], "extra_info": INFO},
    "sft": {"data_source": "arith", "prompt": PROMPT,
            "completion": [{"role": "assistant", "content": "2 + 2 = 4. #### 4"}], "extra_info": INFO},
}


def _with(kind: str, path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of the valid ``kind`` row with the value at ``path`` replaced (``...`` deletes it)."""
    row = copy.deepcopy(VALID[kind])
    node: Any = row
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return row


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_rows_pass(kind: str) -> None:
    validate_row(kind, copy.deepcopy(VALID[kind]), "x.jsonl:1")


def test_model_scored_rl_row_may_have_empty_ground_truth() -> None:
    validate_row("rl", _with("rl", ("reward_model",), {"style": "model", "ground_truth": ""}), "w")


def test_extra_columns_are_allowed() -> None:
    row = copy.deepcopy(VALID["rl"])
    row["difficulty"] = 3
    validate_row("rl", row, "w")


CASES = [
    # (kind, path to change, new value (... deletes), field named in the message, expectation)
    ("rl", ("data_source",), ..., "'data_source'", "to be present"),
    ("rl", ("data_source",), 3, "'data_source'", "a string"),
    ("rl", ("prompt",), "2 + 2?", "'prompt'", "non-empty list"),
    ("rl", ("prompt",), [], "'prompt'", "non-empty list"),
    ("rl", ("prompt", 1, "role"), "bot", "'prompt[1].role'", "system/user/assistant"),
    ("rl", ("prompt", 1, "content"), None, "'prompt[1].content'", "a string"),
    ("rl", ("prompt", 1, "content"), "  ", "'prompt[1].content'", "non-empty"),
    ("rl", ("prompt", 0, "name"), "x", "'prompt[0].name'", "no such key"),
    ("rl", ("prompt", 1, "role"), "assistant", "'prompt[1].role'", "ends with a user turn"),
    ("rl", ("ability",), ..., "'ability'", "to be present"),
    ("rl", ("reward_model",), "4", "'reward_model'", "a dict"),
    ("rl", ("reward_model", "style"), "exact", "'reward_model.style'", "rule/model"),
    ("rl", ("reward_model", "ground_truth"), 4, "'reward_model.ground_truth'", "a string"),
    ("rl", ("reward_model", "ground_truth"), "", "'reward_model.ground_truth'", "non-empty"),
    ("rl", ("extra_info",), [], "'extra_info'", "a dict"),
    ("rl", ("extra_info", "split"), ..., "'extra_info.split'", "to be present"),
    ("rl", ("extra_info", "index"), "0", "'extra_info.index'", "non-negative integer"),
    ("rl", ("extra_info", "index"), True, "'extra_info.index'", "non-negative integer"),
    ("preference", ("chosen",), "4", "'chosen'", "non-empty list"),
    ("preference", ("rejected",), ..., "'rejected'", "to be present"),
    ("preference", ("chosen", 0, "role"), "user", "'chosen[0].role'", "'assistant'"),
    ("preference", ("rejected",), [{"role": "assistant", "content": "a"}] * 2, "'rejected'",
     "one-element list"),
    ("sft", ("completion",), ..., "'completion'", "to be present"),
    ("sft", ("completion", 0, "content"), "", "'completion[0].content'", "non-empty"),
]


@pytest.mark.parametrize(("kind", "path", "value", "field", "expected"), CASES)
def test_each_violation_names_the_field(kind: str, path: tuple[Any, ...], value: Any, field: str,
                                        expected: str) -> None:
    with pytest.raises(UserError) as info:
        validate_row(kind, _with(kind, path, value), "in.jsonl:7")
    message = str(info.value)
    assert message.startswith(f"in.jsonl:7: invalid {kind} row: field {field}"), message
    assert expected in message, message
    assert "\n" not in message


def test_non_dict_row_is_rejected() -> None:
    with pytest.raises(UserError, match=r"^w: invalid sft row: field 'row' expected a dict"):
        validate_row("sft", ["not", "a", "row"], "w")
