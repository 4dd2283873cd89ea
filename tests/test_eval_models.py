"""The eval stage end to end on tiny models: self-comparison, a reward model built to prefer one
model, reward normalisation, preference consistency, run curves, and the written report.

Models are real transformers modules whose weights are set by hand so their behaviour is known:

* a "constant" causal LM: every layer's output projections are zero, so the residual stream is the
  token embedding; every embedding is e0 = (1, 0, ..., 0) and the final norm keeps only dim 0, so
  the last hidden state is (8, 0, ...) for every input (RMSNorm of e0 in 64 dims = 8 e0). Its
  lm_head gives logit 80 to a chosen token set (digits or letters) and 0 to the rest: it writes
  only digits (or only letters) and never stops early.
* a "digit-fraction" reward model (LlamaForSequenceClassification): attention with zero
  queries/keys averages the value of every position up to the last; the value is 1/sqrt(2/64) on
  digit tokens and 0 elsewhere, written to dim 2. At the last token (``<|end|>``, not a digit)
  the residual is (0, 1, m) with m = f / sqrt(2/64), f = the fraction of digit tokens in the whole
  sequence; the final RMSNorm and a score head reading dim 2 give
  score = m / sqrt((1 + m^2) / 64 + eps), strictly increasing in f. A digit-only response raises
  f above the prompt's, a letter-only one lowers it, so the digit model wins every pair.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from alignctl.config.core import load_config
from alignctl.config.eval import EvalConfig
from alignctl.errors import UserError
from alignctl.eval import EvalResults, evaluate, run_eval
from alignctl.eval.scoring import REWARD_MEAN_KEY, REWARD_STD_KEY

DIGITS = "0123456789"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
EPS = 1e-6  # LlamaConfig.rms_norm_eps of the tiny model
HOSTILE = 'Tom has 3 pens. <script>alert("x")</script> <img src=x onerror=alert(1)> ``` | pipe'


def _constant_lm(base: Path, out: Path, alphabet: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    ids = [i for i in tok.convert_tokens_to_ids(list(alphabet)) if i != tok.unk_token_id]
    assert len(ids) >= 5
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[ids, 0] = 10.0
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _digit_fraction_rm(base: Path, out: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    rm = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    digit_ids = [i for i in tok.convert_tokens_to_ids(list(DIGITS)) if i != tok.unk_token_id]
    with torch.no_grad():
        for p in rm.parameters():
            p.zero_()
        emb = rm.model.embed_tokens.weight
        emb[:, 1] = 1.0
        emb[digit_ids, 0] = 1.0
        first, *rest = rm.model.layers
        first.input_layernorm.weight.fill_(1.0)
        first.self_attn.v_proj.weight[0, 0] = 1.0
        first.self_attn.o_proj.weight[2, 0] = 1.0
        for layer in rm.model.layers:
            layer.post_attention_layernorm.weight.fill_(1.0)
        for layer in rest:
            layer.input_layernorm.weight.fill_(1.0)
        rm.model.norm.weight.fill_(1.0)
        rm.score.weight[0, 2] = 1.0
    rm.save_pretrained(out)
    tok.save_pretrained(out)


def expected_rm_score(tokenizer: object, prompt: list[dict[str, str]], response: str) -> float:
    """The closed form of the digit-fraction reward model (module docstring), from token ids."""
    ids = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": response}], tokenize=True)  # type: ignore[attr-defined]
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    digit_ids = set(tokenizer.convert_tokens_to_ids(list(DIGITS)))  # type: ignore[attr-defined]
    f = sum(t in digit_ids for t in ids) / len(ids)
    m = f / math.sqrt(2 / 64 + EPS)
    return m / math.sqrt((1 + m * m) / 64 + EPS)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model
    from alignctl.tracking import JsonlSink

    root = tmp_path_factory.mktemp("eval")
    data = root / "arith"
    arith = ArithConfig(num_train=16, num_test=10, num_sft=16, num_pref=24)
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), seed=0, arith=arith), progress=False)
    # Letters are in the vocabulary through the question text; digits through the numbers.
    init_model(out=root / "random", tokenizer_from=[data / "sft_train.parquet", data / "train.parquet",
                                                    data / "pref_test.parquet"],
               hidden=64, layers=2, tokenizer_kind="char", seed=0)
    _constant_lm(root / "random", root / "digits", DIGITS)
    _constant_lm(root / "random", root / "letters", LETTERS)
    _digit_fraction_rm(root / "random", root / "rm")
    run = root / "run"
    sink = JsonlSink(run / "metrics.jsonl")
    for step in range(1, 6):  # the keys the RL trainer logs, with known values
        sink.log({"critic/score/mean": 0.1 * step, "reward/p10": 0.05 * step, "reward/p50": 0.1 * step,
                  "reward/p90": 0.2 * step, "actor/reference_kl": 0.01 * step, "actor/entropy": 3.0 - 0.1 * step,
                  "response_length/mean": 10.0 + step, "val-core/arith/acc/mean@1": 0.1 * step,
                  "actor/pg_loss": float("nan")}, step=step)
    sink.close()
    return {"data": data, "random": root / "random", "digits": root / "digits", "letters": root / "letters",
            "rm": root / "rm", "run": run, "root": root}


def test_model_against_itself_greedy_is_all_ties(assets: dict[str, Path]) -> None:
    prompts = assets["data"] / "test.parquet"
    res = evaluate(model=assets["random"], prompts=prompts, reward_model=assets["rm"], reference=assets["random"],
                   max_new_tokens=8, num_bootstrap=200)
    # Greedy decoding of the same model gives the same responses: every pair is a tie.
    assert [s["policy"][0]["text"] for s in res.samples] == [s["reference"][0]["text"] for s in res.samples]
    assert res.num_prompts == 10 and res.ties == 10 and res.wins == res.losses == 0
    assert res.win_rate == 0.5 and res.win_rate_ci == (0.5, 0.5) and res.lc_win_rate == 0.5
    assert res.mean_reward == res.reference_mean_reward
    assert set(res.accuracy) == {"arith"} and res.accuracy["arith"]["num_prompts"] == 10
    assert res.rule_win_rate == 0.5 and res.rule_win_rate_ci == (0.5, 0.5)  # same answers: rule ties too


def test_rule_win_rate_hand_computed() -> None:
    """Right beats wrong, anything else ties; prompts without a ground truth are left out."""
    from alignctl.config.eval import EvalConfig
    from alignctl.eval.evaluation import rule_win_fields

    cfg = EvalConfig(num_bootstrap=200)
    # n = 2: prompt 0: policy [right, wrong] vs reference [wrong, wrong] -> pairs 1, 1, 0.5, 0.5 -> 0.75
    #        prompt 1: [wrong, wrong] vs [right, right] -> 0 ; prompt 2: no ground truth (skipped)
    #        prompt 3: [right, right] vs [right, wrong] -> 0.5, 1, 0.5, 1 -> 0.75
    fields = rule_win_fields([[True, False], [False, False], None, [True, True]],
                             [[False, False], [True, True], None, [True, False]], cfg)
    assert fields["rule_win_rate"] == pytest.approx((0.75 + 0.0 + 0.75) / 3, abs=1e-12)
    low, high = fields["rule_win_rate_ci"]
    assert 0.0 <= low <= fields["rule_win_rate"] <= high <= 0.75
    assert rule_win_fields([None, None], [None, None], cfg) == {}


def test_model_against_itself_sampled_is_about_half(assets: dict[str, Path]) -> None:
    kwargs = dict(model=assets["random"], prompts=assets["data"] / "test.parquet", reward_model=assets["rm"],
                  reference=assets["random"], n=3, do_sample=True, max_new_tokens=8, seed=3, batch_size=4)
    res = evaluate(num_bootstrap=500, **kwargs)
    # Independent draws (policy and reference use different seed streams) from one model.
    assert [s["policy"][0]["text"] for s in res.samples] != [s["reference"][0]["text"] for s in res.samples]
    assert res.wins + res.ties + res.losses == 10 * 3 * 3
    low, high = res.win_rate_ci
    assert low <= 0.5 <= high
    assert low < res.win_rate < high
    assert set(res.accuracy["arith"]) == {"pass@1", "pass@2", "pass@3", "maj@3", "num_prompts"}
    # Seeds are per (seed, model role, batch): the first batch of 4 prompts draws the same samples
    # when it is evaluated alone.
    again = evaluate(num_bootstrap=100, max_prompts=4, **kwargs)
    assert again.samples == res.samples[:4]


@pytest.fixture(scope="module")
def digits_vs_letters(assets: dict[str, Path]) -> EvalResults:
    return evaluate(model=assets["digits"], prompts=assets["data"] / "test.parquet", reward_model=assets["rm"],
                    reference=assets["letters"], n=2, do_sample=True, max_new_tokens=8, num_bootstrap=200)


def test_repetition_rates_are_counted_over_each_models_samples(digits_vs_letters: EvalResults) -> None:
    """The policy's and the reference's repetition rates, recounted from their own samples' texts."""
    from alignctl.eval.repetition import repetition_rate

    for role, key in (("policy", "repetition_rate"), ("reference", "reference_repetition_rate")):
        texts = [s["text"] for sample in digits_vs_letters.samples for s in sample[role]]
        assert len(texts) == 20 and getattr(digits_vs_letters, key) == repetition_rate(texts)
        assert digits_vs_letters.headline()[key] == getattr(digits_vs_letters, key)


