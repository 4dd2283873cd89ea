"""The built wheel works on its own: installed in a fresh virtual environment, with no source tree
on the path, `alignctl preprocess -> init-model -> eval` writes the HTML report.

Why this fails on code that only works from a checkout: the eval and audit reports render jinja2
templates, and an editable install reads whatever the repository holds. Before the templates moved
into the package (``alignctl/resources/templates/``), they sat in the repository's ``templates/``
folder, the wheel carried none of them (pyproject ships ``alignctl/resources/**``), and
``alignctl eval`` from the installed wheel died looking for ``<site-packages>/../templates``.

No network: the wheel is built with the setuptools already in this venv (--no-build-isolation,
--no-index) and installed with --no-deps --no-index. The dependencies (torch, transformers, ...)
come from this venv's site-packages through a plain path line in a ``.pth`` file of the fresh
venv; site does not process the ``.pth`` files of a directory added that way, so the editable
install of alignctl living there stays inactive (checked: ``import alignctl`` fails before the
wheel is installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

TEMPLATES = ("report.html.j2", "report.md.j2", "audit.html.j2")


def _run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _build_wheel(tmp_path: Path, env: dict[str, str]) -> Path:
    """Build from a copy of what the wheel is made of, so no build/ or egg-info lands in the repo."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "alignctl", src / "alignctl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", dist, src], cwd=tmp_path, env=env)
    (wheel,) = dist.glob("alignctl-*.whl")
    return wheel


def _fresh_venv(root: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """A venv with nothing installed that sees this venv's packages but not its alignctl."""
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=root.parent, env=env)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=root.parent, env=env).stdout.strip())
    (site / "_deps_from_dev_venv.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    return python, site


def test_wheel_installed_in_a_fresh_venv_runs_preprocess_to_eval_report(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.setdefault("OMP_NUM_THREADS", "1")
    work = tmp_path / "work"  # every command runs here: outside the repository
    work.mkdir()

    wheel = _build_wheel(tmp_path, env)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = [t for t in TEMPLATES if f"alignctl/resources/templates/{t}" not in shipped]
    assert not missing, f"the wheel does not ship the report templates {missing}"

    python, site = _fresh_venv(tmp_path / "venv", env)
    probe = "import importlib.util as u; print(u.find_spec('alignctl') is None, u.find_spec('torch') is not None)"
    assert _run([python, "-c", probe], cwd=work, env=env).stdout.split() == ["True", "True"], (
        "the fresh venv must see the dependencies but not the source tree's alignctl")

    # --ignore-installed: pip sees the dev venv's editable alignctl through the .pth and must neither
    # skip the wheel because of it nor try to uninstall it.
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed",
          "--disable-pip-version-check", wheel], cwd=work, env=env)
    where = _run([python, "-c", "import alignctl; print(alignctl.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).resolve().is_relative_to(site.resolve()), where
    assert not Path(where).resolve().is_relative_to(REPO_ROOT.resolve()), where

    cli = python.parent / ("alignctl.exe" if os.name == "nt" else "alignctl")
    assert cli.is_file(), "the wheel's console script was not installed"
    _run([cli, "preprocess", "arith", "arith.num_train=16", "arith.num_test=8", "arith.num_sft=16",
          "arith.num_pref=8", "--out", "data"], cwd=work, env=env)
    _run([cli, "init-model", "--out", "model", "--tokenizer-from", "data/sft_train.parquet", "--tokenizer", "char",
          "--hidden", "32", "--layers", "1"], cwd=work, env=env)
    _run([cli, "eval", "--policy", "model", "--reference", "model", "--prompts", "data/test.parquet",
          "--out", "report", "max_prompts=4", "max_new_tokens=8"], cwd=work, env=env)

    html = (work / "report" / "report.html").read_text(encoding="utf-8")
    assert "<h1>Evaluation report</h1>" in html and "<h2>Rule accuracy</h2>" in html
    assert "Samples (4 of 4 prompts)" in html
    assert (work / "report" / "report.md").read_text(encoding="utf-8").startswith("# Evaluation report")
    assert json.loads((work / "report" / "results.json").read_text(encoding="utf-8"))["num_prompts"] == 4
