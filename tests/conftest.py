"""Shared test fixtures: paths to the shared data and an in-process CLI runner."""

from __future__ import annotations

import os

# One torch thread per process: tests run beside Ray workers and each other, and on 2 cores a second
# intra-op thread only adds spin-wait contention (measured 3-10x slower steps under load).
# Set before torch is imported anywhere so it takes effect; Ray workers inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Checkpoints are signed with a per-installation key (docs/security.md): tests get their own
# installation folder instead of creating ~/.config/alignctl/checkpoint.key on the machine.
os.environ.setdefault("ALIGNCTL_HOME", os.path.join(__import__("tempfile").mkdtemp(prefix="alignctl-home-")))

import contextlib
import io
import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run ``alignctl ARGS`` in-process through the real entry point (exit codes included)."""
    from alignctl.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


_RAY_ADDRESS_AT_START = os.environ.get("RAY_ADDRESS")


@pytest.fixture(scope="module", autouse=True)
def _no_ray_session_outlives_its_test_file() -> Iterator[None]:
    """Each test file starts without a Ray connection or a RAY_ADDRESS another file left behind, so a
    file passes in any order and beside any other (pytest-xdist's ``--dist loadfile`` deals files to
    workers as they free up): a placement test once took the join-a-cluster path because an earlier
    file in its worker had left Ray connected."""
    yield
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        from alignctl.workers.ray_session import shutdown_ray

        shutdown_ray()
    if _RAY_ADDRESS_AT_START is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = _RAY_ADDRESS_AT_START


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"needs the shared data folder at {SHARED_DATA}")
    return SHARED_DATA


def assert_user_error(result: CliResult, *needles: str) -> None:
    """Exit status 2, exactly one line on stderr naming every needle, and no traceback."""
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _shared_tool_model(tmp_path_factory: pytest.TempPathFactory, name: str, **kwargs: object) -> dict[str, Path]:
    """A tiny model fitted to tool-use traces (tests/tool_helpers.py), built once per test run: under
    pytest-xdist the worker that comes first builds it in the run's shared temp folder (the parent of
    each worker's own) while the others wait on a file lock, instead of each fitting its own (~80 s)."""
    from filelock import FileLock
    from tool_helpers import make_tool_model

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root, complete = shared / f"{name}-shared", shared / f"{name}-shared.complete"
    with FileLock(str(shared / f"{name}-shared.lock")):
        if not complete.exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-built folder of a worker that crashed
            built = make_tool_model(root, **kwargs)
            complete.write_text(json.dumps({k: str(v) for k, v in built.items()}), encoding="utf-8")
    return {k: Path(v) for k, v in json.loads(complete.read_text(encoding="utf-8")).items()}


@pytest.fixture(scope="session")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _shared_tool_model(tmp_path_factory, "tool-model")


@pytest.fixture(scope="session")
def tool_model_64(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same traces on a model with head_dim 64, which vLLM's CPU attention kernel takes (not 16)."""
    return _shared_tool_model(tmp_path_factory, "tool-model-64", hidden=128, heads=2)


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group (a file store, no port), for code that needs torch.distributed
    (fully_shard); kept when another test of this process already made one."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
