"""``alignctl audit`` (issue 17, item 3): each check on small planted files, and the CLI contract.

Planted files come from ``scripts/audit_planted.py`` (``plant_faults`` / ``measure``), the same
code that measures recall on the HH-RLHF pairs, applied to arith preference pairs (always) and to
the HH pairs in ../shared/data (skipped when that folder is absent).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest

from alignctl.audit import AuditOptions, run_audit
from alignctl.audit import checks
from alignctl.audit.checks import PairText
from conftest import REPO_ROOT, assert_user_error, run_cli


def _planted_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("audit_planted", REPO_ROOT / "scripts" / "audit_planted.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


planted_lib = _planted_module()


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess

    out = tmp_path_factory.mktemp("audit") / "arith"
    run_preprocess(PreprocessConfig(dataset="arith", out=str(out), seed=0,
                                    arith=ArithConfig(num_train=16, num_test=8, num_sft=16, num_pref=300)), progress=False)
    return out


def _outputs(folder: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    flagged = [json.loads(line) for line in (folder / "flagged.jsonl").read_text().splitlines()]
    return summary, flagged


def _audit_planted(train: Path, test: Path, out: Path, **options: Any) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    frame, planted = planted_lib.plant_faults(pd.read_parquet(train), pd.read_parquet(test), seed=1)
    data = out.parent / f"{out.name}.parquet"
    frame.to_parquet(data)
    run_audit(AuditOptions(data=str(data), test=str(test), out=str(out), **options))
    summary, flagged = _outputs(out)
    return summary, planted_lib.measure(summary, flagged, planted)


def _assert_recall(scores: dict[str, dict[str, float]]) -> None:
    for check in ("exact_duplicate", "identical", "test_leakage"):
        assert scores[check]["planted"] > 0, check
        assert scores[check]["recall"] >= 0.95, (check, scores[check])


# ------------------------------------------------------------------------------ planted files


def test_planted_arith_recall_and_length_bias(arith: Path, tmp_path: Path) -> None:
    summary, scores = _audit_planted(arith / "pref_train.parquet", arith / "pref_test.parquet", tmp_path / "audit")
    _assert_recall(scores)
    assert scores["identical"]["precision"] == 1.0
    assert summary["length_bias"]["chars"]["biased"] is True
    assert summary["length_bias"]["chars"]["longer_share_of_unequal"] > 0.6
    assert any("length bias" in w for w in summary["warnings"])
    assert set(summary["blocking"]) >= {"identical", "exact_duplicate", "test_leakage"}
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "exact_duplicate" in html and "Length bias" in html


def test_planted_hh_recall(shared_data: Path, tmp_path: Path) -> None:
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.data.preprocess import run_preprocess

    hh = tmp_path / "hh"
    run_preprocess(PreprocessConfig(dataset="hh-rlhf", input=str(shared_data / "hh-rlhf-harmless" / "test.jsonl.gz"),
                                    out=str(hh), seed=0, test_fraction=0.2, max_rows=600), progress=False)
    summary, scores = _audit_planted(hh / "train.parquet", hh / "test.parquet", tmp_path / "audit")
    _assert_recall(scores)
    assert summary["length_bias"]["chars"]["biased"] is True


def test_tokenizer_and_reward_model_checks(arith: Path, tmp_path: Path) -> None:
    """A tiny char-level model as tokenizer and (untrained) RM: token lengths, --max-length, RM
    accuracy on length-matched pairs and label errors all run and land in the outputs."""
    from alignctl.models.tiny import init_model

    model = tmp_path / "model"
    init_model(out=model, tokenizer_from=[arith / "pref_train.parquet"], hidden=32, layers=1,
               tokenizer_kind="char", seed=0)
    result = run_audit(AuditOptions(data=str(arith / "pref_test.parquet"), reward_model=str(model), max_length=40,
                                    out=str(tmp_path / "audit"), device="cpu"))
    summary, flagged = _outputs(result.out)
    assert "tokens" in summary["length_bias"]
    assert summary["checks"]["too_long"]["ran"] and summary["checks"]["too_long"]["flagged"] > 0
    assert summary["checks"]["label_error"]["ran"]
    rm = summary["reward_model"]
    assert rm["scored_pairs"] == result.rows and rm["pairs_length_matched"] > 0
    label_rows = [r for r in flagged if any(x["check"] == "label_error" for x in r["reasons"])]
    assert len(label_rows) == summary["checks"]["label_error"]["flagged"]
    assert all(r["score_rejected"] > r["score_chosen"] for r in label_rows)


def _slow_reply_log_prob(model: Any, ids: list[int], start: int) -> float:
    """Independent reference: one unpadded forward per row, the reply tokens' log-probs summed in a loop."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return sum(float(torch.log_softmax(logits[t - 1], -1)[ids[t]]) for t in range(start, len(ids)))


