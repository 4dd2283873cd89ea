"""Shared by the python tool's tests: the bubblewrap sandbox, or a skip where it cannot run (a failure
in CI, CI=1, where scripts/setup.sh --dev installs bubblewrap: no sandbox test may be skipped there)."""

from __future__ import annotations

import os

import pytest


def bwrap_or_skip() -> None:
    from alignctl.tools.bwrap import isolation_problem

    problem = isolation_problem()
    if problem:
        message = f"the bubblewrap sandbox cannot run here: {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
