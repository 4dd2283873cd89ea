"""What the wrong answers of an arith eval are, and whether a causal LM's likelihood of the result
digits alone tells the right answer from the wrong one (docs/quickstart.md, "What the wrong answers are").

    .venv/bin/python scripts/arith_answer_errors.py work/quickstart/eval_ppo-* \
        [--likelihood-model work/quickstart/base_model-*]

For each eval folder (an ``alignctl eval`` output with ``generations.json``; its manifest names the
prompts file) it sorts the policy's and the reference model's greedy answers into

- ``right``: the right number after ``####``;
- ``slip``: some written step ``a + b = c`` or ``a - b = c`` is false;
- ``plan``: every written step is true, the final number is wrong (wrong operands or operations: the
  question was misread);
- ``no_final``: no ``#### N``.

With ``--likelihood-model`` it also scores each answer by the model's summed log-probability of only
the digits after ``=`` and ``####`` (the results of the steps, teacher-forced in the chat-formatted
conversation), and reports, over the pairs where exactly one of the two answers is right, how often the
right one scores higher (0.5 = blind to correctness), and the win rate those scores give the policy.
A verifier of the steps would need the results alone to tell a slip; this measures whether the model
holds that arithmetic.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

STEP = re.compile(r"(-?\d+)\s*([+-])\s*(-?\d+)\s*=\s*(-?\d+)")
RESULT_DIGITS = re.compile(r"(?:=|####)\s*(-?\d+)")
KINDS = ("right", "slip", "plan", "no_final")


class InputError(Exception):
    """Bad input: main prints it as one line and exits with status 2."""


def false_steps(answer: str) -> list[str]:
    """The written steps ``a +/- b = c`` whose arithmetic is wrong, as written."""
    wrong = []
    for left, op, right, result in STEP.findall(answer):
        value = int(left) + int(right) if op == "+" else int(left) - int(right)
        if value != int(result):
            wrong.append(f"{left} {op} {right} = {result}")
    return wrong


def error_kind(answer: str, truth: str) -> str:
    """One of KINDS (module docstring); "right" is the strict reward the eval's accuracy uses."""
    from alignctl.rewards.gsm8k import compute_score, extract_answer

    if compute_score(answer, str(truth)) == 1.0:
        return "right"
    if false_steps(answer):
        return "slip"
    return "no_final" if extract_answer(answer) is None else "plan"


def result_spans(answer: str) -> list[tuple[int, int]]:
    """Character spans of the numbers after ``=`` and ``####`` in ``answer``."""
    return [match.span(1) for match in RESULT_DIGITS.finditer(answer)]


def pair_verdicts(policy: list[float], reference: list[float], policy_right: list[bool],
                  reference_right: list[bool]) -> dict[str, float | int]:
    """Win rate of the policy by the scores (ties half), and the share of pairs with exactly one right
    answer where the right one scores higher (ties half)."""
    wins, agree, decisive = 0.0, 0.0, 0
    for p, r, p_ok, r_ok in zip(policy, reference, policy_right, reference_right, strict=True):
        verdict = 1.0 if p > r else 0.0 if p < r else 0.5
        wins += verdict
        if p_ok != r_ok:
            decisive += 1
            agree += verdict if p_ok else 1.0 - verdict
    return {"win_rate": wins / len(policy), "rule_agreement": agree / decisive if decisive else float("nan"),
            "decisive_pairs": decisive}


class ResultDigitScorer:
    """Summed log-probability of an answer's result digits under a causal LM, in its chat format."""

    def __init__(self, folder: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def __call__(self, prompt: list[dict[str, Any]], answer: str) -> float:
        from alignctl.models.reply_likelihood import token_log_probs_from

        torch = self.torch
        text = self.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
        offset = text.rfind(answer)
        if offset < 0:  # the template rewrote the reply (stripped it, say): its digits cannot be located
            raise InputError(f"the chat template of the likelihood model does not keep the answer {answer!r} as written")
        spans = [(a + offset, b + offset) for a, b in result_spans(answer)]
        encoded = self.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids = torch.tensor([encoded["input_ids"]])
        with torch.no_grad():
            token_logp = token_log_probs_from(self.model, ids, torch.ones_like(ids), 0)[0]
        counted = [i for i, (a, b) in enumerate(encoded["offset_mapping"][1:])
                   if b > a and any(a < end and b > start for start, end in spans)]
        return float(token_logp[counted].sum()) if counted else 0.0


def analyse(eval_dir: Path, scorer: ResultDigitScorer | None) -> dict[str, Any]:
    """Error kinds of the first answer per prompt of the policy and the reference (and their
    result-digit verdicts when ``scorer`` is given), as one JSON-ready dict."""
    import pandas as pd
    from rich.progress import track

    missing = [name for name in ("manifest.json", "generations.json") if not (eval_dir / name).is_file()]
    if missing:
        raise InputError(f"'{eval_dir}' has no {' or '.join(missing)}; expected an alignctl eval output folder")
    manifest = json.loads((eval_dir / "manifest.json").read_text())
    prompts = pd.read_parquet(manifest["config"]["prompts"])
    truths = [str(row["ground_truth"]) for row in prompts["reward_model"]]
    generations = json.loads((eval_dir / "generations.json").read_text())
    answers = {who: [texts[0] for texts in generations[who]["texts"]] for who in ("policy", "reference")}
    report: dict[str, Any] = {"eval": eval_dir.name}
    kinds = {who: [error_kind(text, truth) for text, truth in zip(texts, truths, strict=True)]
             for who, texts in answers.items()}
    for who, per_answer in kinds.items():
        counts = Counter(per_answer)
        report[who] = {kind: counts.get(kind, 0) for kind in KINDS}
    if scorer is not None:
        chats = [list(prompt) for prompt in prompts["prompt"]]
        scores = {who: [scorer(chat, text) for chat, text in
                        track(list(zip(chats, texts, strict=True)), description=f"{eval_dir.name}: {who}")]
                  for who, texts in answers.items()}
        right = {who: [kind == "right" for kind in per_answer] for who, per_answer in kinds.items()}
        report["result_digit_likelihood"] = pair_verdicts(scores["policy"], scores["reference"], right["policy"],
                                                          right["reference"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="+", type=Path, help="alignctl eval output folders")
    parser.add_argument("--likelihood-model", help="a causal LM folder whose result-digit likelihood to test")
    args = parser.parse_args()
    try:
        scorer = ResultDigitScorer(args.likelihood_model) if args.likelihood_model else None
        for eval_dir in args.evals:
            print(json.dumps(analyse(eval_dir, scorer)), flush=True)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