def test_a_policy_that_repeats_itself_gets_a_warning(tmp_path: Path) -> None:
    from alignctl.eval.evaluation import verdict_fields

    cfg = load_config(EvalConfig, None, [f"policy={tmp_path}", "prompts=p.parquet"])
    calm = verdict_fields(cfg, {"repetition_rate": 0.15, "reference_repetition_rate": 0.10}, {})
    loud = verdict_fields(cfg, {"repetition_rate": 0.26, "reference_repetition_rate": 0.10}, {})
    assert calm["warnings"] == [] and len(loud["warnings"]) == 1 and "degenerate repetition" in loud["warnings"][0]


def test_rule_win_rate_matches_the_samples_correctness(digits_vs_letters: EvalResults) -> None:
    """The rule win rate, recounted from each sample's own correctness flag (ties half)."""
    pairs = [(1.0 if p["correct"] else 0.0) - (1.0 if r["correct"] else 0.0)
             for sample in digits_vs_letters.samples for p in sample["policy"] for r in sample["reference"]]
    assert len(pairs) == 10 * 2 * 2
    expected = sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in pairs) / len(pairs)
    assert digits_vs_letters.rule_win_rate == pytest.approx(expected, abs=1e-12)
    assert digits_vs_letters.headline()["rule_win_rate"] == digits_vs_letters.rule_win_rate


