"""docs/your_model.md runs as written: its files (marked ``<!-- file: PATH -->`` above a code block)
are written into an empty project folder and its ``bash`` blocks' commands run there in order, on the
tiny model the page's own ``alignctl init-model`` line makes. A command that fails, or a page whose
files and commands no longer fit together, fails this test."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO_ROOT, run_cli

DOC = REPO_ROOT / "docs" / "your_model.md"
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", re.S)
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def doc_files(text: str) -> dict[str, str]:
    return {path: body for path, body in FILE_BLOCK.findall(text)}


def doc_commands(text: str) -> list[str]:
    """Each command line of the bash blocks, in page order (comments and blank lines skipped)."""
    lines = [line.strip() for block in BASH_BLOCK.findall(text) for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_page_shows_every_step() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert set(doc_files(text)) == {"my_data/qa.jsonl", "my_map.py", "my_reward.py", "my_grpo.yaml"}
    steps = [shlex.split(command)[:2] for command in doc_commands(text)]
    assert steps == [["alignctl", "preprocess"], ["alignctl", "init-model"], ["alignctl", "grpo"],
                     ["alignctl", "eval"]]


@pytest.mark.slow
def test_the_pages_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = DOC.read_text(encoding="utf-8")
    for path, body in doc_files(text).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body, encoding="utf-8")
    # A user's file is longer than the page's three example lines: more records of the same shape,
    # enough for a train split of several batches of 8 prompts.
    rng = random.Random(0)
    with (tmp_path / "my_data" / "qa.jsonl").open("a", encoding="utf-8") as out:
        for _ in range(61):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            out.write(json.dumps({"question": f"Ann has {a} coins and finds {b} more. How many coins does "
                                              "she have?", "answer": a + b}) + "\n")
    monkeypatch.chdir(tmp_path)
    for command in doc_commands(text):
        words = shlex.split(command)
        result = run_cli(*words[1:])
        assert result.code == 0, f"{command}\n{result.stderr[-3000:]}"

    # preprocess: the map function's rows, the page's own example among them, some held out
    splits = {name: pd.read_parquet(tmp_path / "data" / "my_qa" / f"{name}.parquet") for name in ("train", "test")}
    assert len(splits["train"]) + len(splits["test"]) == 64 and len(splits["test"]) > 0
    rows = pd.concat(splits.values())
    assert set(rows["data_source"]) == {"gsm8k"}
    tom = [row for _, row in rows.iterrows() if row["prompt"][0]["content"].startswith("Tom has 3 apples")]
    assert len(tom) == 1 and tom[0]["reward_model"]["ground_truth"] == "7"
    # grpo: two steps scored by my_reward.py (its extra 'acc' key is logged), the policy saved
    run = tmp_path / "runs" / "my_qa_grpo"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"critic/score/mean"' in line]
    assert len(steps) == 2 and all("reward/extra/acc/mean" in step for step in steps)
    assert (run / "actor" / "config.json").is_file()
    # eval: the policy against the starting model on the held-out split, accuracy by GSM8K's rule
    results = json.loads((tmp_path / "reports" / "my_qa" / "results.json").read_text())
    assert results["num_prompts"] == len(splits["test"])
    assert results["accuracy"]["gsm8k"]["num_prompts"] == len(splits["test"])  # scored by the rule
    assert (tmp_path / "reports" / "my_qa" / "report.html").is_file()
