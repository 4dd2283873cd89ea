"""scripts/render_results.py: docs/results.md's rendered tables match benchmarks/results/*.json, a
record renders to the table written out by hand below, and what scripts/quickstart_seeds.py records
from finished stages is what the renderer reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import quickstart_seeds  # noqa: E402
import render_results  # noqa: E402


def test_the_page_is_what_the_records_render() -> None:
    assert render_results.main(["--check"]) == 0


def _row(seed: int, sft: float, grpo: float, ppo: float, wall: int) -> dict:
    return {"seed": seed, "sft_accuracy": sft, "grpo_accuracy": grpo, "ppo_accuracy": ppo,
            "grpo_gain_pts": round(100 * (grpo - sft), 1), "ppo_gain_pts": round(100 * (ppo - sft), 1),
            "rm_accuracy": 0.99, "judge_accuracy": 0.97, "grpo_judge_win": 0.65, "grpo_judge_win_ci_low": 0.6,
            "ppo_judge_win": 0.6, "ppo_judge_win_ci_low": 0.55, "ppo_own_rm_win": 0.58, "run_wall_s": wall}


def test_a_record_renders_to_the_hand_written_table() -> None:
    record = {"name": "quickstart_seeds", "command": "CMD", "machine": "M", "date": "D",
              "rows": [_row(0, 0.5, 0.7, 0.6, 1200), _row(1, 0.4, 0.7, 0.45, 1320)]}
    lines = render_results.render_block(record).splitlines()
    assert lines[2] == ("| 0 | 0.500 | 0.700 (+20.0) | 0.600 (+10.0) | 0.990 / 0.970 | 0.6500 (0.6000) "
                        "| 0.6000 (0.5500) | 0.5800 | 20.0 min |")
    # mean / worst by hand: SFT (0.5 + 0.4) / 2; gains +20 / +30 and +10 / +5; runs 20 and 22 min.
    assert lines[4] == ("| **mean / worst** | 0.450 / 0.400 | +25.0 / +20.0 | +7.5 / +5.0 "
                        "| RM 0.990 / 0.990, judge 0.970 / 0.970 | 0.6500 / 0.6500 | 0.6000 / 0.6000 "
                        "| 0.5800 / 0.5800 | 21.0 min / 22.0 min |")
    assert lines[-1] == "Measured D on M: `CMD`."


def test_a_block_without_a_record_is_an_error() -> None:
    with pytest.raises(SystemExit, match="no record named 'nope'"):
        render_results.render_page("<!-- rendered: nope -->\nold\n<!-- /rendered -->\n", {})


def _manifest(folder: Path, name: str, metrics: dict, wall: float) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": name, "created_unix": 1, "metrics": metrics,
                                                      "wall_time_s": wall}))


def test_what_the_seeds_script_records_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quickstart_seeds, "ROOT", tmp_path)  # workdirs: tmp_path/work/quickstart[_s1]
    for seed in (0, 1):
        work = quickstart_seeds.workdir("quickstart", seed)
        _manifest(work / "reward_model-a", "reward_model", {"val/accuracy": 0.99}, 40)
        _manifest(work / "judge-b", "judge", {"val/accuracy": 0.98}, 45)
        _manifest(work / "eval_grpo-c", "eval_grpo", {"reference_accuracy/arith/pass@1": 0.48,
                                                      "accuracy/arith/pass@1": 0.7, "judge_win_rate": 0.65,
                                                      "judge_win_rate_ci_low": 0.6}, 80)
        _manifest(work / "eval_ppo-d", "eval_ppo", {"accuracy/arith/pass@1": 0.62, "judge_win_rate": 0.61,
                                                    "judge_win_rate_ci_low": 0.56, "win_rate": 0.59}, 50)
    rows = [quickstart_seeds.seed_row("quickstart", seed, 1300.0) for seed in (0, 1)]
    record = quickstart_seeds.record("quickstart", rows)
    assert record["name"] == "quickstart_seeds" and record["command"].endswith("scripts/quickstart_seeds.py")
    lines = render_results.render_block(json.loads(json.dumps(record))).splitlines()
    assert lines[2] == ("| 0 | 0.480 | 0.700 (+22.0) | 0.620 (+14.0) | 0.990 / 0.980 | 0.6500 (0.6000) "
                        "| 0.6100 (0.5600) | 0.5900 | 21.7 min |")
