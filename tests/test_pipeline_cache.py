"""Pipeline cache semantics on cheap real stages (preprocess -> init-model -> preprocess variant).

Skip when cached; a config change re-runs that stage and everything downstream, nothing upstream;
an artifact without its manifest is never reused; two runs at once cannot corrupt the cache."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.pipeline.cache import HOLDER_FILE, workdir_lock
from alignctl.pipeline.runner import load, pipeline_status, run_pipeline
from conftest import assert_user_error, run_cli

PIPELINE = """
workdir: {workdir}
stages:
  data:
    kind: preprocess
    config: {{dataset: arith, seed: 0, arith: {{num_train: 20, num_test: 5, num_sft: 20, num_pref: 5}}}}
  model:
    kind: init-model
    config: {{tokenizer_from: ["${{data}}/sft_train.parquet"], tokenizer_kind: char, hidden: 32, layers: 1}}
  other:
    kind: preprocess
    config: {{dataset: arith, seed: 1, arith: {{num_train: 10, num_test: 5, num_sft: 0, num_pref: 0}}}}
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work"))
    return path


def _states(outcomes) -> dict[str, str]:
    return {o.name: o.state for o in outcomes}


def test_second_run_is_all_cached(pipeline):
    first = run_pipeline(load(pipeline, []))
    assert _states(first) == {"data": "ran", "model": "ran", "other": "ran"}
    second = run_pipeline(load(pipeline, []))
    # "cached" means the stage's function never ran; no wall-clock bound (timed asserts fail on slow CI machines)
    assert _states(second) == {"data": "cached", "model": "cached", "other": "cached"}
    assert [o.path for o in first] == [o.path for o in second]
    manifest = json.loads((first[1].path / "manifest.json").read_text())
    assert manifest["stage"] == "init-model" and manifest["key"] == first[1].key
    assert manifest["inputs"] == {"data": str(first[0].path)}


def test_changing_a_stage_reruns_it_and_downstream_only(pipeline):
    run_pipeline(load(pipeline, []))
    changed = run_pipeline(load(pipeline, ["data.arith.num_train=21"]))
    assert _states(changed) == {"data": "ran", "model": "ran", "other": "cached"}
    model_only = run_pipeline(load(pipeline, ["data.arith.num_train=21", "model.hidden=48"]))
    assert _states(model_only) == {"data": "cached", "model": "ran", "other": "cached"}
    # The earlier artifacts stay on disk: going back to the first config is a cache hit again.
    back = run_pipeline(load(pipeline, []))
    assert _states(back) == {"data": "cached", "model": "cached", "other": "cached"}


def test_status_reports_cached_stale_missing(pipeline):
    spec = load(pipeline, [])
    assert {s.name: s.state for s in pipeline_status(spec)} == {"data": "missing", "model": "missing", "other": "missing"}
    run_pipeline(spec, until="data")
    assert {s.name: s.state for s in pipeline_status(spec)} == {"data": "cached", "model": "missing", "other": "missing"}
    stale = load(pipeline, ["data.seed=5"])
    assert {s.name: s.state for s in pipeline_status(stale)}["data"] == "stale"


def test_artifact_without_manifest_is_never_reused(pipeline):
    outcomes = run_pipeline(load(pipeline, []))
    data_dir = outcomes[0].path
    (data_dir / "manifest.json").unlink()
    (data_dir / "junk.txt").write_text("left by a crashed run")
    again = run_pipeline(load(pipeline, []))
    assert _states(again)["data"] == "ran"
    assert not (data_dir / "junk.txt").exists() and (data_dir / "manifest.json").exists()


def test_force_reruns_stage_and_downstream(pipeline):
    run_pipeline(load(pipeline, []))
    forced = run_pipeline(load(pipeline, []), force=["data"])
    assert _states(forced) == {"data": "ran", "model": "ran", "other": "cached"}


def test_dry_run_validates_without_running(pipeline, tmp_path):
    outcomes = run_pipeline(load(pipeline, []), dry_run=True)
    assert all(o.state.startswith("planned") for o in outcomes)
    assert not (tmp_path / "work").exists()
    with pytest.raises(UserError, match=r"stage 'model'.*unknown config key 'hiden'"):
        run_pipeline(load(pipeline, ["model.hiden=3"]), dry_run=True)


def _run_in_process(path: str, queue) -> None:
    from alignctl.pipeline.runner import load as load_spec, run_pipeline as run

    queue.put({o.name: o.state for o in run(load_spec(path, []))})


