"""An eval that takes an earlier eval's responses: with their stored scores against scoring them again.

Same process, same finished eval (``--eval DIR``, e.g. the quickstart's ``eval_ppo``: its manifest
gives the config, whose ``reuse_generations`` names the earlier eval), the sides alternating (A B A B),
each a whole :func:`alignctl.eval.runner.evaluate_rows` (generation, scoring, statistics; no files).
"ours" is the eval as configured: the reference's answers and every reward model's stored scores of
them are taken. The baseline takes the same answers from a copy of each earlier ``generations.json``
with the scores removed, so each reward model scores them again (the eval before scores were
stored). Both sides print their judge / reward-model win rates: taken scores equal fresh ones up to
the rounding of batching (bf16 under ``rm_precision=bf16``), so a verdict on a near tie may differ.
Ratio = baseline time / ours.

Run: ``python benchmarks/eval_score_reuse.py --eval DIR [--quick] [--json out.json]``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, summarize, time_interleaved  # noqa: E402

from alignctl.config.core import load_config  # noqa: E402
from alignctl.config.eval import EvalConfig  # noqa: E402
from alignctl.eval.data import load_prompt_rows  # noqa: E402
from alignctl.eval.reuse import FILE  # noqa: E402
from alignctl.eval.runner import evaluate_rows  # noqa: E402


def without_scores(source: str, folder: Path) -> str:
    """A copy of ``source``'s generations.json in ``folder`` with every stored score removed."""
    data = json.loads((Path(source) / FILE).read_text(encoding="utf-8"))
    for entry in data.values():
        entry.pop("scores", None)
    folder.mkdir(parents=True)
    (folder / FILE).write_text(json.dumps(data), encoding="utf-8")
    return str(folder)


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0], extra=lambda parser: parser.add_argument(
        "--eval", required=True, metavar="DIR", help="a finished eval that reused an earlier one"))
    set_threads(args.threads)
    config: dict[str, Any] = json.loads((Path(args.eval) / "manifest.json").read_text(encoding="utf-8"))["config"]
    if not config.get("reuse_generations"):
        raise SystemExit(f"{args.eval}: its config names no reuse_generations; nothing to compare")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stripped = [without_scores(src, Path(tmp) / f"source{i}") for i, src in enumerate(config["reuse_generations"])]
        configs = {"ours": load_config(EvalConfig, None, flags={**config, "out": None}),
                   "baseline": load_config(EvalConfig, None, flags={**config, "out": None,
                                                                    "reuse_generations": stripped})}
        rows = load_prompt_rows(configs["ours"].prompts or "", configs["ours"].prompt_key, configs["ours"].max_prompts)

        def side(name: str) -> None:
            results[name] = evaluate_rows(configs[name], rows, progress=False)

        times = time_interleaved({name: (lambda n=name: side(n)) for name in configs}, warmup=0,
                                 repeats=1 if args.quick else 2)
    setup: dict[str, Any] = {"eval": args.eval, "ours_s": times["ours"]["wall"], "baseline_s": times["baseline"]["wall"]}
    for name, res in results.items():
        setup[f"judge_win_rate/{name}"] = res.judge_win_rate
        setup[f"win_rate/{name}"] = res.win_rate
        setup[f"reused/{name}"] = sorted(res.reused_generations)
    report("eval: stored scores taken vs scored again", summarize(times["ours"]["wall"])["median"],
           summarize(times["baseline"]["wall"])["median"], "s per eval", setup, higher_is_better=False,
           json_path=args.json)


if __name__ == "__main__":
    main()