def test_likelihood_of_replies_matches_an_unpadded_reference(arith: Path, tmp_path: Path) -> None:
    """The reply boundary follows the chat template's generation prompt, and the padded batch gives
    each reply the log-probability of a one-row forward pass (to float32 rounding)."""
    from alignctl.audit.pairs import read_pairs
    from alignctl.eval.likelihood import encode_pair, plain_encoder, reply_log_probs
    from alignctl.models.loading import load_causal_lm, load_tokenizer
    from alignctl.models.tiny import init_model

    model_dir = tmp_path / "model"
    init_model(out=model_dir, tokenizer_from=[arith / "pref_train.parquet"], hidden=32, layers=2,
               tokenizer_kind="char", seed=0)
    tokenizer = load_tokenizer(str(model_dir), padding_side="right")
    model = load_causal_lm(str(model_dir)).eval()
    _, convs = read_pairs(str(arith / "pref_test.parquet"))
    rows = [encode_pair(tokenizer, plain_encoder(tokenizer).encode, prompt, reply) for prompt, c, r in convs[:6]
            for reply in (c, r)]
    for (ids, start), (prompt, chosen, _) in zip(rows[::2], convs):
        # The reply starts right after '<|assistant|>' and runs to the end of the turn.
        assert tokenizer.decode(ids[start:]) == chosen[0]["content"] + "<|end|>"
        assert tokenizer.decode(ids[:start]).endswith("<|assistant|>")
    batched = reply_log_probs(model, rows, int(tokenizer.pad_token_id))
    for (ids, start), values in zip(rows, batched):
        assert len(values) == len(ids) - start
        assert float(values.sum()) == pytest.approx(_slow_reply_log_prob(model, ids, start), abs=1e-4)


def test_likelihood_check_reports_accuracy_and_warns_against_the_reward_model(arith: Path, tmp_path: Path) -> None:
    """--likelihood-model: accuracies land in summary.json and the HTML page; the accuracy is the
    share of pairs whose chosen reply has the higher summed log-probability (recomputed here from
    the slow reference on the same model)."""
    from alignctl.audit.pairs import read_pairs
    from alignctl.eval.likelihood import encode_pair, plain_encoder
    from alignctl.models.loading import load_causal_lm, load_tokenizer
    from alignctl.models.tiny import init_model

    model_dir = tmp_path / "model"
    init_model(out=model_dir, tokenizer_from=[arith / "pref_train.parquet"], hidden=32, layers=1,
               tokenizer_kind="char", seed=0)
    data = tmp_path / "pairs.parquet"
    pd.read_parquet(arith / "pref_train.parquet").head(24).to_parquet(data)
    result = run_audit(AuditOptions(data=str(data), likelihood_model=str(model_dir), reward_model=str(model_dir),
                                    out=str(tmp_path / "audit"), device="cpu"))
    summary, _ = _outputs(result.out)
    lik = summary["likelihood"]
    assert lik["path"] == str(model_dir) and lik["pairs"] == 24
    tokenizer, model = load_tokenizer(str(model_dir), padding_side="right"), load_causal_lm(str(model_dir)).eval()
    _, convs = read_pairs(str(data))
    encode = plain_encoder(tokenizer).encode
    right = [_slow_reply_log_prob(model, *encode_pair(tokenizer, encode, p, c))
             > _slow_reply_log_prob(model, *encode_pair(tokenizer, encode, p, r)) for p, c, r in convs]
    assert lik["accuracy_sum"] == pytest.approx(sum(right) / len(right))
    assert 0.0 <= lik["accuracy_mean"] <= 1.0
    assert "Likelihood of the reply" in (tmp_path / "audit" / "report.html").read_text()
    gap = max(lik["accuracy_sum"], lik["accuracy_mean"]) - summary["reward_model"]["accuracy_all"]
    assert any("own likelihood" in w for w in summary["warnings"]) == (gap > 0.1)


