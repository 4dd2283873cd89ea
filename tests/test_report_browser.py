"""The reports in a real browser (headless Chromium over the DevTools protocol, tests/browser.py):
a GRPO and a PPO eval report, made by real tiny runs and ``run_eval``, and the audit page load with
no console error and no broken image, and lead with what they should. Screenshots are left in
$ALIGNCTL_SCREENSHOTS (default <tmp>/alignctl-screenshots) for a person to look at.

Never skipped in CI (CI=1): a missing Chromium fails there (scripts/setup.sh --dev installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import chromium_or_skip, open_page, screenshot_folder
from rl_helpers import make_assets, rl_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GRPO and a PPO run of 3 steps on the tiny model (digit-fraction reward), each evaluated
    against the model it started from; an audit of preference pairs with a finding on every row."""
    import ray

    from alignctl.audit import AuditOptions, run_audit
    from alignctl.config import load_config
    from alignctl.config.eval import EvalConfig
    from alignctl.eval import run_eval
    from alignctl.trainers.rl_factory import create_trainer
    from test_eval_models import _digit_fraction_rm

    chromium_or_skip()  # before minutes of training
    root = tmp_path_factory.mktemp("browser")
    assets = make_assets(root)
    _digit_fraction_rm(assets["model"], root / "digit_rm")  # scores a reply by its share of digits
    runs = {}
    try:
        for name, estimator in (("grpo", "grpo"), ("ppo", "gae")):
            cfg = rl_config(assets, root / name, f"algorithm.adv_estimator={estimator}", "trainer.total_training_steps=3",
                            "actor_rollout_ref.rollout.n=4", "trainer.val_before_train=true",
                            f"data.val_files=[{assets['data'] / 'test.parquet'}]")
            runs[name] = create_trainer(cfg).fit().run_dir
    finally:
        ray.shutdown()
    out = {}
    for name, judge in (("grpo", "judge_model"), ("ppo", "reward_model")):
        cfg = load_config(EvalConfig, None, [
            f"policy={runs[name] / 'actor'}", f"reference={assets['model']}", f"{judge}={root / 'digit_rm'}",
            f"prompts={assets['data'] / 'test.parquet'}", f"run={runs[name]}", f"out={root / f'eval_{name}'}",
            "max_new_tokens=16", "num_bootstrap=200"])
        run_eval(cfg, progress=False)
        out[name] = root / f"eval_{name}" / "report.html"
    pairs = str(assets["data"] / "pref_train.parquet")  # against itself: every row is a finding to summarise
    run_audit(AuditOptions(data=pairs, test=pairs, out=str(root / "audit")))
    out["audit"] = root / "audit" / "report.html"
    return out


@pytest.mark.parametrize("kind", ["grpo", "ppo", "audit"])
def test_report_loads_in_a_browser_without_errors(reports: dict[str, Path], kind: str):
    page = open_page(reports[kind])
    (screenshot_folder() / f"{kind}_report.png").write_bytes(page.screenshot)
    assert page.errors == [], page.errors
    assert page.broken_images == [], page.broken_images
    assert page.screenshot.startswith(b"\x89PNG")
    if kind == "audit":
        assert "Findings" in page.text and "test_leakage: 64 of 64 rows (100.0%)" in page.text
        return
    assert page.images >= 1  # the training curves at least
    first = page.text.split("\n")
    verdict = next(line for line in first if line.startswith(("Held-out accuracy", "No verdict")))
    # the verdict comes before any section: nothing but the title and the models' line above it
    assert first.index(verdict) <= 3, first[:6]
    assert "points [95% CI" in verdict
    if kind == "grpo":
        assert "an independent judge prefers the policy" in verdict
        assert page.text.lower().index("independent judge") < page.text.lower().index("setup")
    else:
        assert "the reward model prefers it" in verdict


def test_the_browser_check_catches_a_broken_image_and_a_script_error(tmp_path: Path):
    """The checks above can fail: a page with a missing image and a throwing script is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><title>bad</title></head><body><p>x</p>'
                   '<img alt="missing plot" src="nope.png"><script>undefined_function();</script></body></html>')
    page = open_page(bad)
    assert page.broken_images == ["missing plot"]
    assert any("undefined_function" in error for error in page.errors), page.errors
