"""Shared helpers for the side-by-side benchmark scripts.

Every benchmark compares "ours" with a "baseline" on the same machine and the same work, prints a
small table with the ratio, and optionally writes a JSON record::

    {"name": ..., "ours": float, "baseline": float, "ratio": float, "unit": str,
     "higher_is_better": bool, "setup": {...}}

``ratio`` is always expressed so that > 1 means "ours is better": ours / baseline when higher is
better (throughput), baseline / ours when lower is better (latency).

API (kept stable; other benchmark scripts import it):

    parse_bench_args(description, extra=None) -> argparse.Namespace(quick: bool, json: str | None, threads: int | None)
    set_threads(args.threads, default=None) -> int | None     # torch.set_num_threads when given
    time_call(fn, warmup=1, repeats=3) -> list[float]          # seconds per call
    time_interleaved({name: fn}, warmup=1, repeats=3) -> {name: {"wall": [...], "cpu": [...]}}
    summarize(times) -> dict(median, mean, min, max, n)
    report(name, ours, baseline, unit, setup, higher_is_better=True, json_path=None) -> dict
    smollm2_config(layers) -> transformers.LlamaConfig   # SmolLM2-135M's shape with `layers` blocks
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def smollm2_config(layers: int) -> Any:
    """SmolLM2-135M-Instruct's shape (hidden 576, 9 query / 3 kv heads, vocab 49152, tied embeddings) with
    ``layers`` blocks (30 in the real model); ``num_labels=1`` for the score and value heads. The cost of
    a pass does not depend on the weights, so the benchmarks build it with random ones."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                       tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, num_labels=1)


DIGIT_REWARD = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n")


def arith_prompts(root: Path, num_train: int) -> Path:
    """Arith prompts (and the SFT/preference splits the tiny tokenizer is trained on) under ``root/arith``."""
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess

    data = root / "arith"
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), seed=0,
                                    arith=ArithConfig(num_train=num_train, num_test=16, num_sft=64, num_pref=64)),
                   progress=False)
    return data


def tiny_model_with_digit_reward(root: Path, data: Path, hidden: int, layers: int) -> dict[str, Path]:
    """A random char-level Llama on ``data``'s text and a dense reward (the share of digits: a random
    model's responses get varied scores), as RL assets."""
    from alignctl.models.tiny import init_model

    model = root / "model"
    init_model(out=model, tokenizer_from=[data / "sft_train.parquet", data / "train.parquet"], hidden=hidden,
               layers=layers, tokenizer_kind="char", seed=0)
    reward = root / "digits.py"
    reward.write_text(DIGIT_REWARD)
    return {"data": data, "model": model, "reward": reward}


def parse_bench_args(description: str, argv: Sequence[str] | None = None,
                     extra: Callable[[argparse.ArgumentParser], Any] | None = None) -> argparse.Namespace:
    """Common flags: ``--quick`` (smaller workload for smoke runs) and ``--json OUT``; ``extra`` adds a
    script's own."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--quick", action="store_true", help="small workload (smoke run, CI)")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the result as JSON to OUT")
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N", help="torch intra-op threads (default: the script's choice)"
    )
    return parser.parse_args(argv)


def set_threads(requested: int | None, default: int | None = None) -> int | None:
    """Apply ``--threads`` (or the script's default) to torch; returns what was set (None = untouched).

    On a shared machine, one intra-op thread keeps a descheduled worker thread from stalling
    every parallel region, which otherwise penalises code made of many small kernels."""
    threads = requested if requested is not None else default
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return threads


def time_call(fn: Callable[[], Any], warmup: int = 1, repeats: int = 3) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def time_interleaved(
    fns: dict[str, Callable[[], Any]], warmup: int = 1, repeats: int = 3
) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds per call of several candidates, run in turn each repeat
    (A B A B ..., not A A B B) so a load change on a shared machine hits all of them alike.
    CPU time (``time.process_time``) is the less contention-sensitive of the two."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            out[name]["cpu"].append(time.process_time() - cpu)
            out[name]["wall"].append(time.perf_counter() - wall)
    return out


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median is the headline number: robust to a noisy neighbour stealing one repeat."""
    return {
        "median": statistics.median(times),
        "mean": statistics.fmean(times),
        "min": min(times),
        "max": max(times),
        "n": float(len(times)),
    }


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (the setup block of every JSON record)."""
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # a benchmark that does not use torch still reports
        pass
    return info


def _ratio(ours: float, baseline: float, higher_is_better: bool) -> float:
    num, den = (ours, baseline) if higher_is_better else (baseline, ours)
    return num / den if den else float("inf")


def report(
    name: str,
    ours: float,
    baseline: float,
    unit: str,
    setup: dict[str, Any],
    higher_is_better: bool = True,
    json_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Print a rich table (ours, baseline, ratio) and write the JSON record when asked."""
    ratio = _ratio(ours, baseline, higher_is_better)
    record: dict[str, Any] = {
        "name": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "setup": {**machine_info(), **setup},
    }
    _print_table(record)
    if json_path is not None:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return record


def _print_table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    better = "higher" if record["higher_is_better"] else "lower"
    table = Table(title=f"{record['name']} ({record['unit']}, {better} is better)")
    table.add_column("ours", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("ratio (>1 = ours better)", justify="right")
    table.add_row(f"{record['ours']:.4g}", f"{record['baseline']:.4g}", f"{record['ratio']:.2f}x")
    console = Console()
    console.print(table)
    console.print("setup: " + ", ".join(f"{k}={v}" for k, v in record["setup"].items()))
