"""``alignctl audit --kfold`` (issue 17): label errors from out-of-sample fold reward models.

The golden sets are planted by construction: probabilities drawn apart for the pure test, and on
a real tiny-model run, reply words that make every label learnable, with 10% of the labels swapped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from alignctl.audit import checks
from alignctl.audit.kfold import fold_of_rows
from alignctl.errors import UserError
from conftest import assert_user_error, run_cli


def test_confident_learning_flags_the_planted_low_probability_rows() -> None:
    rng = np.random.default_rng(0)
    clean = rng.uniform(0.55, 0.97, size=180)  # P(chosen preferred) where the label is right
    swapped = rng.uniform(0.03, 0.35, size=20)  # and where it was swapped
    p = np.concatenate([clean, swapped])
    order = rng.permutation(len(p))
    planted = set(np.flatnonzero(order >= 180).tolist())
    flagged = checks.confident_label_issues(p[order])
    assert set(flagged) == planted
    assert [p[order][i] for i in flagged] == sorted(p[order][i] for i in flagged)  # most suspicious first
    assert checks.confident_label_issues(np.full(50, 0.8)) == []  # nothing stands out: nothing flagged


def test_folds_are_balanced_disjoint_and_seeded() -> None:
    fold = fold_of_rows(103, 5, seed=3)
    assert sorted(np.bincount(fold).tolist()) == [20, 20, 21, 21, 21]
    assert np.array_equal(fold, fold_of_rows(103, 5, seed=3))
    assert not np.array_equal(fold, fold_of_rows(103, 5, seed=4))
    with pytest.raises(UserError, match="--kfold"):
        fold_of_rows(3, 4, seed=0)


def _learnable_pairs(n: int, swap_share: float, seed: int) -> tuple[pd.DataFrame, set[int]]:
    """Chosen replies say 'yes', rejected ones 'no' (plus random filler): a tiny RM learns that fast,
    so every swapped row disagrees with its out-of-sample model."""
    rng = random.Random(seed)
    words = ["red", "blue", "cat", "dog", "sun", "sea", "tree", "rock"]
    rows, swapped = [], set(rng.sample(range(n), round(swap_share * n)))
    for i in range(n):
        filler = " ".join(rng.choice(words) for _ in range(3))
        good, bad = f"yes {filler}", f"no {filler}"
        if i in swapped:
            good, bad = bad, good
        rows.append({"prompt": [{"role": "user", "content": f"question {i}: {rng.choice(words)}?"}],
                     "chosen": [{"role": "assistant", "content": good}],
                     "rejected": [{"role": "assistant", "content": bad}]})
    return pd.DataFrame(rows), swapped


def test_kfold_finds_swapped_labels_on_a_real_tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alignctl.models.tiny import init_model

    frame, swapped = _learnable_pairs(160, 0.10, seed=0)
    data = tmp_path / "pairs.parquet"
    frame.to_parquet(data)
    model = tmp_path / "base"
    init_model(out=model, tokenizer_from=[data], hidden=32, layers=1, tokenizer_kind="char", seed=0)
    (tmp_path / "fold_rm.yaml").write_text(
        "data: {max_length: 128}\noptim: {lr: 3.0e-3}\ntrainer: {max_steps: 40, micro_batch_size: 8, logging_steps: 40}\n")
    monkeypatch.chdir(tmp_path)
    result = run_cli("audit", "pairs.parquet", "--kfold", "3", "--base-model", "base", "--kfold-config",
                     "fold_rm.yaml", "--out", "report", "--device", "cpu")
    assert result.code == 0, result.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    flagged = [json.loads(line) for line in (tmp_path / "report" / "flagged.jsonl").read_text().splitlines()]
    found = {r["row"] for r in flagged if any(x["check"] == "label_error" for x in r["reasons"])}
    recall, precision = len(found & swapped) / len(swapped), len(found & swapped) / max(len(found), 1)
    print(f"kfold tiny: recall {recall:.2f} precision {precision:.2f}")
    assert recall >= 0.8 and precision >= 0.8, (recall, precision, sorted(found), sorted(swapped))
    assert summary["reward_model"]["out_of_sample"] is True
    assert summary["reward_model"]["scored_pairs"] == 160
    assert not list(tmp_path.glob("alignctl-kfold-*"))  # fold models lived in a removed temp folder


def test_kfold_option_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frame, _ = _learnable_pairs(10, 0.0, seed=0)
    frame.to_parquet(tmp_path / "pairs.parquet")
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold", "3"), "--base-model")
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold", "3", "--base-model", "nope"), "nope", "config.json")
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold-config", "x.yaml"), "--kfold-config")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold", "1", "--base-model", "base"), "--kfold", "2")
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold", "2", "--base-model", "base",
                              "--reward-model", "base"), "--reward-model")
    (tmp_path / "bad.yaml").write_text("trainer: {max_stepz: 3}\n")
    assert_user_error(run_cli("audit", "pairs.parquet", "--kfold", "2", "--base-model", "base",
                              "--kfold-config", "bad.yaml"), "max_stepz")
    assert not list(tmp_path.glob("audit"))  # refused before writing anything
