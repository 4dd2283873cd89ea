"""Pure checks of preference pairs: no files, no models, no printing.

Each function takes plain texts / numbers and returns row indices (or groups of them) plus numbers;
:mod:`alignctl.audit.auditing` feeds them and :mod:`alignctl.audit.audit_report` writes them.
Text comparisons use :func:`normalize` (lowercase, whitespace collapsed), so a copy that only
differs in case or spacing still counts as the same text.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Defaults, documented in docs/audit.md; the runner passes them through.
NEAR_DUP_THRESHOLD = 0.8  # estimated Jaccard similarity of word 3-gram shingles of the whole pair
NEAR_DUP_NUM_PERM = 128  # MinHash permutations: Jaccard estimate error ~ 1/sqrt(128) ~ 0.09
SHINGLE_WORDS = 3
LENGTH_BIAS_MARGIN = 0.10  # warn when the share of longer-chosen pairs is outside 0.5 +- this
LENGTH_MATCH_TOLERANCE = 0.10  # "length-matched": |len(c) - len(r)| <= 10% of the longer one
LABEL_ERROR_PROBABILITY = 0.9  # P(rejected preferred) = sigmoid(s_r - s_c) at or above this

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class PairText:
    """One row's texts as plain strings ('' when the field is missing or empty)."""

    prompt: str
    chosen: str
    rejected: str


def normalize(text: str) -> str:
    """Lowercase with runs of whitespace collapsed to one space, ends stripped."""
    return _SPACE.sub(" ", text).strip().lower()


def empty_fields(pairs: Sequence[PairText]) -> dict[int, list[str]]:
    """Row -> the names of its empty fields (prompt / chosen / rejected)."""
    out: dict[int, list[str]] = {}
    for i, pair in enumerate(pairs):
        names = [name for name in ("prompt", "chosen", "rejected") if not normalize(getattr(pair, name))]
        if names:
            out[i] = names
    return out


def identical_pairs(pairs: Sequence[PairText]) -> list[int]:
    """Rows whose chosen and rejected are the same non-empty text: no preference to learn from
    (the Bradley-Terry loss is log 2 with zero gradient)."""
    return [i for i, p in enumerate(pairs) if normalize(p.chosen) and normalize(p.chosen) == normalize(p.rejected)]