def test_group_key_splits_both_accuracies_by_kind(arith: Path, tmp_path: Path) -> None:
    """--group-key extra_info.rejected_kind: per-kind pair counts add up to the file, and each kind's
    RM accuracy equals the share recomputed from the per-row scores in the result; the likelihood's
    per-kind accuracies weighted by pairs give back its overall accuracy."""
    from alignctl.models.tiny import init_model

    model_dir = tmp_path / "model"
    init_model(out=model_dir, tokenizer_from=[arith / "pref_train.parquet"], hidden=32, layers=1,
               tokenizer_kind="char", seed=0)
    data = tmp_path / "pairs.parquet"
    frame = pd.read_parquet(arith / "pref_train.parquet").head(40)
    frame.to_parquet(data)
    result = run_audit(AuditOptions(data=str(data), likelihood_model=str(model_dir), reward_model=str(model_dir),
                                    group_key="extra_info.rejected_kind", out=str(tmp_path / "audit"), device="cpu"))
    summary, _ = _outputs(result.out)
    kinds = [info["rejected_kind"] for info in frame["extra_info"]]
    by_rm = summary["reward_model"]["by_group"]
    assert set(by_rm) == set(kinds) and len(by_rm) > 1
    for kind, entry in by_rm.items():
        rows = [i for i, k in enumerate(kinds) if k == kind]
        assert entry["pairs"] == len(rows)
        assert entry["accuracy"] == pytest.approx(sum(result.scores[i][0] > result.scores[i][1] for i in rows) / len(rows))
    by_sum = summary["likelihood"]["by_group_sum"]
    weighted = sum(e["pairs"] * e["accuracy"] for e in by_sum.values()) / sum(e["pairs"] for e in by_sum.values())
    assert weighted == pytest.approx(summary["likelihood"]["accuracy_sum"])
    assert [row[0] for row in summary["by_group"]] == sorted(set(kinds))
    assert "Accuracy by group" in (tmp_path / "audit" / "report.html").read_text()


# ------------------------------------------------------------------------------ pure checks


def test_normalized_identical_and_exact_duplicates() -> None:
    pairs = [PairText("Q one", "A", "B"), PairText("q  ONE ", "a", " b"), PairText("Q2", "Same", "same "),
             PairText("Q3", "", "x")]
    assert checks.exact_duplicate_groups(pairs) == [[0, 1]]
    assert checks.identical_pairs(pairs) == [2]
    assert checks.empty_fields(pairs) == {3: ["chosen"]}


def test_near_duplicates_found_and_distinct_pairs_not() -> None:
    base = "how do I bake a loaf of sourdough bread at home with a starter that is five days old"
    reply = "mix flour water and salt then fold every half hour and bake it in a hot dutch oven for forty minutes"
    pairs = [PairText(base, reply, "I do not know"), PairText(base + " please", reply, "I do not know"),
             PairText("what is the capital of france", "paris is the capital", "london"),
             PairText("name a prime number below ten", "seven is prime", "nine")]
    assert checks.near_duplicate_groups(pairs) == [[0, 1]]
    assert checks.near_duplicate_groups(pairs, skip={1}) == []


def test_likelihood_accuracy_by_sum_and_by_mean() -> None:
    """Hand-made numbers: by sum chosen wins rows 0 and 2 (row 1 is a tie: wrong); by mean, rows 0 and 1."""
    out = checks.likelihood_accuracy(np.array([-3.0, -5.0, -2.0]), np.array([-4.0, -5.0, -6.0]),
                                     np.array([-0.5, -0.4, -1.0]), np.array([-0.6, -0.5, -0.5]))
    assert out == {"pairs": 3, "accuracy_sum": pytest.approx(2 / 3), "accuracy_mean": pytest.approx(2 / 3)}
    assert checks.likelihood_accuracy(np.array([]), np.array([]), np.array([]), np.array([]))["accuracy_sum"] is None


def test_accuracy_by_group_hand_made() -> None:
    """Rows 0, 2 (group a) right, wrong; rows 1, 3, 4 (group b) right, right, wrong."""
    table = checks.accuracy_by_group([True, True, False, True, False], ["a", "b", "a", "b", "b"])
    assert table == {"a": {"pairs": 2, "accuracy": 0.5}, "b": {"pairs": 3, "accuracy": pytest.approx(2 / 3)}}
    with pytest.raises(ValueError):
        checks.accuracy_by_group([True], ["a", "b"])


def test_leakage_length_bias_long_pairs_and_label_errors() -> None:
    pairs = [PairText("Hello  There", "a", "b"), PairText("other", "a", "b")]
    assert checks.leaked_prompts(pairs, ["hello there", ""]) == [0]
    bias = checks.length_bias([10, 10, 10, 5], [5, 5, 5, 5])
    assert bias["chosen_longer"] == 0.75 and bias["equal"] == 0.25 and bias["biased"] is True
    assert checks.length_bias([10, 5], [5, 10])["biased"] is False
    assert checks.too_long([10, 50], [60, 20], 40) == [0, 1] and checks.too_long([10], [20], 40) == []
    chosen, rejected = np.array([0.0, 0.0, 5.0]), np.array([3.0, 1.0, 0.0])
    assert checks.label_errors(chosen, rejected) == [0]  # sigmoid(3) = 0.95; sigmoid(1) = 0.73
    assert np.allclose(checks.rejected_probability(np.array([0.0, 800.0]), np.array([800.0, 0.0])), [1.0, 0.0])
    acc = checks.rm_accuracy(np.array([1.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0]), [100, 10, 100], [95, 50, 10])
    assert acc["accuracy_all"] == pytest.approx(1 / 3) and acc["pairs_length_matched"] == 1
    assert acc["accuracy_length_matched"] == 1.0 and acc["accuracy_chosen_shorter"] == 0.0


