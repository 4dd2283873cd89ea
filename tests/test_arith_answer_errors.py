"""scripts/arith_answer_errors.py: the error kinds of arith answers and the result-digit likelihood
(docs/quickstart.md, "What the wrong answers are")."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest
import torch

from conftest import REPO_ROOT


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arith_answer_errors", REPO_ROOT / "scripts" / "arith_answer_errors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


errors = _script()


@pytest.mark.parametrize(("answer", "kind"), [
    ("13 + 10 = 23. 23 + 5 = 28. #### 28", "right"),
    ("14 - 9 = 1. 1 - 3 = -2. #### -2", "slip"),      # the first step is false; the second is true
    ("13 + 10 = 23. 23 - 5 = 18. #### 18", "plan"),   # true steps, a misread operation
    ("13 + 10 = 23. 23 + 5 = 28.", "no_final"),
    ("1 + 2 = 4. #### 28", "right"),                  # strict accuracy reads only the number after ####
    ("0 - 2 = 2. #### 2", "slip"),
])
def test_error_kind_by_hand(answer: str, kind: str) -> None:
    assert errors.error_kind(answer, "28") == kind


def test_false_steps_and_result_spans_by_hand() -> None:
    answer = "4 - 1 = 3. 3 + 10 = 31. #### 31"
    assert errors.false_steps(answer) == ["3 + 10 = 31"]
    assert [answer[a:b] for a, b in errors.result_spans(answer)] == ["3", "31", "31"]


def test_pair_verdicts_by_hand() -> None:
    # pairs: policy right & higher (agrees), both wrong (tie in score), policy wrong & higher (disagrees),
    # reference right & higher (agrees)
    verdicts = errors.pair_verdicts([2.0, 1.0, 3.0, 0.0], [1.0, 1.0, 0.0, 5.0],
                                    [True, False, False, False], [False, False, True, True])
    assert verdicts == {"win_rate": (1 + 0.5 + 1 + 0) / 4, "rule_agreement": 2 / 3, "decisive_pairs": 3}


def test_result_digit_likelihood_equals_a_token_by_token_reference(tmp_path: Path) -> None:
    """The scorer's one-pass sum equals the slow reference: one forward pass per scored token over the
    conversation up to it, the log-probability of that token summed (fp32, tolerance 1e-4)."""
    from alignctl.models.tiny import init_model

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "Ann has 13 pens. She finds 10 more. 13 + 10 = 23. #### 23"}) + "\n")
    model_dir = tmp_path / "tiny"
    init_model(out=model_dir, tokenizer_from=corpus, vocab_size=300, hidden=32, layers=2, seed=0)
    scorer = errors.ResultDigitScorer(str(model_dir))
    prompt = [{"role": "user", "content": "Ann has 13 pens. She finds 10 more."}]
    answer = "13 + 10 = 23. #### 23"
    score = scorer(prompt, answer)

    text = scorer.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
    start = text.rfind(answer)
    spans = [(a + start, b + start) for a, b in errors.result_spans(answer)]
    encoded = scorer.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    reference, counted = 0.0, 0
    for position in range(1, len(ids)):
        a, b = offsets[position]
        if not any(a < end and b > begin for begin, end in spans):
            continue
        with torch.no_grad():
            logits = scorer.model(input_ids=torch.tensor([ids[:position]])).logits[0, -1]
        reference += float(torch.log_softmax(logits.double(), dim=-1)[ids[position]])
        counted += 1
    assert counted >= 2  # each "23" is one token or more, however the tokenizer splits it
    assert score == pytest.approx(reference, abs=1e-4)


def test_analyse_reads_an_eval_folder(tmp_path: Path) -> None:
    prompts = tmp_path / "test.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(3)],
                  "reward_model": [{"style": "rule", "ground_truth": t} for t in ("5", "7", "2")]}).to_parquet(prompts)
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "manifest.json").write_text(json.dumps({"config": {"prompts": str(prompts)}}))
    generations = {"policy": {"texts": [["2 + 3 = 5. #### 5"], ["3 + 4 = 8. #### 8"], ["1 + 1 = 2. #### 2"]]},
                   "reference": {"texts": [["2 + 3 = 6. #### 6"], ["3 + 3 = 6. #### 6"], ["1 + 1 = 2."]]}}
    (eval_dir / "generations.json").write_text(json.dumps(generations))
    report = errors.analyse(eval_dir, None)
    assert report["policy"] == {"right": 2, "slip": 1, "plan": 0, "no_final": 0}
    assert report["reference"] == {"right": 0, "slip": 1, "plan": 1, "no_final": 1}


def test_a_folder_that_is_not_an_eval_output_is_one_line_and_status_2(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "arith_answer_errors.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr == (f"error: '{tmp_path}' has no manifest.json or generations.json; "
                           "expected an alignctl eval output folder\n")
