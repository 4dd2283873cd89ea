"""The config system: defaults <- YAML <- flags <- dotted overrides, and its errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from alignctl.config import load_config
from alignctl.config.core import field, iter_keys, section
from alignctl.errors import UserError
from conftest import assert_user_error, run_cli


@dataclass
class Optim:
    lr: float = field(1e-6, help="learning rate")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], help="adam betas")


@dataclass
class Actor:
    ppo_mini_batch_size: int = field(16, help="prompts per mini-batch")
    optim: Optim = section(Optim, help="optimizer")
    strategy: str = field("fsdp2", help="training backend", choices=("ddp", "fsdp2"))
    path: str | None = field(None, help="model path")
    use_kl_loss: bool = field(False, help="kl as loss")


@dataclass
class Root:
    actor: Actor = section(Actor, help="actor")
    seed: int = field(1, help="seed")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_file_flags_overrides_precedence(tmp_path):
    path = write(tmp_path, "actor:\n  optim:\n    lr: 1e-5\n  ppo_mini_batch_size: 8\nseed: 3\n")
    cfg = load_config(Root, path, ["actor.optim.lr=2e-5", "actor.optim.betas=[0.8, 0.9]"],
                      flags={"seed": 7, "actor.path": None})
    assert cfg.actor.optim.lr == 2e-5  # override beats file
    assert cfg.actor.ppo_mini_batch_size == 8  # file beats default
    assert cfg.seed == 7  # flag beats file
    assert cfg.actor.optim.betas == [0.8, 0.9]
    assert cfg.actor.path is None  # a None flag means "not given"
    assert cfg.actor.strategy == "fsdp2"


def test_yaml_scientific_notation_string_is_a_float(tmp_path):
    # YAML 1.1 (PyYAML) reads "1e-5" without a dot as a string; we accept it for float keys.
    cfg = load_config(Root, write(tmp_path, "actor:\n  optim:\n    lr: 1e-5\n"))
    assert cfg.actor.optim.lr == pytest.approx(1e-5, rel=0, abs=0)


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["actor.optim.lrr=1"], ["unknown config key 'actor.optim.lrr'", "did you mean 'actor.optim.lr'"]),
        (["actr.optim.lr=1"], ["unknown config key 'actr'", "did you mean 'actor'"]),
        (["seed=abc"], ["'seed' expected int", "'abc'"]),
        (["seed=1.5"], ["'seed' expected int"]),
        (["actor.use_kl_loss=3"], ["'actor.use_kl_loss' expected bool"]),
        (["actor.strategy=zero9"], ["'actor.strategy' expected one of ddp, fsdp2", "'zero9'"]),
        (["actor.optim.betas=[0.9, x]"], ["'actor.optim.betas[1]' expected float"]),
        (["actor.optim=3"], ["'actor.optim' expected a section"]),
        (["seed"], ["expected KEY=VALUE"]),
        (["seed.x=1"], ["'seed' expected int"]),
    ],
)
def test_override_errors_name_the_key(overrides, needles):
    with pytest.raises(UserError) as info:
        load_config(Root, None, overrides)
    for needle in needles:
        assert needle in str(info.value)
    assert "command-line override" in str(info.value) or "expected KEY=VALUE" in str(info.value)


def test_file_errors_name_the_file(tmp_path):
    bad = write(tmp_path, "actor:\n  optim: [1, 2\n")
    with pytest.raises(UserError, match=r"cfg.yaml: line \d+, column \d+ invalid YAML"):
        load_config(Root, bad)
    with pytest.raises(UserError, match="cfg.yaml: expected a mapping"):
        load_config(Root, write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(UserError, match=r"cfg.yaml: unknown config key 'actor.ppo_mini_batchsize'"):
        load_config(Root, write(tmp_path, "actor:\n  ppo_mini_batchsize: 4\n"))


def test_int_accepted_for_float_and_integral_float_for_int():
    cfg = load_config(Root, None, ["actor.optim.lr=1", "seed=4.0"])
    assert isinstance(cfg.actor.optim.lr, float) and cfg.actor.optim.lr == 1.0
    assert cfg.seed == 4 and isinstance(cfg.seed, int)


def test_iter_keys_lists_every_leaf_with_help():
    keys = {k: (t, d, h) for k, t, d, h in iter_keys(Root)}
    assert set(keys) == {"actor.ppo_mini_batch_size", "actor.optim.lr", "actor.optim.betas",
                         "actor.strategy", "actor.path", "actor.use_kl_loss", "seed"}
    assert keys["actor.optim.lr"] == ("float", 1e-6, "learning rate")


def test_cli_config_show_resolves_file_and_overrides(tmp_path):
    path = write(tmp_path, "stage: preprocess\ndataset: arith\narith:\n  max_value: 9\n")
    result = run_cli("config", "show", "--config", str(path), "seed=5")
    assert result.code == 0, result.stderr
    assert "dataset: arith" in result.stdout and "max_value: 9" in result.stdout
    assert "seed: 5" in result.stdout


def test_cli_config_errors_are_one_line_exit_2(tmp_path):
    assert_user_error(run_cli("config", "show", "--stage", "preprocess", "arith.max_valu=3"),
                      "arith.max_valu", "did you mean 'arith.max_value'")
    assert_user_error(run_cli("config", "show", "--config", str(tmp_path / "missing.yaml")),
                      "missing.yaml", "not found")
    assert_user_error(run_cli("config", "show", "--stage", "nosuchstage"), "unknown stage 'nosuchstage'")
    assert_user_error(run_cli("config", "show"), "--stage")


def test_cli_version():
    result = run_cli("--version")
    assert result.code == 0 and result.stdout.startswith("alignctl ")


def test_docs_config_reference_is_up_to_date():
    """docs/config.md is generated from the schemas; regenerate with
    `alignctl config reference --out docs/config.md` when this fails."""
    from alignctl.config.reference import render_reference
    from conftest import REPO_ROOT

    assert (REPO_ROOT / "docs" / "config.md").read_text(encoding="utf-8") == render_reference()


def test_unquoted_pipeline_references_in_a_list_override_are_read_as_meant():
    """``key=[${data}/a.parquet]`` is no YAML (``{`` opens a mapping inside a flow list): the override is
    read with each reference quoted; quoted ones, scalars and other text are as before."""
    from alignctl.config.core import parse_override

    assert parse_override("data.val_files=[${data}/test.parquet]") == (["data", "val_files"], ["${data}/test.parquet"])
    assert parse_override("f=[${data}/a.parquet, ${judge_data}/b.parquet]")[1] == \
        ["${data}/a.parquet", "${judge_data}/b.parquet"]
    assert parse_override("f=['${data}/a', \"${x}\"]")[1] == ["${data}/a", "${x}"]
    assert parse_override("f=${data}/a")[1] == "${data}/a"
    assert parse_override("f={x: [}")[1] == "{x: [}"  # unparsable and no reference: the text, as before
