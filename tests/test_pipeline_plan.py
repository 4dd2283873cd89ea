"""``alignctl run --dry-run``: the order, which stages run side by side, an estimate from earlier
manifests, and a quick answer on a warm cache."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from alignctl.pipeline.cache import artifact_dir, stage_keys
from alignctl.pipeline.manifest import write_manifest
from alignctl.pipeline.ownership import mark_owned
from alignctl.pipeline.runner import load, run_pipeline
from alignctl.pipeline.schedule import dry_run_states, plan_lines
from alignctl.tracking import duration_text
from conftest import REPO_ROOT, run_cli

PIPELINE = """
workdir: work
stages:
  data:
    kind: preprocess
    cpu_share: 0.5
    config: {dataset: arith, seed: 0, arith: {num_train: 20, num_test: 5, num_sft: 20, num_pref: 5}}
  other:
    kind: preprocess
    cpu_share: 0.5
    config: {dataset: arith, seed: 1, arith: {num_train: 10, num_test: 5, num_sft: 0, num_pref: 0}}
  model:
    kind: init-model
    config: {tokenizer_from: ["${data}/sft_train.parquet"], tokenizer_kind: char, hidden: 32, layers: 1}
"""


def _wall(outcome) -> float:
    return json.loads((outcome.path / "manifest.json").read_text())["wall_time_s"]


def test_dry_run_shows_order_side_by_side_and_an_estimate_from_earlier_manifests(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    first = {o.name: o for o in run_pipeline(load(path, []), sequential=True)}
    changed = load(path, ["data.seed=5", "other.seed=6"])  # all three stale: their earlier manifests remain
    outcomes = run_pipeline(changed, dry_run=True)
    assert dry_run_states(outcomes) == {"data": "stale", "other": "stale", "model": "stale"}
    lines = plan_lines(changed, dry_run_states(outcomes), cores=2, sequential=False, width=300)
    assert lines[0] == f"dry run on 2 cores: 3 stages, 0 cached, 3 to run ({path})"
    rows = {line.split()[1]: line.split() for line in lines[2:5]}
    assert [line.split()[1] for line in lines[2:5]] == ["data", "other", "model"]  # run order
    assert rows["data"][-1] == "other" and rows["other"][-1] == "data"  # one core each, side by side
    assert rows["model"][4] == "2" and rows["model"][-1] == duration_text(_wall(first["model"]))  # alone
    # by hand: data and other together (the longer of the two), then model after data
    data, other, model = (_wall(first[n]) for n in ("data", "other", "model"))
    total = max(data + model, other)
    assert lines[-1] == f"estimate: {duration_text(total)} (from the stages' earlier manifests in the workdir)"
    one_at_a_time = plan_lines(changed, dry_run_states(outcomes), cores=2, sequential=True)
    assert one_at_a_time[-1].startswith(f"estimate: {duration_text(data + other + model)} ")
    narrow = plan_lines(changed, dry_run_states(outcomes), cores=2, sequential=False, width=80)
    assert all(len(line) <= 80 for line in narrow) and narrow[1:4] == lines[1:4]


def test_dry_run_of_a_fresh_workdir_says_there_is_no_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")  # lines are cut to the terminal's width, which differs between runners
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    result = run_cli("run", str(path), "--dry-run")
    assert result.code == 0, result.stderr
    assert "estimate: unknown (no earlier manifests in the workdir; 'beside' assumes equal stage times)" in \
        result.stdout
    assert not (tmp_path / "work").exists()


def _warm_quickstart(workdir: Path) -> None:
    """Every quickstart stage complete in ``workdir``: what the cache reads is a manifest recording the
    stage's key, so that is what is written (the stages' own 20 minutes are not this test's subject)."""
    spec = load(REPO_ROOT / "pipelines" / "quickstart.yaml", [f"workdir={workdir}"])
    workdir.mkdir(parents=True)
    mark_owned(workdir, "pipeline workdir")
    for name, key in stage_keys(spec).items():
        folder = artifact_dir(spec, name, key)
        folder.mkdir()
        write_manifest(folder, stage=spec.stages[name].kind, config={}, key=key, metrics={}, wall_time_s=60.0)


def test_quickstart_dry_run_on_a_warm_cache_takes_under_5_s(tmp_path: Path):
    workdir = tmp_path / "work"
    _warm_quickstart(workdir)
    argv = [sys.executable, "-m", "alignctl", "run", str(REPO_ROOT / "pipelines" / "quickstart.yaml"), "--dry-run",
            f"workdir={workdir}"]
    subprocess.run(argv, capture_output=True, timeout=120)  # warms the OS file cache (imports)
    # The process's own CPU time, not the wall clock: on a CI machine shared with other jobs the wall
    # clock measures the neighbours (on an idle 2-core machine the two are within 0.1 s: about 2 s).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert result.returncode == 0, result.stderr
    assert "12 stages, 12 cached, 0 to run" in result.stdout
    assert seconds < 5.0, seconds


def test_config_mistakes_of_every_stage_come_in_one_pass(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    result = run_cli("run", str(path), "--dry-run", "data.arith.num_trian=3", "model.hiden=3", "other.seed=x")
    assert result.code == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert "stage 'data'" in lines[0] and "'arith.num_trian'" in lines[0]
    assert "stage 'other'" in lines[1] and "'seed'" in lines[1]  # run order: data, other, model
    assert "stage 'model'" in lines[2] and "'hiden'" in lines[2]