def _recount_rule_agreement(samples: list[dict]) -> tuple[float | None, int]:
    """Independent recount from the per-sample records: every (policy, reference) sample pair of a
    prompt where exactly one is right, scored 1 / 0.5 / 0 for the right one by its reward."""
    outcomes = []
    for sample in samples:
        for p in sample["policy"]:
            for r in sample["reference"]:
                if p["correct"] is None or r["correct"] is None or p["correct"] == r["correct"]:
                    continue
                right, wrong = (p, r) if p["correct"] else (r, p)
                outcomes.append(1.0 if right["reward"] > wrong["reward"] else
                                0.5 if right["reward"] == wrong["reward"] else 0.0)
    return (sum(outcomes) / len(outcomes) if outcomes else None), len(outcomes)


def test_rule_agreement_recounted_from_the_samples(digits_vs_letters: EvalResults) -> None:
    res = digits_vs_letters
    agreement, pairs = _recount_rule_agreement(res.samples)
    assert (res.rm_rule_agreement, res.decisive_pairs) == (agreement, pairs)
    assert res.headline().get("rm_rule_agreement") == agreement


def _four_right_answers(assets: dict[str, Path], out: Path, common: dict[str, Any]) -> None:
    """An eval of the digit model against the letter model at ``out`` whose stored policy answers to 4
    of the 10 prompts are rewritten to the right ``#### N`` (a later eval takes them back through
    reuse_generations); the letter model is never right, so those are 4 decisive pairs."""
    first = evaluate(model=assets["digits"], out=out, **common)
    assert first.decisive_pairs == 0 and first.rm_rule_agreement is None  # 8 repeated digits are never "#### N"
    stored = json.loads((out / "generations.json").read_text())
    for i in range(4):
        stored["policy"]["texts"][i] = [f"#### {first.samples[i]['ground_truth']}"]
    (out / "generations.json").write_text(json.dumps(stored))


def test_rule_agreement_of_a_reward_model_and_of_its_negation(assets: dict[str, Path], tmp_path: Path) -> None:
    """4 decisive pairs (:func:`_four_right_answers`), all won by the right answer under the digit
    reward model (agreement 1: "#### N" holds digits, letters none) and all lost under its negation as
    the judge (agreement 0)."""
    common = dict(prompts=assets["data"] / "test.parquet", reward_model=assets["rm"], reference=assets["letters"],
                  max_new_tokens=8, num_bootstrap=100)
    _four_right_answers(assets, tmp_path / "first", common)
    judge = _negated_reward_model(assets["rm"], tmp_path / "negated")
    res = evaluate(model=assets["digits"], judge_model=judge, reuse_generations=[str(tmp_path / "first")], **common)
    assert set(res.reused_generations) == {"policy", "reference"}
    assert res.accuracy["arith"]["pass@1"] == 0.4 and res.reference_accuracy["arith"]["pass@1"] == 0.0
    assert _recount_rule_agreement(res.samples) == (1.0, 4)
    assert (res.decisive_pairs, res.rm_rule_agreement, res.judge_rule_agreement) == (4, 1.0, 0.0)
    assert res.headline()["decisive_pairs"] == 4.0
    assert not any("blind to correctness" in n for n in res.notes)  # 4 pairs are too few to say
    from alignctl.eval.evaluation import write_outputs

    write_outputs(res, tmp_path / "report")
    assert "of 4 pairs where exactly one is right (50% = blind) | reward model 100.0%; judge 0.0% |" in \
        (tmp_path / "report" / "report.md").read_text()
    assert "of 4 pairs where exactly one answer is right" in (tmp_path / "report" / "report.html").read_text()


def test_likelihood_rule_agreement_of_the_two_constant_models(assets: dict[str, Path], tmp_path: Path) -> None:
    """The 4 decisive pairs of :func:`_four_right_answers`, ranked by a causal LM's summed log-probability.
    By hand: a constant model gives every token, whatever its context, log-probability 10 - L if it is
    in the model's alphabet and -L otherwise (L: the log-sum-exp of its fixed logits, 10 < L < 10 + ln V).
    The end-of-turn tokens are the same on both sides and cancel. The right answer ``#### N`` is k = 5 +
    len(N) <= 8 tokens (N has at most 3 characters here), d >= 1 of them digits; the wrong one 8 letters.
    Digit model: -kL + 10d > -8L always, so the right answer wins: agreement 1. Letter model:
    8(10 - L) = 80 - 8L > -kL as long as (8 - k)L < 80, true for L < 40 (k >= 6): agreement 0."""
    common = dict(prompts=assets["data"] / "test.parquet", reference=assets["letters"], max_new_tokens=8,
                  num_bootstrap=100)
    _four_right_answers(assets, tmp_path / "first", common)
    reuse = [str(tmp_path / "first")]
    by_digits = evaluate(model=assets["digits"], likelihood_model=assets["digits"], reuse_generations=reuse,
                         out=tmp_path / "by_digits", **common)
    by_letters = evaluate(model=assets["digits"], likelihood_model=assets["letters"], reuse_generations=reuse,
                          **common)
    assert (by_digits.decisive_pairs, by_digits.likelihood_rule_agreement) == (4, 1.0)
    assert (by_letters.decisive_pairs, by_letters.likelihood_rule_agreement) == (4, 0.0)
    assert by_digits.rm_rule_agreement is None and by_digits.judge_rule_agreement is None
    assert by_digits.headline()["likelihood_rule_agreement"] == 1.0
    assert "of 4 pairs where exactly one is right (50% = blind) | likelihood 100.0% |" in \
        (tmp_path / "by_digits" / "report.md").read_text()
    assert "by the likelihood model, of 4 pairs" in (tmp_path / "by_digits" / "report.html").read_text()


