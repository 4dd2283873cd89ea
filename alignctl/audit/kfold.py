"""Out-of-sample reward-model scores for ``alignctl audit --kfold K``.

A reward model that trained on a pair has seen its label, so its score cannot say the label is
wrong. Here every pair is scored by a model that did not train on it: the scorable rows are split
into K folds, K reward models are trained with train-rm (each on the other K - 1 folds, from
``--base-model`` with the train-rm settings of ``--kfold-config``), and each scores its held-out
fold. The models live in a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alignctl.audit.pairs import Messages
from alignctl.console import console
from alignctl.errors import UserError


@dataclass
class KFoldOptions:
    folds: int
    base_model: str
    config: str | None = None  # a train-rm YAML (freeze_layers, steps, lr, precision ...)
    seed: int = 0


def fold_of_rows(n: int, folds: int, seed: int) -> np.ndarray:
    """Fold index of each of ``n`` rows: a seeded shuffle dealt round-robin, so fold sizes differ
    by at most one and the same seed always gives the same folds."""
    if not 2 <= folds <= n:
        raise UserError(f"--kfold expected 2 <= K <= the number of scorable pairs ({n}), got {folds}")
    order = np.random.default_rng(seed).permutation(n)
    fold = np.empty(n, dtype=int)
    fold[order] = np.arange(n) % folds
    return fold


def check_kfold_options(opts: KFoldOptions) -> None:
    """Refusals before any work: the base model folder and the train-rm config file exist, and
    that config validates (with the keys k-fold sets itself)."""
    import importlib.util

    if opts.folds < 2:
        raise UserError(f"--kfold expected at least 2 folds, got {opts.folds}")
    if importlib.util.find_spec("cleanlab") is None:
        raise UserError("--kfold finds label issues with cleanlab, which is not installed: pip install 'alignctl[audit]'")
    if not Path(opts.base_model, "config.json").is_file():
        raise UserError(f"--base-model {opts.base_model}: not a model folder (no config.json)")
    if opts.config is not None and not Path(opts.config).is_file():
        raise UserError(f"--kfold-config {opts.config}: file not found")
    _fold_config(opts, "unused.parquet", "unused")


def _fold_config(opts: KFoldOptions, train_file: str, output_dir: str) -> Any:
    from alignctl.config import load_config
    from alignctl.config.train_rm import RewardModelConfig

    overrides = [f"model.path={opts.base_model}", f"data.train_files=[{train_file}]", "data.val_files=[]",
                 "data.val_fraction=0", f"output_dir={output_dir}", "audit=false"]
    return load_config(RewardModelConfig, opts.config, overrides)


def out_of_sample_scores(frame: Any, rows: list[int], convs: list[tuple[Messages, Messages, Messages]],
                         opts: KFoldOptions, score: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(chosen, rejected) scores of ``rows``, each from the fold model that did not train on it,
    and each row's fold. ``score(model_dir, conversations)`` scores (prompt, reply) pairs."""
    from alignctl.trainers.rm_trainer import run_train_rm

    fold = fold_of_rows(len(rows), opts.folds, opts.seed)
    chosen, rejected = np.zeros(len(rows)), np.zeros(len(rows))
    with tempfile.TemporaryDirectory(prefix="alignctl-kfold-") as tmp:
        for k in range(opts.folds):
            held_out = np.flatnonzero(fold == k)
            train_rows = [rows[i] for i in np.flatnonzero(fold != k)]
            train_file = Path(tmp, f"fold{k}_train.parquet")
            frame.iloc[train_rows].to_parquet(train_file)
            console.print(f"audit --kfold: training reward model {k + 1}/{opts.folds} on {len(train_rows)} pairs")
            model_dir = str(Path(tmp, f"rm{k}"))
            run_train_rm(_fold_config(opts, str(train_file), model_dir), progress=False)
            # Both sides in one call: the fold model loads once and a pair's prompt is computed once.
            triples = [convs[rows[i]] for i in held_out]
            scores = score(model_dir, [(p, c) for p, c, _ in triples] + [(p, r) for p, _, r in triples])
            chosen[held_out], rejected[held_out] = scores[:len(triples)], scores[len(triples):]
    return chosen, rejected, fold