def test_concurrent_runs_do_not_corrupt_the_cache(pipeline):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_run_in_process, args=(str(pipeline), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    results = [queue.get(timeout=5) for _ in procs]
    # The lock serialises the runs: one builds everything, the other then finds it all cached.
    assert sorted(tuple(sorted(set(r.values()))) for r in results) == [("cached",), ("ran",)]
    assert {s.state for s in pipeline_status(load(pipeline, []))} == {"cached"}


_TAKE_LOCK = """
import sys
from pathlib import Path
from alignctl.pipeline.cache import workdir_lock
with workdir_lock(Path(sys.argv[1])):
    print("acquired", flush=True)
"""


def test_a_second_process_waits_for_the_lock_and_names_its_holder(tmp_path):
    workdir = tmp_path / "work"
    with workdir_lock(workdir):
        assert (workdir / HOLDER_FILE).read_text() == str(os.getpid())
        waiter = subprocess.Popen([sys.executable, "-c", _TAKE_LOCK, str(workdir)], stdout=subprocess.PIPE, text=True)
        assert waiter.stdout is not None
        assert waiter.stdout.readline().strip() == f"waiting for {workdir} (locked by pid {os.getpid()})"
        time.sleep(0.5)
        assert waiter.poll() is None  # still blocked while this process holds the lock
    out, _ = waiter.communicate(timeout=120)
    assert (waiter.returncode, out.strip()) == (0, "acquired")
    assert not (workdir / HOLDER_FILE).exists()  # the holder's pid leaves with it
    with workdir_lock(workdir):  # and the lock can be taken again
        pass


def test_the_pipeline_imports_where_fcntl_does_not_exist():
    """fcntl is POSIX-only: the workdir lock goes through filelock, so alignctl.pipeline imports on
    Windows. Simulated by blocking the module before anything imports it."""
    code = "import sys\nsys.modules['fcntl'] = None\nimport alignctl.pipeline.cache, alignctl.pipeline.runner\n"
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_pipeline_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  a: {kind: preprocess, config: {dataset: arith}}\n  b: {kind: sft, config: {model: {path: '${nope}'}}}\n")
    assert_user_error(run_cli("run", str(bad), "--dry-run"), "bad.yaml", "unknown stage(s) ['nope']")
    bad.write_text("stages:\n  a: {kind: cook, config: {}}\n")
    assert_user_error(run_cli("status", str(bad)), "stage 'a'", "'kind' expected one of")
    cyc = tmp_path / "cyc.yaml"
    cyc.write_text("stages:\n  a: {kind: preprocess, config: {input: '${b}'}}\n  b: {kind: preprocess, config: {input: '${a}'}}\n")
    assert_user_error(run_cli("run", str(cyc)), "cycle")
    good = tmp_path / "good.yaml"
    good.write_text(PIPELINE.format(workdir=tmp_path / "w"))
    assert_user_error(run_cli("run", str(good), "nostage.x=1"), "nostage.x=1", "STAGE.key=value")
    assert_user_error(run_cli("run", str(good), "--until", "zzz"), "'zzz'", "no such stage")


def test_summary_headline_of_a_reward_model_lists_its_groups():
    """A train-rm headline shows held-out accuracy and margin, then the accuracy of each data.group_key value."""
    from alignctl.pipeline.summary import headline

    metrics = {"val/accuracy": 0.75, "val/margin_mean": 1.5, "val/loss": 0.4, "val/accuracy/slip": 0.5,
               "val/pairs/slip": 10.0, "val/accuracy/wrong_final": 1.0}
    assert headline("train-rm", metrics) == "val/accuracy 0.750, val/margin_mean 1.500 (by group: slip 0.500, wrong_final 1.000)"
    assert headline("train-rm", {"val/accuracy": 0.75}) == "val/accuracy 0.750"


def test_summary_headline_of_an_eval_shows_the_rule_win_rate():
    from alignctl.pipeline.summary import headline

    metrics = {"win_rate": 0.5, "judge_win_rate": 0.455, "rule_win_rate": 0.6225}
    assert headline("eval", metrics) == "judge win rate 0.455, RM win rate 0.500, rule win rate 0.623"


def test_summary_headline_of_an_sft_stage_without_held_out_data():
    """The summary shows the held-out loss when there is one, else the training loss before and after
    (an SFT stage without val_files used to show an empty headline)."""
    from alignctl.pipeline.summary import headline

    assert headline("sft", {"val/loss": 0.25, "train/loss_end": 0.5}) == "val loss 0.250"
    assert headline("sft", {"val/loss_start": 2.0, "val/loss": 0.25, "val/mean_token_accuracy": 0.5}) == \
        "val loss 2.000 -> 0.250, token acc 0.500"
    assert headline("sft", {"train/loss_start": 0.85, "train/loss_end": 0.32}) == "train loss 0.850 -> 0.320 (no val_files)"


def test_each_stage_prints_the_seeds_it_runs_with(pipeline):
    """Issue 16: a run says which seeds produced it (here the two preprocess seeds from the file)."""
    result = run_cli("run", str(pipeline), "other.seed=7")
    assert result.code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "data seeds: seed=0" in out and "other seeds: seed=7" in out
