"""Planted-fault measurement of ``alignctl audit`` (docs/results.md).

Preprocesses the HH-RLHF harmless test pairs (``--source``, default the file the ``hf download`` of
pipelines/hh_rlhf_rm_ppo.yaml puts in data/; a train/test split of the one file),
plants known faults into the train split, runs the audit and prints recall / precision per check:

- 5% exact duplicates (copies of untouched rows; half with case/whitespace changes),
- 3% chosen == rejected,
- 2% of the test prompts copied into train (the whole test row appended),
- 10% labels swapped (found only with --reward-model RM, or out of sample with --kfold K
  --base-model DIR [--kfold-config RM.yaml]; not measured without one of them),
- a subset (30% by default) whose chosen reply gets filler sentences until it is 20% longer than
  the rejected one (a systematic length bias).

    .venv/bin/python scripts/audit_planted.py [--reward-model RM | --kfold K --base-model DIR]
        [--kfold-config RM.yaml] [--source FILE.jsonl.gz]

``plant_faults`` and ``measure`` are also used by tests/test_audit.py on small files.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
FILLER = (" I hope this helps, and please let me know if there is anything else you would like to know about "
          "this topic, since I am always happy to explain things in more detail.")


@dataclass
class Planted:
    """Row indices (in the written, shuffled file) of each planted fault."""

    duplicate: set[int] = field(default_factory=set)  # every row of a group that holds a planted copy
    identical: set[int] = field(default_factory=set)
    leakage: set[int] = field(default_factory=set)
    swapped: set[int] = field(default_factory=set)
    longer: set[int] = field(default_factory=set)


def _reply(value: Any) -> Any:
    return [dict(m) for m in value] if not isinstance(value, str) else value


def _set_text(value: Any, text: str) -> Any:
    if isinstance(value, str):
        return text
    out = [dict(m) for m in value]
    out[-1]["content"] = text
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value[-1]["content"])


def plant_faults(train: pd.DataFrame, test: pd.DataFrame, seed: int = 0, *, duplicates: float = 0.05,
                 identical: float = 0.03, leakage: float = 0.02, swapped: float = 0.10,
                 longer: float = 0.30) -> tuple[pd.DataFrame, Planted]:
    """A copy of ``train`` with faults planted (fractions of the train rows; leakage of the test
    rows), shuffled; returns it and where each fault ended up."""
    rng = np.random.default_rng(seed)
    rows = [dict(r) for r in train.to_dict(orient="records")]
    n = len(rows)
    order = rng.permutation(n)
    counts = [round(f * n) for f in (identical, swapped, longer)]
    cut = np.cumsum(counts)
    ident_idx, swap_idx, long_idx = order[:cut[0]], order[cut[0]:cut[1]], order[cut[1]:cut[2]]
    untouched = order[cut[2]:]
    tags: list[set[str]] = [set() for _ in rows]
    for i in ident_idx:
        rows[i]["rejected"] = _reply(rows[i]["chosen"])
        tags[i].add("identical")
    for i in swap_idx:
        rows[i]["chosen"], rows[i]["rejected"] = rows[i]["rejected"], rows[i]["chosen"]
        tags[i].add("swapped")
    for i in long_idx:  # filler until chosen is clearly longer than rejected: a systematic bias
        text = _text(rows[i]["chosen"])
        while len(text) <= 1.2 * len(_text(rows[i]["rejected"])):
            text += FILLER
        rows[i]["chosen"] = _set_text(rows[i]["chosen"], text)
        tags[i].add("longer")
    for k, i in enumerate(rng.choice(untouched, size=round(duplicates * n), replace=False)):
        copy = {key: _reply(v) if key in ("prompt", "chosen", "rejected") else v for key, v in rows[i].items()}
        if k % 2:  # normalization must catch copies that differ in case and spacing
            copy["chosen"] = _set_text(copy["chosen"], "  " + _text(copy["chosen"]).upper().replace(" ", "  "))
        tags[i].add("duplicate")
        rows.append(copy)
        tags.append({"duplicate"})
    test_rows = test.to_dict(orient="records")
    for i in rng.choice(len(test_rows), size=max(1, round(leakage * len(test_rows))), replace=False):
        rows.append(dict(test_rows[i]))
        tags.append({"leakage"})
    shuffle = rng.permutation(len(rows))
    planted = Planted()
    for new, old in enumerate(shuffle):
        for tag in tags[old]:
            getattr(planted, tag).add(new)
    frame = pd.DataFrame([rows[i] for i in shuffle])
    return frame, planted


def measure(summary: dict[str, Any], flagged: list[dict[str, Any]], planted: Planted) -> dict[str, dict[str, float]]:
    """Recall and precision of each check against the planted rows."""
    found: dict[str, set[int]] = {}
    for record in flagged:
        for reason in record["reasons"]:
            found.setdefault(reason["check"], set()).add(record["row"])
    pairs = {"exact_duplicate": planted.duplicate, "identical": planted.identical, "test_leakage": planted.leakage,
             "label_error": planted.swapped}
    out = {}
    for check, truth in pairs.items():
        if not summary["checks"].get(check, {}).get("ran", False):
            continue
        hits = found.get(check, set())
        out[check] = {"planted": len(truth), "flagged": len(hits), "true_positives": len(hits & truth),
                      "recall": len(hits & truth) / len(truth) if truth else float("nan"),
                      "precision": len(hits & truth) / len(hits) if hits else float("nan")}
    return out


def _read_outputs(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = json.loads((folder / "summary.json").read_text())
    flagged = [json.loads(line) for line in (folder / "flagged.jsonl").read_text().splitlines()]
    return summary, flagged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(DEFAULT_SOURCE), help="HH-RLHF jsonl(.gz) file")
    parser.add_argument("--reward-model", default=None, help="RM folder (measures label_error)")
    parser.add_argument("--tokenizer", default=None, help="model folder for token lengths")
    parser.add_argument("--kfold", type=int, default=None, help="K fold reward models (out-of-sample label_error)")
    parser.add_argument("--base-model", default=None, help="model folder the fold reward models start from")
    parser.add_argument("--kfold-config", default=None, help="train-rm YAML for the fold reward models")
    parser.add_argument("--max-pairs", type=int, default=None, help="use only the first N train pairs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not Path(args.source).is_file():
        print(f"{args.source}: not found", file=sys.stderr)
        return 2
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.audit import AuditOptions, KFoldOptions, run_audit
    from alignctl.audit.checks import length_bias
    from alignctl.data.preprocess import run_preprocess

    with tempfile.TemporaryDirectory(prefix="audit-planted-") as tmp:
        data = Path(tmp) / "hh"
        run_preprocess(PreprocessConfig(dataset="hh-rlhf", input=args.source, out=str(data), seed=args.seed,
                                        test_fraction=0.2), progress=False)
        train, test = pd.read_parquet(data / "train.parquet"), pd.read_parquet(data / "test.parquet")
        if args.max_pairs is not None:
            train = train.iloc[:args.max_pairs].reset_index(drop=True)
        kfold = None
        if args.kfold is not None:
            kfold = KFoldOptions(folds=args.kfold, base_model=args.base_model or "", config=args.kfold_config,
                                 seed=args.seed)
        frame, planted = plant_faults(train, test, seed=args.seed)
        frame.to_parquet(Path(tmp) / "planted.parquet")
        result = run_audit(AuditOptions(data=str(Path(tmp) / "planted.parquet"), test=str(data / "test.parquet"),
                                        reward_model=args.reward_model, tokenizer=args.tokenizer,
                                        kfold=kfold, out=str(Path(tmp) / "audit")))
        summary, flagged = _read_outputs(Path(result.out))
    print(f"{len(train)} train pairs, {len(test)} test pairs -> planted file of {len(frame)} rows")
    print(f"{'check':16} {'planted':>8} {'flagged':>8} {'recall':>7} {'precision':>9}")
    for check, m in measure(summary, flagged, planted).items():
        print(f"{check:16} {m['planted']:8d} {m['flagged']:8d} {m['recall']:7.3f} {m['precision']:9.3f}")
    if args.reward_model is None and args.kfold is None:
        print("label_error      not measured (needs --reward-model or --kfold)")
    before = length_bias([len(str(r[-1]['content'])) for r in train['chosen']],
                         [len(str(r[-1]['content'])) for r in train['rejected']])
    for unit, bias in summary["length_bias"].items():
        print(f"length bias ({unit}): chosen longer in {bias['longer_share_of_unequal']:.3f} of unequal pairs "
              f"(before planting, chars: {before['longer_share_of_unequal']:.3f}); flagged biased: {bias['biased']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
