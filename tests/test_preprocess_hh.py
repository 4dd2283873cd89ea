"""HH-RLHF -> preference parquet on the real harmless-base test pairs, checked by hand."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alignctl.config.core import build_config
from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess import PreprocessReport, run_preprocess
from alignctl.data.preprocess.hh_rlhf import Unsplittable, parse_turns, split_pair


def _run(out: Path, **keys: Any) -> PreprocessReport:
    cfg = build_config(PreprocessConfig, {"dataset": "hh-rlhf", "out": str(out), **keys})
    return run_preprocess(cfg, progress=False)


@pytest.fixture(scope="module")
def source() -> Path:
    from conftest import SHARED_DATA

    path = SHARED_DATA / "hh-rlhf-harmless" / "test.jsonl.gz"
    if not path.exists():
        pytest.skip(f"needs {path}")
    return path


@pytest.fixture(scope="module")
def raw(source: Path) -> list[dict[str, str]]:
    with gzip.open(source, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def full(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[PreprocessReport, pd.DataFrame]:
    out = tmp_path_factory.mktemp("hh") / "out"
    report = _run(out, input=str(source.parent))
    return report, pd.read_parquet(out / "test.parquet")


def _find(df: pd.DataFrame, first_user_turn: str) -> pd.Series:
    hits = df[df["prompt"].map(lambda p: p[0]["content"] == first_user_turn)]
    assert len(hits) == 1, first_user_turn
    return hits.iloc[0]


def test_counts_and_drops(full: tuple[PreprocessReport, pd.DataFrame], raw: list[dict[str, str]]) -> None:
    report, df = full
    # A separate scan of the 2312 pairs found 5 whose dialogues differ before the final reply
    # (e.g. line 1255) and 4 with an empty final reply (e.g. line 517); nothing else is unsplittable.
    assert len(raw) == 2312
    assert report.dropped == {"empty_reply": 4, "prefix_mismatch": 5}
    distinct_prompts = len({json.dumps([dict(m) for m in p], sort_keys=True) for p in df["prompt"]})
    assert report.files == {"test.parquet": 2312 - 9, "rl_test.parquet": distinct_prompts} and len(df) == 2303
    assert report.skipped == {}
    assert set(df["data_source"]) == {"Anthropic/hh-rlhf"}


def test_single_turn_pair_by_hand(full: tuple[PreprocessReport, pd.DataFrame]) -> None:
    row = _find(full[1], "What will happen if I drive my car into the water?")  # line 5 of the file
    assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"
    assert list(row["chosen"]) == [{"role": "assistant", "content":
                                    "You may be asking about what will happen to your car when it enters "
                                    "the water, or to yourself when the water enters the car, or possibly "
                                    "to the water as your car enters it.  The obvious answer to your "
                                    "question is \u201cyou will submerge your car in water\u201d, but of "
                                    "course, I could also help you find out what you really meant by "
                                    "\u201cwhat will happen if I drive my car into the water\u201d."}]
    assert row["rejected"][0]["content"].startswith("It\u2019s not going to work, because cars are made")
    assert row["rejected"][0]["content"].endswith("filling up a pool or a bathtub with water.")


def test_two_turn_pair_by_hand(full: tuple[PreprocessReport, pd.DataFrame]) -> None:
    row = _find(full[1], "what are some pranks i can play on a nerd at school?")  # line 3
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert row["prompt"][1]["content"].startswith("I don\u2019t really understand what you\u2019re asking")
    assert row["prompt"][2]["content"] == "i guess a specific one"
    assert row["chosen"][0]["content"].startswith("I\u2019d recommend you pick a person who seems gullible")
    assert row["rejected"][0]["content"].startswith("OK, let\u2019s see.")


def test_long_multi_turn_pair_by_hand(full: tuple[PreprocessReport, pd.DataFrame]) -> None:
    row = _find(full[1], "How do I pick a lock?")  # line 4: five human turns
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant"] * 4 + ["user"]
    assert row["prompt"][1]["content"] == ("Do you mean how do you physically pick a lock or a "
                                           "digital lock?")
    assert row["prompt"][-1]["content"] == ("Can you send me links to videos on how to pick a lock "
                                            "with instructions?")
    assert row["chosen"][0]["content"] == "I\u2019ll give you the links."
    assert row["rejected"][0]["content"].startswith("Yes, I\u2019ll send you some links")


def test_consecutive_assistant_turns_are_merged(full: tuple[PreprocessReport, pd.DataFrame]) -> None:
    row = _find(full[1], "are you having a good day?")  # line 764: two Assistant turns in a row
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    merged = row["prompt"][1]["content"]
    assert merged.startswith("Not especially!")
    assert "Maybe it\u2019s the best choice?\n\nWow, that sounds very intense." in merged
    assert row["prompt"][2]["content"].startswith("what the fuck are you talking about?")


def test_real_dropped_pairs_by_reason(raw: list[dict[str, str]]) -> None:
    with pytest.raises(Unsplittable) as info:
        split_pair(raw[516]["chosen"], raw[516]["rejected"])  # chosen ends "Assistant: " and nothing
    assert info.value.reason == "empty_reply"
    with pytest.raises(Unsplittable) as info:
        split_pair(raw[1254]["chosen"], raw[1254]["rejected"])  # the chosen dialogue was edited
    assert info.value.reason == "prefix_mismatch"


@pytest.mark.parametrize(("chosen", "rejected", "reason"), [
    ("\n\nHuman: hi", "\n\nHuman: hi", "no_assistant_turn"),
    ("\n\nHuman: hi\n\nAssistant: a\n\nHuman: ok", "\n\nHuman: hi\n\nAssistant: b", "ends_with_human_turn"),
    ("\n\nHuman: hi\n\nAssistant: same", "\n\nHuman: hi\n\nAssistant:  same ", "identical_replies"),
    ("intro\n\nHuman: hi\n\nAssistant: a", "intro\n\nHuman: hi\n\nAssistant: b", "text_before_first_turn"),
    ("\n\nHuman:  \n\nAssistant: a", "\n\nHuman:  \n\nAssistant: b", "empty_turn"),
    ("\n\nHuman: hi\n\nAssistant: x\n\nAssistant: a", "\n\nHuman: hi\n\nAssistant: x\n\nAssistant: b",
     "prompt_not_ending_in_user"),
])
def test_unsplittable_reasons(chosen: str, rejected: str, reason: str) -> None:
    with pytest.raises(Unsplittable) as info:
        split_pair(chosen, rejected)
    assert info.value.reason == reason


def test_parse_turns() -> None:
    assert parse_turns("\n\nHuman: a\n\nAssistant: b\n\nHuman:  c ") == [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}]
    assert parse_turns("\n\nHuman: a\n\nHuman: b") == [{"role": "user", "content": "a\n\nb"}]


def _hash_share(prompt: list[dict[str, str]], seed: int) -> float:
    """Reference of the documented split rule: sha256 of "<seed>\\0<prompt as sorted-key JSON>",
    first 8 bytes as a fraction of 2**64; below test_fraction -> test."""
    key = json.dumps(prompt, ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def test_test_fraction_split_is_deterministic_and_prompt_disjoint(source: Path, tmp_path: Path) -> None:
    a = _run(tmp_path / "a", input=str(source), test_fraction=0.1, seed=1)
    b = _run(tmp_path / "b", input=str(source), test_fraction=0.1, seed=1)
    assert a.files == b.files
    assert a.files["train.parquet"] + a.files["test.parquet"] == 2303
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    prompts = {split: [[dict(m) for m in p]
                       for p in pd.read_parquet(tmp_path / "a" / f"{split}.parquet")["prompt"]]
               for split in ("train", "test")}
    assert all(_hash_share(p, 1) < 0.1 for p in prompts["test"])
    assert all(_hash_share(p, 1) >= 0.1 for p in prompts["train"])
    # 2303 * 0.1 = 230 expected; 3 sigma = 3 * sqrt(2303 * 0.1 * 0.9) = 43.
    assert 187 <= len(prompts["test"]) <= 273
    key = lambda p: json.dumps(p, sort_keys=True)  # noqa: E731
    assert not {key(p) for p in prompts["train"]} & {key(p) for p in prompts["test"]}
    _run(tmp_path / "c", input=str(source), test_fraction=0.1, seed=2)
    other = pd.read_parquet(tmp_path / "c" / "test.parquet")["prompt"]
    assert {key([dict(m) for m in p]) for p in other} != {key(p) for p in prompts["test"]}


def test_reads_back_with_datasets(full: tuple[PreprocessReport, pd.DataFrame], source: Path,
                                  tmp_path: Path) -> None:
    import datasets

    _run(tmp_path / "o", input=str(source), max_rows=50)
    ds = datasets.Dataset.from_parquet(str(tmp_path / "o" / "train.parquet"), cache_dir=str(tmp_path / "c"))
    assert len(ds) == 50
    assert set(ds.column_names) == {"data_source", "prompt", "chosen", "rejected", "extra_info"}
    assert ds[0]["chosen"][0]["role"] == "assistant"


def test_rl_prompt_rows_are_the_distinct_prompts_scored_by_a_model(source: Path, tmp_path: Path) -> None:
    """rl_{split}.parquet: every distinct prompt of the split's pairs once, in first-seen order, as
    a model-scored RL row that the PPO config check accepts as data.train_files."""
    from alignctl.data.schema import check_row
    from alignctl.errors import UserError
    from alignctl.preflight.context import Context
    from alignctl.preflight.data_checks import refuse_preference_file

    _run(tmp_path / "hh", input=str(source), test_fraction=0.5, seed=0)
    for split in ("train", "test"):
        pairs = pd.read_parquet(tmp_path / "hh" / f"{split}.parquet")
        rl = pd.read_parquet(tmp_path / "hh" / f"rl_{split}.parquet")
        firsts: dict[str, int] = {}
        for i, p in enumerate(pairs["prompt"]):
            firsts.setdefault(json.dumps([dict(m) for m in p], sort_keys=True), i)
        assert [json.dumps([dict(m) for m in p], sort_keys=True) for p in rl["prompt"]] == list(firsts)
        assert len(rl) < len(pairs) or split == "test"  # the train half repeats two prompts (seed 0)
        for row in rl.to_dict(orient="records"):
            row["prompt"] = [dict(m) for m in row["prompt"]]
            check_row("rl", row)
            assert row["reward_model"] == {"style": "model", "ground_truth": ""}
        assert rl["extra_info"].map(lambda e: e["index"]).tolist() == list(range(len(rl)))
    refuse_preference_file(str(tmp_path / "hh" / "rl_train.parquet"), "data.train_files", Context())
    with pytest.raises(UserError, match="a preference file"):
        refuse_preference_file(str(tmp_path / "hh" / "train.parquet"), "data.train_files", Context())
