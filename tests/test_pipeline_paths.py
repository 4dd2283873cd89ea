"""Relative paths in a pipeline file start from the file (or its ``root:``), never from the current
folder: ``alignctl status`` and ``alignctl run`` give the same answer wherever they are typed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli

# root: .. -> the project folder above pipelines/; the workdir and the tokenizer corpus are relative to it.
PIPELINE = """
root: ..
workdir: work/demo
stages:
  model:
    kind: init-model
    config: {tokenizer_from: ["corpus/text.jsonl"], tokenizer_kind: char, hidden: 32, layers: 1}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pipelines").mkdir(parents=True)
    (root / "corpus").mkdir()
    rows = [{"text": f"{a} + {b} = {a + b}"} for a in range(10) for b in range(10)]
    (root / "corpus" / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "pipelines" / "demo.yaml").write_text(PIPELINE)
    return root


def _status(result) -> dict[str, str]:
    """stage -> state from ``alignctl status`` output (one line per stage, name first)."""
    states = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "model":
            states[parts[0]] = parts[2]
    return states


def test_status_and_run_agree_from_any_current_folder(project: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    pipeline = project / "pipelines" / "demo.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    before = run_cli("status", str(pipeline))
    assert before.code == 0, before.stderr
    assert f"workdir {project / 'work' / 'demo'} does not exist yet" in before.stdout
    assert "no stage has run there" in before.stdout

    ran = run_cli("run", str(pipeline))  # the corpus is found though the current folder has none
    assert ran.code == 0, ran.stderr
    artifacts = list((project / "work" / "demo").glob("model-*"))
    assert len(artifacts) == 1 and (artifacts[0] / "manifest.json").is_file()
    assert not (elsewhere / "work").exists()  # nothing written under the current folder

    for cwd in (project, project / "pipelines", project / "corpus"):
        monkeypatch.chdir(cwd)
        relative = Path("..") / "pipelines" / "demo.yaml" if cwd != project else Path("pipelines/demo.yaml")
        status = run_cli("status", str(relative))
        assert status.code == 0, status.stderr
        assert _status(status) == {"model": "cached"}, status.stdout
        again = run_cli("run", str(relative))
        assert again.code == 0, again.stderr
        assert "cached model" in " ".join(again.stdout.split())


def test_a_command_line_workdir_starts_from_the_current_folder(project: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("run", str(project / "pipelines" / "demo.yaml"), "workdir=mine")
    assert result.code == 0, result.stderr
    assert list((tmp_path / "mine").glob("model-*")) and not (project / "work").exists()


def test_without_root_paths_start_from_the_files_folder(project: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    local = project / "corpus" / "local.yaml"
    local.write_text(PIPELINE.replace("root: ..\n", "").replace("corpus/text.jsonl", "./text.jsonl"))
    monkeypatch.chdir(tmp_path)
    result = run_cli("run", str(local))
    assert result.code == 0, result.stderr
    assert list((project / "corpus" / "work" / "demo").glob("model-*"))


def test_a_root_that_is_not_a_folder_is_one_line(project: Path):
    bad = project / "pipelines" / "bad.yaml"
    bad.write_text(PIPELINE.replace("root: ..", "root: ../nowhere"))
    assert_user_error(run_cli("status", str(bad)), "bad.yaml", "'root'", "not a folder")
