"""Plugins (``algorithm.plugins`` and ``alignctl.plugins`` entry points) and the trackers, end to
end: one real two-worker GRPO run whose policy loss comes from a plugin module that only the
controller's Python path can see, logging to jsonl, TensorBoard and an offline wandb run, with
sampled validation (best@N / maj@N). The unit tests cover plugin loading and its errors."""

from __future__ import annotations

import json
import struct
import sys
import textwrap
from pathlib import Path

import pytest

from alignctl.algos import POLICY_LOSSES
from alignctl.errors import UserError
from alignctl.plugins import import_roots, load_plugins, normalize_plugins, where_plugins_come_from
from alignctl.trainers.estimators import ADV_ESTIMATORS
from doc_blocks import python_file_block
from rl_helpers import make_assets, read_metrics, rl_config

# A loss whose value is known without running the model: 7.25 per valid token, aggregated with the
# mini-batch's global token count, so the micro-batch (and worker) shares sum to exactly 7.25.
PLUGIN_LOSS = '''
import torch
from alignctl.algos import agg_loss, register_policy_loss


@register_policy_loss("constant_7_25")
def constant_loss(old_log_prob, log_prob, advantages, response_mask, *, loss_agg_mode, global_num_tokens=None,
                  global_num_seqs=None, norm_length=None, **_clip):
    tokens = torch.full_like(log_prob, 7.25) + 0.0 * log_prob  # keeps the graph: backward runs
    loss = agg_loss(tokens, response_mask, "token-mean", global_num_tokens=global_num_tokens)
    zero = torch.zeros((), dtype=log_prob.dtype)
    return loss, {"pg_clipfrac": zero, "pg_clipfrac_lower": zero, "ppo_kl": zero}
'''

ESTIMATOR_PLUGIN = '''
from alignctl.trainers.estimators import ADV_ESTIMATORS, register_adv_estimator

register_adv_estimator("grpo_from_file", min_group_size=2)(ADV_ESTIMATORS.get("grpo").fn)
'''


def test_module_names_and_files_are_normalized_with_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("x = 1\n")
    assert normalize_plugins(["mine.py", "pkg.sub"]) == [str(tmp_path / "mine.py"), "pkg.sub"]
    with pytest.raises(UserError, match=r"key 'algorithm.plugins': plugin file 'gone.py' not found"):
        normalize_plugins(["gone.py"])
    with pytest.raises(UserError, match="neither a .py file nor a module name"):
        normalize_plugins(["not a module"])
    with pytest.raises(UserError, match=r"no module named 'no_such_plugin_xyz'"):
        load_plugins(["no_such_plugin_xyz"])
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UserError, match=r"importing plugin file .*broken.py failed: SyntaxError"):
        load_plugins(["broken.py"])
    (tmp_path / "needs.py").write_text("import not_installed_dependency_xyz\n")
    with pytest.raises(UserError, match=r"importing plugin file .*needs.py failed: ModuleNotFoundError"):
        load_plugins(["needs.py"])


def test_a_file_plugin_registers_once_and_the_config_uses_it(tmp_path):
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    path = tmp_path / "estimators.py"
    path.write_text(ESTIMATOR_PLUGIN)
    flags = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "actor_rollout_ref.rollout.n": 2,
             "algorithm.adv_estimator": "grpo_from_file", "algorithm.plugins": [str(path)]}
    try:
        cfg = load_config(RLConfig, None, [], flags=flags)
        load_config(RLConfig, None, [], flags=flags)  # a second config in the same process: no double registration
        assert cfg.algorithm.plugins == [str(path)] and "grpo_from_file" in ADV_ESTIMATORS
    finally:
        if "grpo_from_file" in ADV_ESTIMATORS:
            ADV_ESTIMATORS.unregister("grpo_from_file")


def test_unknown_names_say_where_plugins_are_looked_up():
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    flags = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"],
             "actor_rollout_ref.actor.policy_loss.loss_mode": "mine"}
    with pytest.raises(UserError) as info:
        load_config(RLConfig, None, [], flags=flags)
    message = str(info.value)
    assert "got 'mine'" in message and "vanilla" in message and "\n" not in message
    assert "'algorithm.plugins'" in message and "'alignctl.plugins'" in message


