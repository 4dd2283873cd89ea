"""``bf16_if_native``: bf16 only where the hardware multiplies bf16 natively, float32 elsewhere.

The reference for "native" is independent of the code under test: the CPU flags the kernel lists in
/proc/cpuinfo (avx512_bf16, amx_tile, amx_bf16), not torch's CPUID probes that ``native_bf16`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alignctl.device import BF16_IF_NATIVE, bf16_if_native, cuda_available, native_bf16


def _cpuinfo_has_bf16() -> bool:
    text = Path("/proc/cpuinfo").read_text()
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return bool(flags & {"avx512_bf16", "amx_tile", "amx_bf16"})


needs_cpuinfo = pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="needs Linux /proc/cpuinfo")


@needs_cpuinfo
def test_native_bf16_on_this_cpu_follows_the_kernels_cpu_flags() -> None:
    assert native_bf16("cpu") == _cpuinfo_has_bf16()
    expected = "bf16" if _cpuinfo_has_bf16() else "fp32"
    assert bf16_if_native(BF16_IF_NATIVE, "cpu") == expected


def test_other_precisions_pass_unchanged() -> None:
    for value in ("bf16", "fp32", "fp16", "auto", "float32"):
        assert bf16_if_native(value, "cpu") == value


@pytest.mark.skipif(cuda_available(), reason="checks the fallback on a machine without CUDA")
def test_a_cuda_device_without_cuda_falls_back_to_the_settings_own_name() -> None:
    assert not native_bf16("cuda:0")
    assert bf16_if_native(BF16_IF_NATIVE, "cuda") == "fp32"
    assert bf16_if_native(BF16_IF_NATIVE, "cuda:1", fallback="float32") == "float32"


@needs_cpuinfo
@pytest.mark.skipif(cuda_available(), reason="the stage would run on the GPU")
def test_train_rm_records_the_precision_it_resolved_to(tmp_path: Path) -> None:
    """train-rm with trainer.precision=bf16_if_native on this CPU: TRL gets bf16 exactly when the
    CPU flags list bf16 instructions, and the manifest's train/bf16 says which ran."""
    from alignctl.trainers.rm_trainer import run_train_rm
    from alignctl.trainers.sft_common import resolve_precision
    from tests.test_reward_model import rm_config
    from tests.test_sft import make_arith_setup

    assert resolve_precision(BF16_IF_NATIVE) == {"bf16": _cpuinfo_has_bf16(), "fp16": False}
    data, model = make_arith_setup(tmp_path / "setup", num_pref=16, num_test=4)
    cfg = rm_config(model, data / "pref_train.parquet", data / "pref_test.parquet", tmp_path / "rm",
                    "trainer.micro_batch_size=4", "trainer.max_steps=1", f"trainer.precision={BF16_IF_NATIVE}")
    result = run_train_rm(cfg, progress=False)
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["config"]["trainer"]["precision"] == BF16_IF_NATIVE
    assert manifest["metrics"]["train/bf16"] == float(_cpuinfo_has_bf16())


def test_eval_scores_under_the_resolved_precision_and_keys_reuse_by_it() -> None:
    """eval's rm_precision=bf16_if_native is float32 or bf16 by the device, and the reuse key of the
    scores is that of the precision that ran, so a cache written by one is read by the other's twin."""
    from alignctl.config.eval import EvalConfig
    from alignctl.eval.evaluation import scorer_key, scoring_precision

    native = EvalConfig(policy="p", prompts="x.parquet", rm_precision=BF16_IF_NATIVE)
    resolved = "bf16" if native_bf16("cpu") else "float32"
    assert scoring_precision(native, "cpu") == resolved
    twin = EvalConfig(policy="p", prompts="x.parquet", rm_precision=resolved)
    other = EvalConfig(policy="p", prompts="x.parquet", rm_precision="bf16" if resolved == "float32" else "float32")
    assert scorer_key(native, "rm", "cpu") == scorer_key(twin, "rm", "cpu") != scorer_key(other, "rm", "cpu")


@needs_cpuinfo
@pytest.mark.skipif(cuda_available(), reason="checks the CPU's note")
def test_plain_bf16_on_a_cpu_without_bf16_instructions_prints_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    from alignctl.trainers.sft_common import resolve_precision

    assert resolve_precision("bf16") == {"bf16": True, "fp16": False}  # what was asked for still runs
    note = capsys.readouterr().out
    assert ("bf16_if_native picks fp32" in note) == (not _cpuinfo_has_bf16())
    assert resolve_precision("fp32") == {"bf16": False, "fp16": False}
    assert capsys.readouterr().out == ""
