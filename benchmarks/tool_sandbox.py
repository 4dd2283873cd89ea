"""Start-up cost of one python-tool call: the bubblewrap sandbox (``isolation: bwrap``) vs a plain
limited subprocess (``isolation: none``, the tool's only path before it had a sandbox), through the
tool's own interface (``run_tool``), on a snippet that does nothing but print.

Reported: median milliseconds per call of each side, interleaved (A B A B ...) so a load change on
the shared machine hits both alike; ratio < 1 means the sandbox costs more.

    python benchmarks/tool_sandbox.py [--quick] [--repeats 40] [--json OUT]
"""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, summarize, time_interleaved  # noqa: E402


def main() -> None:
    args = parse_bench_args(__doc__.split("\n\n")[0], extra=lambda p: p.add_argument(
        "--repeats", type=int, default=40, help="timed calls per side"))
    from alignctl.tools import TOOLS, run_tool
    from alignctl.tools.bwrap import isolation_problem

    problem = isolation_problem()
    if problem:
        raise SystemExit(f"cannot measure the sandbox here: {problem}")
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def one_call(isolation: str):
        tool = TOOLS.get("python").configured({"isolation": isolation})

        def run() -> None:
            result = run_tool(tool, "python", {"code": "print(1)"}, pool)
            if result.content != "1\n":
                raise SystemExit(f"isolation={isolation}: unexpected tool output {result.content!r}")
        return run

    repeats = 5 if args.quick else args.repeats
    times = time_interleaved({"bwrap": one_call("bwrap"), "none": one_call("none")}, warmup=2, repeats=repeats)
    bwrap, none = (summarize([t * 1000 for t in times[name]["wall"]]) for name in ("bwrap", "none"))
    for name, stats in (("bwrap", bwrap), ("none", none)):
        print(f"{name:>5}: median {stats['median']:.1f} ms, min {stats['min']:.1f}, max {stats['max']:.1f} "
              f"over {int(stats['n'])} calls")
    report("python tool call start-up", bwrap["median"], none["median"], "ms per call",
           {"repeats": repeats, "snippet": "print(1)"}, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
