"""train-rm's ``loss: on_track`` vs the plain Bradley-Terry loss: held-out pair accuracy after the same training.

The work is the test suite's arith reward model (tests/test_reward_model.py): one-step +/- problems on 1..9,
3000 preference pairs whose rejected answer is a slip, an off-by-one, a wrong operation or a wrong final
number, 200 held-out pairs on other questions, a tiny Llama (2 blocks of 64, a BPE tokenizer of 400 tokens
trained on the files) trained from scratch at lr 2e-3 in batches of 64 pairs. Both sides train from the same
model on the same data with the same seeds, in this process, one after the other:

- baseline: ``loss: bradley_terry`` (TRL's pairwise loss on the last-token scores);
- ours: ``loss: on_track`` with ``bt_weight: 1`` (the same pairwise loss plus the token-level on-track loss,
  alignctl/algos/on_track.py).

It prints the held-out accuracy per seed and kind of wrong answer, the mean and worst over seeds, and the ratio
of the mean accuracies (ours / baseline). The score is read at the last token on both sides, so the held-out
accuracy is measured the same way.

Run: ``python benchmarks/rm_on_track.py [--quick] [--json out.json] [--epochs N] [--seeds 0,1,2]``
(default: 20 epochs, seeds 0, 1, 2; --quick: 2 epochs of 500 pairs, seed 0).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads  # noqa: E402

LOSSES = {"baseline": "bradley_terry", "ours": "on_track"}


def build_assets(root: Path, pairs: int) -> tuple[Path, Path]:
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model

    data, model = root / "arith", root / "tiny"
    arith = ArithConfig(num_train=10, num_test=200, num_sft=10, num_pref=pairs, max_value=9, max_steps=1)
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), arith=arith), progress=False)
    init_model(out=model, tokenizer_from=sorted(data.glob("*.parquet")), tokenizer_kind="bpe", vocab_size=400,
               hidden=64, layers=2, heads=4, seed=0)
    return data, model


def train_once(data: Path, model: Path, out: Path, loss: str, epochs: int, seed: int) -> dict[str, Any]:
    from alignctl.config.core import load_config
    from alignctl.config.train_rm import RewardModelConfig
    from alignctl.trainers.rm_trainer import run_train_rm

    overrides = [f"model.path={model}", f"data.train_files=[{data / 'pref_train.parquet'}]",
                 f"data.val_files=[{data / 'pref_test.parquet'}]", f"output_dir={out}",
                 "data.group_key=extra_info.rejected_kind", "optim.lr=2e-3", "optim.warmup_ratio=0.05",
                 f"trainer.total_epochs={epochs}", "trainer.micro_batch_size=64", "trainer.logging_steps=50",
                 f"trainer.seed={seed}", "share_prompt=false", f"loss={loss}"]
    result = run_train_rm(load_config(RewardModelConfig, None, overrides), progress=False)
    return {"accuracy": result.metrics["val/accuracy"], "train_s": result.metrics["timing_s/train"],
            "kinds": {g.group: g.accuracy for g in result.groups}}


def main() -> int:
    args = parse_bench_args(__doc__.splitlines()[0], extra=lambda p: (
        p.add_argument("--epochs", type=int, default=None), p.add_argument("--seeds", default=None)))
    set_threads(args.threads, default=1)
    epochs = args.epochs or (2 if args.quick else 20)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    pairs = 500 if args.quick else 3000
    root = Path(tempfile.mkdtemp(prefix="alignctl-bench-on-track-"))
    data, model = build_assets(root, pairs)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in LOSSES}
    for seed in seeds:
        for side, loss in LOSSES.items():
            run = train_once(data, model, root / f"{side}-{seed}", loss, epochs, seed)
            runs[side].append(run)
            kinds = ", ".join(f"{k} {v:.3f}" for k, v in sorted(run["kinds"].items()))
            print(f"seed {seed} {loss:>13}: held-out accuracy {run['accuracy']:.3f} ({kinds}); "
                  f"train {run['train_s']:.1f} s", flush=True)
    summary = {side: {"mean": statistics.mean(r["accuracy"] for r in rs), "worst": min(r["accuracy"] for r in rs),
                      "train_s": statistics.mean(r["train_s"] for r in rs)} for side, rs in runs.items()}
    for side, loss in LOSSES.items():
        s = summary[side]
        print(f"{loss:>13}: mean {s['mean']:.3f}, worst {s['worst']:.3f} over seeds {seeds}; "
              f"train {s['train_s']:.1f} s per run")
    report("rm_on_track_heldout_accuracy", summary["ours"]["mean"], summary["baseline"]["mean"], "held-out accuracy",
           {"epochs": epochs, "seeds": seeds, "pairs": pairs, "summary": summary,
            "per_seed": {side: [r["accuracy"] for r in rs] for side, rs in runs.items()}},
           higher_is_better=True, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