# ------------------------------------------------------------------------------ CLI


def test_cli_strict_exit_status_and_overwrite(arith: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    frame = pd.read_parquet(arith / "pref_train.parquet")
    frame["rejected"] = [frame["chosen"][0], *frame["rejected"][1:]]  # one identical pair: a blocking problem
    frame.to_parquet(tmp_path / "bad.parquet")
    result = run_cli("audit", "bad.parquet", "--strict")
    assert result.code == 1, result.stderr
    assert "identical (1 rows)" in result.stderr and "identical" in result.stdout
    assert (tmp_path / "audit" / "bad" / "summary.json").is_file()  # default --out
    assert_user_error(run_cli("audit", "bad.parquet"), "--overwrite")
    assert run_cli("audit", "bad.parquet", "--overwrite").code == 0  # not --strict: report only
    clean = run_cli("audit", str(arith / "pref_test.parquet"), "--out", "clean", "--strict")
    assert clean.code == 0, clean.stderr


def test_cli_user_errors(arith: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli("audit", "missing.parquet"), "missing.parquet", "not found")
    assert_user_error(run_cli("audit", str(arith / "train.parquet"), "--out", "o1"), "chosen", "RL prompt rows")
    assert not (tmp_path / "o1").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--out", "mine", "--overwrite"),
                      "not written by alignctl")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--max-length", "0", "--out", "o2"),
                      "--max-length")
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--test", "nope.parquet", "--out", "o3"),
                      "nope.parquet")
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--likelihood-model", "no_model",
                              "--out", "o4"), "--likelihood-model", "no_model", "config.json")
    assert not (tmp_path / "o4").exists()
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--group-key", "extra_info.nope",
                              "--out", "o5"), "pref_test.parquet row 0", "--group-key 'extra_info.nope'")
    assert_user_error(run_cli("audit", str(arith / "pref_test.parquet"), "--group-key", "nocol", "--out", "o6"),
                      "--group-key 'nocol'", "no column 'nocol'")
    assert not (tmp_path / "o5").exists() and not (tmp_path / "o6").exists()


def test_read_pairs_strings_and_blank_messages(tmp_path: Path) -> None:
    """Plain-string columns read like messages; a prompt of blank messages counts as empty."""
    from alignctl.audit.pairs import read_pairs

    frame = pd.DataFrame({"prompt": ["Hi", "x"], "chosen": ["a", "b"], "rejected": ["c", "d"]})
    frame.to_parquet(tmp_path / "strings.parquet")
    texts, convs = read_pairs(str(tmp_path / "strings.parquet"))
    assert texts[0] == PairText("user: Hi", "a", "c") and convs[0][1] == [{"role": "assistant", "content": "a"}]
    blank = pd.DataFrame({"prompt": [[{"role": "user", "content": "  "}]], "chosen": [[{"role": "assistant", "content": "a"}]],
                          "rejected": [[{"role": "assistant", "content": "b"}]]})
    blank.to_parquet(tmp_path / "blank.parquet")
    texts, _ = read_pairs(str(tmp_path / "blank.parquet"))
    assert checks.empty_fields(texts) == {0: ["prompt"]}


def test_a_finding_on_every_row_is_its_count_and_a_few_examples(arith: Path, tmp_path: Path) -> None:
    """Audited against itself, every row leaks: the page gives the count and the first 5 rows of that
    check, and says where the rest are; flagged.jsonl has every row."""
    from alignctl.audit.audit_report import EXAMPLES_PER_CHECK

    data = arith / "pref_train.parquet"
    run_audit(AuditOptions(data=str(data), test=str(data), out=str(tmp_path / "audit")))
    summary, flagged = _outputs(tmp_path / "audit")
    rows = summary["rows"]
    assert summary["checks"]["test_leakage"]["flagged"] == rows > EXAMPLES_PER_CHECK
    assert sum(any(r["check"] == "test_leakage" for r in record["reasons"]) for record in flagged) == rows
    html = (tmp_path / "audit" / "report.html").read_text()
    section = html[html.index("<h3>test_leakage"):]
    section = section[: section.index("</table>")]
    assert f"test_leakage: {rows} of {rows} rows (100.0%)" in section
    assert section.count('<tr><td class="num">') == EXAMPLES_PER_CHECK
    assert f"the other {rows - EXAMPLES_PER_CHECK} are in flagged.jsonl" in section