def test_likelihood_model_needs_a_reference_and_a_model_folder(assets: dict[str, Path], tmp_path: Path) -> None:
    from alignctl.preflight import preflight

    with pytest.raises(UserError, match="'likelihood_model' needs 'reference'"):
        load_config(EvalConfig, None, ["policy=p", "prompts=x.parquet", "likelihood_model=m"])
    cfg = load_config(EvalConfig, None, [f"policy={assets['digits']}", f"reference={assets['letters']}",
                                         f"prompts={assets['data'] / 'test.parquet'}", f"out={tmp_path / 'out'}",
                                         f"likelihood_model={tmp_path / 'missing'}"])
    with pytest.raises(UserError, match="likelihood_model"):
        preflight(cfg)


def test_reward_model_built_to_prefer_digits(assets: dict[str, Path], digits_vs_letters: EvalResults) -> None:
    from transformers import AutoTokenizer

    res = digits_vs_letters
    assert res.win_rate == 1.0 and res.win_rate_ci == (1.0, 1.0) and res.lc_win_rate == 1.0
    assert res.wins == 10 * 2 * 2
    first = res.samples[0]
    assert set(first["policy"][0]["text"]) <= set(DIGITS) and len(first["policy"][0]["text"]) == 8
    assert set(first["reference"][0]["text"]) <= set(LETTERS) and first["reference"][0]["truncated"]
    # Every reward equals the closed form of the constructed model, computed from token ids here.
    tok = AutoTokenizer.from_pretrained(assets["rm"])
    rows = pd.read_parquet(assets["data"] / "test.parquet")
    for sample, messages in zip(res.samples, rows["prompt"]):
        prompt = [{"role": m["role"], "content": m["content"]} for m in messages]
        for role in ("policy", "reference"):
            for resp in sample[role]:
                assert resp["reward"] == pytest.approx(expected_rm_score(tok, prompt, resp["text"]), abs=1e-5)
    swapped = evaluate(model=assets["letters"], prompts=assets["data"] / "test.parquet", reward_model=assets["rm"],
                       reference=assets["digits"], max_new_tokens=8, num_bootstrap=200, max_prompts=4)
    assert swapped.win_rate == 0.0 and swapped.win_rate_ci == (0.0, 0.0) and swapped.losses == 4


def test_saved_reward_statistics_standardise_the_scores(assets: dict[str, Path], digits_vs_letters: EvalResults,
                                                        tmp_path: Path) -> None:
    from alignctl.eval.scoring import RewardScorer
    from alignctl.trainers import rm_trainer as rm_stage

    assert (REWARD_MEAN_KEY, REWARD_STD_KEY) == (rm_stage.REWARD_MEAN_KEY, rm_stage.REWARD_STD_KEY)
    normed = tmp_path / "rm_normed"
    shutil.copytree(assets["rm"], normed)
    config = json.loads((normed / "config.json").read_text())
    config.update({REWARD_MEAN_KEY: 2.0, REWARD_STD_KEY: 0.5})
    (normed / "config.json").write_text(json.dumps(config))
    raw = digits_vs_letters
    std = evaluate(model=assets["digits"], prompts=assets["data"] / "test.parquet", reward_model=normed,
                   reference=assets["letters"], n=2, do_sample=True, max_new_tokens=8, num_bootstrap=200)
    assert std.rewards_normalized and not raw.rewards_normalized
    assert std.mean_reward == pytest.approx((raw.mean_reward - 2.0) / 0.5, abs=1e-9)
    assert std.reference_reward_quantiles["p50"] == pytest.approx((raw.reference_reward_quantiles["p50"] - 2.0) / 0.5)
    assert std.win_rate == raw.win_rate == 1.0  # a monotone map changes no comparison
    conversation = [([{"role": "user", "content": "Tom has 3 pens."}], [{"role": "assistant", "content": "12"}])]
    scores = [RewardScorer(str(normed), device="cpu", dtype="float32", batch_size=4, max_length=None,
                           normalize=flag, progress=False).score(conversation, "x")[0] for flag in (False, True)]
    assert scores[1] == pytest.approx((scores[0] - 2.0) / 0.5, abs=1e-12)