def test_installed_entry_points_are_loaded(tmp_path, monkeypatch):
    """A real installed distribution (a .dist-info folder on sys.path) declaring the entry point."""
    site = tmp_path / "site"
    (site / "ep_losses_pkg").mkdir(parents=True)
    (site / "ep_losses_pkg" / "__init__.py").write_text(PLUGIN_LOSS.replace("constant_7_25", "from_entry_point"))
    info = site / "ep_losses_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-losses-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[alignctl.plugins]\nlosses = ep_losses_pkg\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        load_plugins([])
        assert "from_entry_point" in POLICY_LOSSES
        assert "losses = ep_losses_pkg" in where_plugins_come_from([])
    finally:
        POLICY_LOSSES.unregister("from_entry_point")
        sys.modules.pop("ep_losses_pkg", None)


def test_import_roots_are_the_folders_holding_module_plugins(tmp_path, monkeypatch):
    (tmp_path / "flat_plugin_mod.py").write_text("")
    (tmp_path / "pkg_plugin_x").mkdir()
    (tmp_path / "pkg_plugin_x" / "__init__.py").write_text("")
    (tmp_path / "pkg_plugin_x" / "losses.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_roots(["flat_plugin_mod", "pkg_plugin_x.losses", str(tmp_path / "f.py")]) == [str(tmp_path)]


# ------------------------------------------------------------------------------ one real run


def wandb_history(run_dir: Path) -> list[dict[str, float]]:
    """History rows of the offline wandb run under ``run_dir/wandb``. The .wandb file is a LevelDB-
    style log (32 KiB blocks of chunks: crc32 u32, length u16, type u8) of protobuf Records after a
    7-byte header; wandb 0.31 no longer ships a Python reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, record, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        record += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            parsed = pb.Record()
            parsed.ParseFromString(record)
            record = b""
            if parsed.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in parsed.history.item})
    return rows


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
    import ray

    from alignctl.trainers.rl_trainer import RLTrainer

    tmp = tmp_path_factory.mktemp("plugins")
    assets = make_assets(tmp / "assets")
    plugin_dir = tmp / "my_code"  # on the controller's path only: workers start elsewhere
    plugin_dir.mkdir()
    (plugin_dir / "my_alignctl_losses.py").write_text(textwrap.dedent(PLUGIN_LOSS))
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(plugin_dir))
    patch.setenv("WANDB_MODE", "offline")
    patch.setenv("WANDB_SILENT", "true")
    run_dir = tmp / "run"
    cfg = rl_config(assets, run_dir, "algorithm.plugins=[my_alignctl_losses]", "algorithm.adv_estimator=grpo",
                    "actor_rollout_ref.actor.policy_loss.loss_mode=constant_7_25", "trainer.n_gpus_per_node=2",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                    "trainer.logger=[jsonl,tensorboard,wandb]",
                    f"data.val_files=[{assets['data'] / 'test.parquet'}]", "data.max_val_samples=6",
                    "actor_rollout_ref.rollout.val_kwargs.n=3", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
    try:
        RLTrainer(cfg).fit()
    finally:
        ray.shutdown()
        patch.undo()
        sys.modules.pop("my_alignctl_losses", None)
        if "constant_7_25" in POLICY_LOSSES:
            POLICY_LOSSES.unregister("constant_7_25")
    return {"run_dir": run_dir, "rows": read_metrics(run_dir)}


@pytest.mark.slow
def test_a_plugin_loss_runs_inside_every_worker(plugin_run):
    """Two workers x two micro-batches each: only the plugin gives pg_loss == 7.25 exactly."""
    rows = plugin_run["rows"]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["actor/pg_loss"] == pytest.approx(7.25, abs=1e-5)
        assert row["actor/grad_norm"] == pytest.approx(0.0, abs=1e-6)  # the constant has no gradient


@pytest.mark.slow
def test_sampled_validation_reports_best_and_majority(plugin_run):
    last = [r for r in plugin_run["rows"] if "val-core/arith/acc/mean@3" in r][-1]
    mean, best, maj = (last[f"val-core/arith/acc/{k}@3"] for k in ("mean", "best", "maj"))
    assert 0.0 <= mean <= best <= 1.0 and 0.0 <= maj <= best


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_metrics(plugin_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(plugin_run["run_dir"] / "tensorboard"))
    acc.Reload()
    jsonl = {r["step"]: r for r in plugin_run["rows"] if "actor/pg_loss" in r}
    events = acc.Scalars("actor/pg_loss")
    assert [e.step for e in events] == [1, 2]
    for event in events:
        assert event.value == pytest.approx(jsonl[event.step]["actor/pg_loss"], rel=1e-6)
    assert "critic/score/mean" in acc.Tags()["scalars"]


@pytest.mark.slow
def test_an_offline_wandb_run_in_the_run_folder_holds_the_metrics(plugin_run):
    history = wandb_history(plugin_run["run_dir"])
    jsonl = {r["step"]: r for r in plugin_run["rows"]}
    logged = {row["_step"]: row for row in history}
    assert set(logged) == set(jsonl)
    for step, row in logged.items():
        for key in ("actor/pg_loss", "critic/score/mean"):
            if key in jsonl[step]:
                assert row[key] == pytest.approx(jsonl[step][key], rel=1e-6), (step, key)
    assert not (Path.cwd() / "wandb").exists()  # wandb writes into the run folder, not the current one


# ------------------------------------------------------------------------------ a plugin estimator


@pytest.fixture(scope="module")
def estimator_run(tmp_path_factory):
    """docs/customize.md's scaled_value_baseline, a module on the controller's path only, in a real
    PPO-style run: it declares a critic (so the critic role starts in a Ray worker, which imports
    the plugin to validate its config) and reads its own option from algorithm.estimator_kwargs."""
    import ray

    from alignctl.trainers.rl_trainer import RLTrainer

    tmp = tmp_path_factory.mktemp("estimator_plugin")
    assets = make_assets(tmp / "assets")
    plugin_dir = tmp / "my_code"
    plugin_dir.mkdir()
    (plugin_dir / "my_estimators.py").write_text(python_file_block("customize.md", "my_estimators.py"))
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(plugin_dir))
    run_dir = tmp / "run"
    try:
        cfg = rl_config(assets, run_dir, "algorithm.plugins=[my_estimators]",
                        "algorithm.adv_estimator=scaled_value_baseline", "algorithm.estimator_kwargs.scale=2.5")
        assert cfg.use_critic and cfg.roles == ("actor", "critic")
        result = RLTrainer(cfg).fit()
    finally:
        ray.shutdown()
        patch.undo()
        sys.modules.pop("my_estimators", None)
        if "scaled_value_baseline" in ADV_ESTIMATORS:
            ADV_ESTIMATORS.unregister("scaled_value_baseline")
    return {"run_dir": run_dir, "rows": read_metrics(run_dir), "result": result}


@pytest.mark.slow
def test_a_plugin_estimator_gets_a_critic_and_reads_its_own_option(estimator_run):
    """Advantages are 2.5 x (returns - values) token by token, so their means over the response
    tokens are too: only the plugin, fed the critic's values and scale=2.5, gives that."""
    rows = [r for r in estimator_run["rows"] if "critic/advantages/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["critic/vf_loss"] > 0  # the critic trained on the plugin's returns
        expected = 2.5 * (row["critic/returns/mean"] - row["critic/values/mean"])
        assert row["critic/advantages/mean"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    # The value head starts at zero; after the first critic update the values the plugin read are not.
    assert rows[0]["critic/values/mean"] == 0.0 and rows[1]["critic/values/mean"] != 0.0
    written = (estimator_run["run_dir"] / "config.yaml").read_text()
    assert "estimator_kwargs:\n    scale: 2.5" in written
    assert estimator_run["result"].steps == 2
