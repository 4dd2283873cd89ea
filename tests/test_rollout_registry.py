"""Rollout engines as registry entries: validation asks the entry's capabilities, a plugin file adds
an engine, and no config check names an engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.rollout import ROLLOUT_ENGINES, EngineCapabilities, EngineEntry, engine_entry
from rl_helpers import make_assets, rl_config

PLUGIN = '''
from alignctl.rollout import EngineCapabilities, EngineEntry, register_rollout_engine
from alignctl.rollout.hf_engine import HFRolloutEngine


class PlainEngine(HFRolloutEngine):
    """The hf engine under another name that declares fewer capabilities."""

    name = "plain"


register_rollout_engine(EngineEntry("plain", f"{__name__}:PlainEngine",
                                    EngineCapabilities(trainer_precision=True, multi_turn=False, lora=False)))
'''


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("registry"), num_train=8, num_test=4)


@pytest.fixture
def plugin(tmp_path: Path):
    path = tmp_path / "plain_engine.py"
    path.write_text(PLUGIN)
    yield path
    ROLLOUT_ENGINES.pop("plain", None)  # other test files of this process see only the built-in engines


def test_an_unknown_engine_is_one_line_naming_the_key(assets, tmp_path) -> None:
    with pytest.raises(UserError, match=r"key 'actor_rollout_ref.rollout.name': unknown rollout engine 'sglang'; "
                                        r"expected one of: hf, vllm"):
        rl_config(assets, tmp_path / "run", "actor_rollout_ref.rollout.name=sglang").validate()


def test_a_plugin_engine_validates_and_its_capabilities_are_checked(assets, tmp_path, plugin) -> None:
    base = [f"algorithm.plugins=[{plugin}]", "actor_rollout_ref.rollout.name=plain"]
    rl_config(assets, tmp_path / "run", *base).validate()
    assert engine_entry("plain").capabilities.multi_turn is False
    with pytest.raises(UserError, match="'plain' cannot run tool-using conversations"):
        rl_config(assets, tmp_path / "run", *base, "actor_rollout_ref.rollout.multi_turn.enable=true",
                  "actor_rollout_ref.rollout.multi_turn.tools=[calculator]").validate()
    from alignctl.workers.model_setup import check_lora_support

    cfg = rl_config(assets, tmp_path / "run", *base, "actor_rollout_ref.model.lora_rank=4",
                    "actor_rollout_ref.model.target_modules=[q_proj]")
    with pytest.raises(UserError, match="'plain' does not support LoRA"):
        check_lora_support(cfg.actor_rollout_ref)


def test_vllm_takes_its_dtype_without_an_actor_copy(assets, tmp_path) -> None:
    """rollout.dtype is a copy the actor builds only for engines with dtype_copy (hf); vllm loads its
    own weights in that dtype, so the ddp / full-fine-tuning limits of a copy do not apply."""
    assert engine_entry("vllm").capabilities.dtype_copy is False and engine_entry("hf").capabilities.dtype_copy
    rl_config(assets, tmp_path / "run", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=bfloat16",
              "actor_rollout_ref.actor.strategy=fsdp2").validate()
    with pytest.raises(UserError, match="actor.strategy=ddp"):
        rl_config(assets, tmp_path / "run", "actor_rollout_ref.rollout.dtype=bfloat16",
                  "actor_rollout_ref.actor.strategy=fsdp2").validate()


def test_a_second_registration_of_a_name_is_refused() -> None:
    from alignctl.rollout import register_rollout_engine

    with pytest.raises(ValueError, match="already registered"):
        register_rollout_engine(EngineEntry("hf", "x:Y", EngineCapabilities()))


def test_no_engine_name_is_tested_outside_the_rollout_package() -> None:
    """Engines are told apart by their entries' capabilities: no `== "hf"` / `!= "vllm"` elsewhere."""
    package = Path(__file__).parent.parent / "alignctl"
    pattern = r'(==|!=) *"(hf|vllm)"'
    found = subprocess.run(["grep", "-rnE", pattern, str(package), "--include=*.py"], capture_output=True, text=True)
    offenders = [line for line in found.stdout.splitlines() if "/alignctl/rollout/" not in line]
    assert offenders == [], offenders


def test_config_validation_does_not_import_torch() -> None:
    code = textwrap.dedent("""
        import sys
        import alignctl.config.rl
        from alignctl.rollout import engine_entry
        engine_entry("vllm")
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