def _groups_by_key(keys: Iterable[str]) -> list[list[int]]:
    """Rows sharing a key, groups of two or more, in first-row order."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        by_key[key].append(i)
    return [rows for rows in by_key.values() if len(rows) > 1]


def pair_key(pair: PairText) -> str:
    """The whole pair as one normalized string (fields separated by a character text never has)."""
    return "\x1f".join(normalize(t) for t in (pair.prompt, pair.chosen, pair.rejected))


def exact_duplicate_groups(pairs: Sequence[PairText]) -> list[list[int]]:
    """Groups of rows with the same normalized (prompt, chosen, rejected)."""
    return _groups_by_key(pair_key(p) for p in pairs)


def shingles(text: str, width: int = SHINGLE_WORDS) -> set[bytes]:
    """Word ``width``-grams of the normalized text (the whole text when it is shorter)."""
    words = normalize(text).split(" ")
    if len(words) <= width:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i:i + width]).encode("utf-8") for i in range(len(words) - width + 1)}


def near_duplicate_groups(pairs: Sequence[PairText], *, threshold: float = NEAR_DUP_THRESHOLD,
                          num_perm: int = NEAR_DUP_NUM_PERM, skip: set[int] | None = None,
                          wrap: Callable[[Iterable[int]], Iterable[int]] = lambda it: it) -> list[list[int]]:
    """Groups of rows whose whole-pair texts have estimated Jaccard similarity >= ``threshold``.

    MinHash + LSH (datasketch) finds candidates in about linear time; each candidate is confirmed
    with the MinHash Jaccard estimate, and groups are the connected components. ``skip`` rows
    (e.g. all but one of each exact-duplicate group) are left out so the two checks do not
    report the same copies twice. ``wrap`` wraps the row loop (a progress bar)."""
    from datasketch import MinHash, MinHashLSH

    skip = skip or set()
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    hashes: dict[int, MinHash] = {}
    for i in wrap(range(len(pairs))):
        if i in skip:
            continue
        pair = pairs[i]
        mh = MinHash(num_perm=num_perm, seed=1)
        mh.update_batch(list(shingles(f"{pair.prompt}\n{pair.chosen}\n{pair.rejected}")))
        hashes[i] = mh
        lsh.insert(i, mh)
    parent = {i: i for i in hashes}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, mh in hashes.items():
        for j in lsh.query(mh):
            if j != i and mh.jaccard(hashes[j]) >= threshold:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in hashes:
        groups[find(i)].append(i)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: g[0])


def leaked_prompts(pairs: Sequence[PairText], test_prompts: Iterable[str]) -> list[int]:
    """Rows whose normalized prompt is also a prompt of the other split (train/test leakage)."""
    test = {normalize(p) for p in test_prompts}
    test.discard("")
    return [i for i, p in enumerate(pairs) if normalize(p.prompt) in test]


def length_bias(chosen: Sequence[int], rejected: Sequence[int], margin: float = LENGTH_BIAS_MARGIN) -> dict[str, float | bool]:
    """How often the chosen reply is longer (or shorter, or equal), and whether that share is far
    enough from one half to warn: a reward model trained on such data learns 'longer is better'."""
    c, r = np.asarray(chosen, dtype=np.float64), np.asarray(rejected, dtype=np.float64)
    n = max(len(c), 1)
    longer = float(np.sum(c > r)) / n
    shorter = float(np.sum(c < r)) / n
    decided = longer + shorter
    share = longer / decided if decided else 0.5  # among pairs of different lengths
    return {"chosen_longer": longer, "chosen_shorter": shorter, "equal": 1.0 - decided,
            "longer_share_of_unequal": share, "mean_chosen": float(c.mean()) if len(c) else 0.0,
            "mean_rejected": float(r.mean()) if len(r) else 0.0, "biased": abs(share - 0.5) > margin}


def length_matched(chosen: Sequence[int], rejected: Sequence[int], tolerance: float = LENGTH_MATCH_TOLERANCE) -> np.ndarray:
    """Boolean mask of pairs whose lengths differ by at most ``tolerance`` of the longer one."""
    c, r = np.asarray(chosen, dtype=np.float64), np.asarray(rejected, dtype=np.float64)
    return np.abs(c - r) <= tolerance * np.maximum(np.maximum(c, r), 1.0)


def too_long(chosen_tokens: Sequence[int], rejected_tokens: Sequence[int], max_length: int) -> list[int]:
    """Rows where prompt + chosen or prompt + rejected exceeds ``max_length`` tokens: train-rm
    (TRL) drops such pairs, and an RM scorer truncates them."""
    return [i for i, (c, r) in enumerate(zip(chosen_tokens, rejected_tokens)) if max(c, r) > max_length]


def rejected_probability(chosen_scores: np.ndarray, rejected_scores: np.ndarray) -> np.ndarray:
    """Bradley-Terry P(rejected is preferred) = sigmoid(s_rejected - s_chosen), overflow-safe."""
    diff = np.asarray(rejected_scores, dtype=np.float64) - np.asarray(chosen_scores, dtype=np.float64)
    return np.where(diff >= 0, 1.0 / (1.0 + np.exp(-np.abs(diff))), np.exp(-np.abs(diff)) / (1.0 + np.exp(-np.abs(diff))))


def label_errors(chosen_scores: np.ndarray, rejected_scores: np.ndarray,
                 threshold: float = LABEL_ERROR_PROBABILITY) -> list[int]:
    """Rows the reward model confidently disagrees with: P(rejected preferred) >= ``threshold``."""
    return [int(i) for i in np.flatnonzero(rejected_probability(chosen_scores, rejected_scores) >= threshold)]


def rm_accuracy(chosen_scores: np.ndarray, rejected_scores: np.ndarray, chosen_len: Sequence[int],
                rejected_len: Sequence[int], tolerance: float = LENGTH_MATCH_TOLERANCE) -> dict[str, float | int | None]:
    """The RM's accuracy (chosen scored strictly higher; ties count wrong, as in train-rm) overall,
    on length-matched pairs, and split by which reply is longer: an RM that only rewards length
    scores well on the longer-chosen pairs and near or below chance on the others."""
    right = np.asarray(chosen_scores) > np.asarray(rejected_scores)
    c, r = np.asarray(chosen_len), np.asarray(rejected_len)
    subsets = {"all": np.ones(len(right), dtype=bool), "length_matched": length_matched(c, r, tolerance),
               "chosen_longer": c > r, "chosen_shorter": c < r}
    out: dict[str, float | int | None] = {}
    for name, mask in subsets.items():
        count = int(mask.sum())
        out[f"accuracy_{name}"] = float(right[mask].mean()) if count else None
        out[f"pairs_{name}"] = count
    return out


def likelihood_accuracy(chosen_total: np.ndarray, rejected_total: np.ndarray, chosen_mean: np.ndarray,
                        rejected_mean: np.ndarray) -> dict[str, float | int | None]:
    """How often a language model's own likelihood prefers the chosen reply: by the summed
    log-probability of the reply's tokens (which favours short replies) and by the per-token mean
    (which does not). Ties count wrong, as in :func:`rm_accuracy`."""
    pairs = len(chosen_total)
    if not pairs:
        return {"pairs": 0, "accuracy_sum": None, "accuracy_mean": None}
    return {"pairs": pairs,
            "accuracy_sum": float(np.mean(np.asarray(chosen_total) > np.asarray(rejected_total))),
            "accuracy_mean": float(np.mean(np.asarray(chosen_mean) > np.asarray(rejected_mean)))}


def accuracy_by_group(right: Sequence[bool], groups: Sequence[str]) -> dict[str, dict[str, float | int]]:
    """Share of right answers per group label, groups sorted by name: one overall number can hide
    a scorer that knows only the easy kind of pair."""
    if len(right) != len(groups):
        raise ValueError(f"{len(groups)} group labels for {len(right)} pairs")
    table: dict[str, dict[str, float | int]] = {}
    for name in sorted(set(groups)):
        members = [bool(ok) for ok, g in zip(right, groups) if g == name]
        table[name] = {"pairs": len(members), "accuracy": sum(members) / len(members)}
    return table


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN: a missing statistic is null."""
    return None if value is None or not math.isfinite(value) else value


def confident_label_issues(chosen_probability: np.ndarray) -> list[int]:
    """Rows whose label is likely wrong by confident learning (cleanlab's ``find_label_issues``,
    ``filter_by='prune_by_noise_rate'``) on out-of-sample P(chosen is preferred).

    A preference file has one label ("chosen wins"), while confident learning needs both classes to
    set its per-class thresholds; so every pair enters twice, once as (chosen, rejected) labelled
    "first wins" and once swapped, labelled "second wins". The two copies are mirror images, so
    they are flagged together and the first copy's verdict is returned, ranked most suspicious first.
    """
    from cleanlab.filter import find_label_issues

    p = np.clip(np.asarray(chosen_probability, dtype=np.float64), 1e-6, 1 - 1e-6)
    n = len(p)
    if n < 2:
        return []
    first_wins = np.stack([p, 1 - p], axis=1)
    labels = np.concatenate([np.zeros(n, dtype=int), np.ones(n, dtype=int)])
    probs = np.concatenate([first_wins, first_wins[:, ::-1]])
    issues = find_label_issues(labels, probs, filter_by="prune_by_noise_rate")
    flagged = np.flatnonzero(issues[:n])
    return [int(i) for i in flagged[np.argsort(p[flagged], kind="stable")]]