def _html_external_refs(html: str) -> list[str]:
    """src/href/srcset values of real tags (parsed, so escaped text cannot fool it) that point
    anywhere but an embedded data: URI or an in-page anchor."""
    from html.parser import HTMLParser

    refs: list[str] = []

    class Collector(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            refs.extend(v or "" for k, v in attrs if k in ("src", "href", "srcset", "action", "data"))
            if tag == "link" or (tag == "script" and any(k == "src" for k, _ in attrs)):
                refs.append(f"<{tag}>")

    Collector().feed(html)
    return [r for r in refs if not r.startswith(("data:", "#"))]


@dataclass
class Report:
    results: EvalResults
    out: Path
    pair_scores: list[tuple[float, float]]  # closed-form (chosen, rejected) RM scores of the pairs


@pytest.fixture(scope="module")
def report(assets: dict[str, Path]) -> Report:
    """run_eval on the constructed models, with preference pairs, a run folder, and one prompt whose
    text is HTML/markdown that must come out escaped."""
    from transformers import AutoTokenizer

    prompts = pd.read_parquet(assets["data"] / "test.parquet")
    prompts.at[0, "prompt"] = [{"role": "user", "content": HOSTILE}]
    prompts_file = assets["root"] / "hostile_test.parquet"
    prompts.to_parquet(prompts_file)
    # Preference pairs for the digit-fraction RM: it prefers the reply with the larger digit
    # fraction. Rows 0-2: chosen has more digits (ranked right); rows 3-4: rejected has more
    # (wrong); row 5: identical replies, an exact tie (wrong: ties count as wrong) -> 3 / 6.
    question = [{"role": "user", "content": "Tom has 3 pens. How many pens does Tom have now?"}]
    replies = [("3 + 4 = 7. #### 7", "Tom has seven pens"), ("#### 12", "twelve"), ("1111", "11ab"),
               ("Tom has pens", "#### 3"), ("pens", "99"), ("#### 5", "#### 5")]
    pairs = pd.DataFrame({"prompt": [question] * 6,
                          "chosen": [[{"role": "assistant", "content": c}] for c, _ in replies],
                          "rejected": [[{"role": "assistant", "content": r}] for _, r in replies]})
    pairs.to_parquet(assets["root"] / "pairs.parquet")
    tok = AutoTokenizer.from_pretrained(assets["rm"])
    pair_scores = [(expected_rm_score(tok, question, c), expected_rm_score(tok, question, r)) for c, r in replies]
    out = assets["root"] / "report"
    cfg = load_config(EvalConfig, None, [
        f"policy={assets['digits']}", f"reference={assets['letters']}", f"reward_model={assets['rm']}",
        f"prompts={prompts_file}", f"preference_data={assets['root'] / 'pairs.parquet'}",
        f"run={assets['run']}", f"out={out}", "max_new_tokens=8", "num_bootstrap=200", "max_samples_in_report=10"])
    return Report(run_eval(cfg, progress=False), out, pair_scores)


def test_run_eval_writes_a_complete_report(report: Report) -> None:
    res, out = report.results, report.out
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [".alignctl-output", "generations.json", "manifest.json", "plots/reward_histogram.png",
                     "plots/reward_vs_length.png", "plots/training_curves.png", "report.html", "report.md",
                     "results.json"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "eval" and manifest["metrics"]["win_rate"] == 1.0
    assert "results.json" in manifest["outputs"]
    saved = json.loads((out / "results.json").read_text())
    assert saved["win_rate"] == 1.0 and len(saved["samples"]) == 10 and saved["out_dir"] == str(out.absolute())

    # Preference consistency on the hand-made pairs (see the fixture): 3 of 6 ranked right.
    assert res.preference == {"accuracy": 0.5, "pairs": 6.0, "ties": 1.0, "mean_margin": pytest.approx(
        np.mean([c - r for c, r in report.pair_scores]), abs=1e-5)}
    assert res.preference_accuracy == 0.5

    # Run curves: the NaN metric is dropped, the rest summarised with first/last values.
    assert res.curve_summary["critic/score/mean"] == pytest.approx({"first": 0.1, "last": 0.5, "min": 0.1, "max": 0.5,
                                                                   "steps": 5.0})
    assert "actor/pg_loss" not in res.curves and "val-core/arith/acc/mean@1" in res.curves

    html = (out / "report.html").read_text()
    assert _html_external_refs(html) == []
    assert html.count('src="data:image/png;base64,') == 3
    assert "<h2>Win rate</h2>" in html and "100.0%" in html and "<h2>Preference consistency</h2>" in html
    # The hostile prompt is shown as text: escaped, never as live markup.
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    md = (out / "report.md").read_text()
    assert "| reward model: win rate vs reference (ties ½) | **100.0%**" in md and "![training curves](plots/training_curves.png)" in md
    # Neither constant model answers an arith question: by the rule every pair is a tie.
    assert res.rule_win_rate == 0.5 and "| win rate by the rule (right beats wrong, else a tie) | **50.0%**" in md
    assert "Win rate by the rule (right beats wrong)" in html
    # In markdown the prompt sits in a fence longer than its own backtick run, so it cannot escape.
    assert "````text\n" + HOSTILE + "\n````" in md


def test_reference_responses_are_reused_only_when_everything_matches(assets: dict[str, Path], report: Report,
                                                                   tmp_path: Path) -> None:
    """reuse_generations: a second policy against the same reference takes the reference's responses
    from the earlier output (shown by planting marked texts under the stored fingerprint); a
    different generation setting or a rewritten weights file means generating them again."""
    source = tmp_path / "earlier"
    shutil.copytree(report.out, source)
    stored = json.loads((source / "generations.json").read_text())
    assert set(stored) == {"policy", "reference"}
    assert stored["reference"]["texts"] == [[s["reference"][0]["text"]] for s in report.results.samples]
    stored["reference"]["texts"] = [[f"planted {i}"] for i in range(len(stored["reference"]["texts"]))]
    (source / "generations.json").write_text(json.dumps(stored))
    common = [f"reference={assets['letters']}", f"prompts={report.results.config['prompts']}", "num_bootstrap=200",
              f"reuse_generations=[{source}]"]

    outs = iter(range(3))

    def run(*extra: str) -> EvalResults:
        out = f"out={tmp_path / f'eval{next(outs)}'}"
        return run_eval(load_config(EvalConfig, None, [f"policy={assets['random']}", *common, *extra, out]),
                        progress=False)

    reused = run("max_new_tokens=8")
    assert reused.reused_generations == {"reference": str(source)}
    assert [s["reference"][0]["text"] for s in reused.samples] == [f"planted {i}" for i in range(10)]
    assert any("reference responses reused from" in note for note in reused.notes)
    other = run("max_new_tokens=6")  # another setting: another fingerprint
    assert other.reused_generations == {}
    assert not any(s["reference"][0]["text"].startswith("planted") for s in other.samples)
    weights = assets["letters"] / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # as if retrained in place
    try:
        assert run("max_new_tokens=8", "seed=0").reused_generations == {}
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_reuse_generations_must_name_existing_folders(assets: dict[str, Path], tmp_path: Path) -> None:
    from alignctl.preflight import preflight

    cfg = load_config(EvalConfig, None, [f"policy={assets['random']}", f"prompts={assets['data'] / 'test.parquet'}",
                                         f"reuse_generations=[{tmp_path / 'missing'}]", f"out={tmp_path / 'out'}"])
    with pytest.raises(UserError, match=r"reuse_generations\[0\] .*missing: no such folder"):
        preflight(cfg)


def test_config_errors_name_the_key(assets: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(UserError, match="n=4 with do_sample=false"):
        load_config(EvalConfig, None, ["policy=p", "prompts=x.parquet", "n=4"])
    with pytest.raises(UserError, match="'policy' is required"):
        load_config(EvalConfig, None, ["prompts=x.parquet"])
    with pytest.raises(UserError, match="'temprature' is not a config key"):
        evaluate(model=assets["random"], prompts=["hi"], temprature=0.5)
    with pytest.raises(UserError, match="no metrics.jsonl"):
        evaluate(model=assets["digits"], prompts=["Tom has 3 pens."], run=str(tmp_path), max_new_tokens=2)


def test_python_prompts_without_reference_or_reward_model(assets: dict[str, Path]) -> None:
    res = evaluate(model=assets["digits"], prompts=["Tom has 3 pens.", [{"role": "user", "content": "Ann?"}]],
                   max_new_tokens=5)
    assert res.num_prompts == 2 and res.win_rate is None and res.mean_reward is None and res.accuracy == {}
    assert [len(s["policy"][0]["text"]) for s in res.samples] == [5, 5]


def test_report_renders_in_headless_chromium(report: Report, tmp_path: Path) -> None:
    from browser import chromium_or_skip

    chromium = chromium_or_skip()  # a failure, not a skip, under CI=1
    out = report.out
    shot = tmp_path / "report.png"
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1280,2400", f"--screenshot={shot}", (out / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape == (2400, 1280, 3)
    # A rendered page, not a blank one: many distinct colours (text, plots, tags), and the policy
    # blue of the win-rate bar and histogram (#2563eb) is on screen.
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 200
    assert np.any(np.all(image == (0x25, 0x63, 0xEB), axis=-1))


def _negated_reward_model(source: Path, out: Path) -> Path:
    """``source`` with its score head negated: it prefers whatever ``source`` ranks last."""
    from transformers import AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(source)
    with torch.no_grad():
        rm.score.weight.neg_()
    rm.save_pretrained(out)
    shutil.copy(source / "tokenizer.json", out)
    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, out)
    return out


def test_a_judge_that_disagrees_with_the_training_reward_is_warned_about(assets: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """The digit policy's manifest says it was trained against the digit reward model; a judge with
    the score head negated prefers letters, so it reverses the verdict: win rate 1.0 by the reward
    model, 0.0 by the judge, and the eval says so."""
    from alignctl.pipeline.manifest import write_manifest

    policy = tmp_path / "digits_policy"
    shutil.copytree(assets["digits"], policy)
    write_manifest(policy, stage="rl-policy", config={}, extra={"base_model": str(assets["letters"]),
                                                                "reward_model": str(assets["rm"])})
    judge = _negated_reward_model(assets["rm"], tmp_path / "letter_judge")
    common = dict(prompts=assets["data"] / "test.parquet", reward_model=assets["rm"], max_new_tokens=8,
                  num_bootstrap=200, max_prompts=6)
    res = evaluate(model=policy, judge_model=judge, **common)  # the reference comes from the manifest
    assert res.config["reference"] == str(assets["letters"])
    assert res.win_rate == 1.0 and res.judge_win_rate == 0.0 and res.judge_win_rate_ci == (0.0, 0.0)
    assert res.rm_trained_policy is True
    assert len(res.warnings) == 1 and "training reward model prefers the policy" in res.warnings[0]
    assert "the judge model does not (win rate 0.000" in res.warnings[0] and not res.notes
    alone = evaluate(model=policy, **common)
    assert alone.warnings == [] and "judged by the reward model the policy was trained against" in alone.notes[0]
    out = tmp_path / "report"
    from alignctl.eval.evaluation import write_outputs

    write_outputs(res, out)
    assert "the judge model does not" in (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "Independent judge: policy preferred" in html and "Training reward model (not independent)" in html
    assert html.index("Independent judge") < html.index("Training reward model")  # the independent verdict first


def test_answers_two_models_share_are_scored_once_and_tie_exactly(assets: dict[str, Path]) -> None:
    from types import SimpleNamespace

    from alignctl.eval.evaluation import role_scores
    from alignctl.eval.scoring import RewardScorer

    scorer = RewardScorer(str(assets["rm"]), device="cpu", dtype="float32", batch_size=2, max_length=None,
                          normalize=False, progress=False)
    scored: list[int] = []
    plain = scorer._score_unique
    scorer._score_unique = lambda seqs, lengths, desc: (scored.append(len(seqs)), plain(seqs, lengths, desc))[1]  # type: ignore[method-assign]
    rows = [SimpleNamespace(messages=[{"role": "user", "content": f"Tom has {i} pens."}]) for i in range(3)]
    gens = {"policy": SimpleNamespace(texts=[["12"], ["7 apples"], ["3"]]),
            "reference": SimpleNamespace(texts=[["12"], ["seven"], ["3"]])}
    scores = role_scores(scorer, rows, gens, "judging")  # type: ignore[arg-type]
    # 6 answers, 4 distinct (prompt, answer) sequences, one scorer call; batch size 2 puts the
    # shared answers of prompt 0 in other batches than prompt 2's, and still they tie bit for bit.
    assert scored == [4]
    assert scores["policy"].shape == scores["reference"].shape == (3, 1)
    assert scores["policy"][0, 0] == scores["reference"][0, 0] and scores["policy"][2, 0] == scores["reference"][2, 0]
    alone = RewardScorer(str(assets["rm"]), device="cpu", dtype="float32", batch_size=2, max_length=None,
                         normalize=False, progress=False)
    convs = [(r.messages, [{"role": "assistant", "content": t[0]}]) for r, t in zip(rows, gens["reference"].texts)]
    assert alone.score(convs, "x") == pytest.approx(scores["reference"][:, 0], abs=1e-5)
    # Scores an earlier eval stored for the reference's answers are taken, for the policy's equal
    # answers too (still exact ties): only the policy's "7 apples" is scored.
    scored.clear()
    stored = {"reference": np.array([[100.0], [200.0], [300.0]])}
    again = role_scores(scorer, rows, gens, "judging", known=stored)  # type: ignore[arg-type]
    assert scored == [1]
    assert again["reference"][:, 0].tolist() == [100.0, 200.0, 300.0]
    assert again["policy"][0, 0] == 100.0 and again["policy"][2, 0] == 300.0
    assert again["policy"][1, 0] == pytest.approx(scores["policy"][1, 0], abs=1e-5)
    # Stored scores of another shape (a hand-edited generations.json) are not taken: all 4 are scored.
    scored.clear()
    role_scores(scorer, rows, gens, "judging", known={"reference": np.array([[1.0], [2.0]])})  # type: ignore[arg-type]
    assert scored == [4]


def test_a_later_eval_takes_the_judge_scores_stored_with_the_responses(assets: dict[str, Path], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The quickstart's two evals share the reference's answers and the judge: the second takes the
    judge's scores of those answers from the first, and scores only the policy's own answers."""
    from alignctl.eval.scoring import RewardScorer

    judge = _negated_reward_model(assets["rm"], tmp_path / "judge")
    common = dict(prompts=assets["data"] / "test.parquet", reference=assets["letters"], judge_model=judge,
                  max_new_tokens=8, num_bootstrap=100, max_prompts=6)
    scored: list[int] = []
    plain = RewardScorer._score_unique
    monkeypatch.setattr(RewardScorer, "_score_unique",
                        lambda self, seqs, lengths, desc: (scored.append(len(seqs)), plain(self, seqs, lengths, desc))[1])
    first = evaluate(model=assets["digits"], out=tmp_path / "first", **common)
    assert scored == [12]  # 6 policy + 6 reference answers, all distinct
    stored = json.loads((tmp_path / "first" / "generations.json").read_text())
    (key, reference_scores), = stored["reference"]["scores"].items()
    assert list(stored["policy"]["scores"]) == [key]
    scored.clear()
    second = evaluate(model=assets["random"], reward_model=assets["rm"], out=tmp_path / "second",
                      reuse_generations=[str(tmp_path / "first")], **common)
    assert second.reused_generations == {"reference": str(tmp_path / "first")}
    # The reward model scores both sides (6 + 6); the judge only the new policy's 6 answers.
    assert scored == [12, 6]
    again = json.loads((tmp_path / "second" / "generations.json").read_text())
    assert again["reference"]["scores"][key] == reference_scores  # taken, bit for bit
    assert len(again["reference"]["scores"]) == 2 and len(again["policy"]["scores"]) == 2  # + the reward model
    # The same verdicts as an eval that scores everything itself.
    fresh = evaluate(model=assets["random"], reward_model=assets["rm"], **common)
    assert (second.judge_win_rate, second.judge_win_rate_ci) == (fresh.judge_win_rate, fresh.judge_win_rate_ci)
    assert first.judge_win_rate == 0.0  # the negated judge prefers the letter reference to all-digit answers


@pytest.mark.parametrize("packed", [True, False])
def test_pairs_are_scored_in_one_call_and_match_the_closed_form(assets: dict[str, Path], packed: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """score_pairs sends chosen and rejected to one scorer call (so a pair's prompt is computed once
    for both replies); each side equals the digit-fraction model's closed form, computed from token
    ids here, and a pair with identical replies ties exactly. Both layouts: packed rows with shared
    prompts (CPU) and right-padded batches (what resolve_packing picks on a GPU without flash-attn)."""
    from transformers import AutoTokenizer

    from alignctl.eval.scoring import RewardScorer
    from alignctl.models import attention

    monkeypatch.setattr(attention, "resolve_packing", lambda setting, device: packed)
    tok = AutoTokenizer.from_pretrained(assets["rm"])
    scorer = RewardScorer(str(assets["rm"]), device="cpu", dtype="float32", batch_size=3, max_length=None,
                          normalize=False, progress=False)
    assert scorer.packed is packed
    assert scorer.model.config._attn_implementation == (attention.SEGMENT_SDPA if packed else "sdpa")
    calls: list[int] = []
    plain = scorer._score_unique
    scorer._score_unique = lambda seqs, lengths, desc: (calls.append(len(seqs)), plain(seqs, lengths, desc))[1]  # type: ignore[method-assign]
    say = [{"role": "user", "content": "Tom has 3 pens."}], [{"role": "user", "content": "Ann has 12 pens."}]
    reply = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
    pairs = [(say[0], reply("12"), reply("twelve")), (say[1], reply("7 apples"), reply("3 + 4 = 7")),
             (say[1], reply("9"), reply("9"))]
    chosen, rejected = scorer.score_pairs(pairs, "pairs")
    assert calls == [5]  # six replies, five distinct sequences, one call
    np.testing.assert_allclose(chosen, [expected_rm_score(tok, p, c[0]["content"]) for p, c, _ in pairs], atol=1e-5)
    np.testing.assert_allclose(rejected, [expected_rm_score(tok, p, r[0]["content"]) for p, _, r in pairs], atol=1e-5)
    assert chosen[2] == rejected[2] and chosen[0] > rejected[0]


def test_rm_precision_bf16_scores_under_autocast_close_to_the_closed_form(assets: dict[str, Path]) -> None:
    """eval's rm_precision=bf16: the score head computes in bf16 (float32 without it), and
    every reward stays within bf16 rounding of the digit-fraction model's closed form (computed
    from token ids in float64 here): 8 mantissa bits are ~0.4% per rounding and a forward rounds a
    few times, so 2% relative; float32 gives the same rewards to 1e-5."""
    from transformers import AutoTokenizer

    from alignctl.eval.scoring import RewardScorer

    tok = AutoTokenizer.from_pretrained(assets["rm"])
    rows = pd.read_parquet(assets["data"] / "test.parquet")
    prompts = [[{"role": m["role"], "content": m["content"]} for m in messages] for messages in rows["prompt"]]
    replies = ["12", "7 apples", "3 + 4 = 7", "none"]
    conversations = [(p, [{"role": "assistant", "content": r}]) for p in prompts for r in replies]
    expected = np.array([expected_rm_score(tok, p, r[0]["content"]) for p, r in conversations])
    for precision, dtype, rel in (("bf16", torch.bfloat16, 2e-2), ("float32", torch.float32, 1e-5)):
        scorer = RewardScorer(str(assets["rm"]), device="cpu", dtype="float32", batch_size=8, max_length=None,
                              normalize=False, progress=False, precision=precision)
        seen: list[torch.dtype] = []
        scorer.model.score.register_forward_hook(lambda _m, _args, out: seen.append(out.dtype))
        scores = scorer.score(conversations, precision)
        assert seen and set(seen) == {dtype}, precision
        np.testing.assert_allclose(scores, expected, rtol=rel, atol=1e-6 if precision == "float32" else 1e-3)


def test_rm_precision_reaches_the_scorer_through_eval(assets: dict[str, Path]) -> None:
    """evaluate(rm_precision='bf16') scores under autocast: the digit model still wins every pair and
    each reward is within bf16 rounding of the float32 eval's."""
    common = dict(model=assets["digits"], prompts=assets["data"] / "test.parquet", reward_model=assets["rm"],
                  reference=assets["letters"], max_new_tokens=8, num_bootstrap=100, max_prompts=4)
    fp32, bf16 = evaluate(**common), evaluate(rm_precision="bf16", **common)
    assert bf16.win_rate == fp32.win_rate == 1.0
    for a, b in zip(fp32.samples, bf16.samples):
        for role in ("policy", "reference"):
            assert b[role][0]["text"] == a[role][0]["text"]
            assert b[role][0]["reward"] == pytest.approx(a[role][0]["reward"], rel=2e-2)
    assert any(b[r][0]["reward"] != a[r][0]["reward"] for a, b in zip(fp32.samples, bf16.samples) for r in ("policy",))
    with pytest.raises(UserError, match="rm_precision"):
        load_config(EvalConfig, None, ["policy=x", "prompts=y", "rm_precision=fp16"])
