"""Scoring an eval's answers with a reward model: shared prompts and bf16 against padded rows.

Same process, same reward model, same (prompt, answer) conversations, the sides alternating (A B C D
A B C D) through :class:`alignctl.eval.scoring.RewardScorer`, the class eval, audit and the RL reward
worker use. The baseline is the scorer as it was before shared prompts: padded batches, each sequence
computed whole; for a score head sorted by length and read at the last token
(``models.loading.score_last_token``), for a likelihood reward model (``train-rm score_from:
likelihood``) right-padded rows through ``models.reply_likelihood.likelihood_scores``, loaded with plain
sdpa. Sides: padded and shared prompts, each in float32 and under bf16 autocast (``rm_precision=bf16``).
Reported: shared float32 and shared bf16 against padded float32, and shared bf16 against padded bf16.
Ratios are baseline time / ours.

With ``--eval DIR`` (a finished eval folder: its generations.json and, from its manifest, the
prompts and the judge) it scores that eval's answers with that judge and also prints how often each
side agrees with the baseline on the verdict policy-vs-reference per prompt (win / tie / loss), and
the win rate each gives. Without it, a randomly initialised SmolLM2-135M-shaped reward model scores
two synthetic replies per prompt (timing only; the verdicts of a random model mean nothing).

Run: ``python benchmarks/reward_scoring.py [--eval DIR] [--quick] [--json out.json] [--threads N]``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, set_threads, smollm2_config, summarize, time_interleaved  # noqa: E402

from alignctl.eval.scoring import RewardScorer, response_conversations  # noqa: E402


class PaddedScorer(RewardScorer):
    """The scorer before shared prompts: padded batches, each sequence computed whole."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        if self.likelihood is not None:  # the scorer's own padded path, with the kernel it used
            from alignctl.models.loading import load_causal_lm

            self.model = load_causal_lm(path, dtype=kwargs["dtype"], attn_implementation="sdpa").to(self.device).eval()
            self.packed = False

    def _score_unique(self, sequences: list[list[int]], prompt_lengths: list[int], description: str) -> list[float]:
        import torch

        from alignctl.batch import pad_rows
        from alignctl.device import autocast
        from alignctl.models.loading import score_last_token

        if self.likelihood is not None:
            return super()._score_unique(sequences, prompt_lengths, description)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # less padding
        out = [0.0] * len(sequences)
        with torch.inference_mode(), autocast(self.device, self.precision):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                ids, mask = pad_rows([sequences[i] for i in chunk], int(self.tokenizer.pad_token_id))
                for i, value in zip(chunk, score_last_token(self.model, ids, mask).tolist()):
                    out[i] = value
        return out


def random_reward_model(folder: Path, layers: int) -> str:
    """A SmolLM2-135M-shaped LlamaForSequenceClassification with a tiny word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForSequenceClassification, PreTrainedTokenizerFast

    torch.manual_seed(0)
    LlamaForSequenceClassification(smollm2_config(layers)).save_pretrained(folder)
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{str(i): 3 + i for i in range(1000)}, "+": 1003, "=": 1004}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def synthetic_conversations(count: int) -> list[tuple[list[dict[str, str]], list[dict[str, str]]]]:
    """count // 2 prompts of ~60 tokens with two replies of ~25 each, like an eval's policy and
    reference answers on the quickstart."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count // 2):
        prompt = " ".join(str(v) for v in rng.integers(0, 1000, 60))
        for _ in range(2):
            reply = " ".join(str(v) for v in rng.integers(0, 1000, 25))
            out.append(([{"role": "user", "content": prompt}], [{"role": "assistant", "content": reply}]))
    return out


def eval_conversations(folder: Path) -> tuple[str, list[Any], int]:
    """The judge (or reward model) of a finished eval, and its answers: policy's then reference's."""
    import pandas as pd

    config = json.loads((folder / "manifest.json").read_text())["config"]
    model = config.get("judge_model") or config["reward_model"]
    prompts = [list(p) for p in pd.read_parquet(config["prompts"])[config.get("prompt_key", "prompt")]]
    gens = json.loads((folder / "generations.json").read_text())
    conversations = [c for role in ("policy", "reference") for c in response_conversations(prompts, gens[role]["texts"])]
    return model, conversations, len(prompts)


def verdicts(scores: np.ndarray, prompts: int) -> np.ndarray:
    """+1 / 0 / -1 per prompt: policy's (first n=1 answer) score above, equal to, below the reference's."""
    return np.sign(scores[:prompts] - scores[prompts:2 * prompts])


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", default=None, metavar="DIR", help="a finished eval folder (real judge and answers)")
    parser.add_argument("--quick", action="store_true", help="small workload (smoke run)")
    parser.add_argument("--json", default=None, metavar="OUT")
    parser.add_argument("--threads", type=int, default=None, metavar="N")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.eval:
            model, conversations, prompts = eval_conversations(Path(args.eval))
        else:
            model = random_reward_model(Path(tmp), 4 if args.quick else 30)
            conversations, prompts = synthetic_conversations(32 if args.quick else 400), 0
        common = dict(device="cpu", dtype="float32", batch_size=64, max_length=None, normalize=True, progress=False)
        scorers = {"padded float32": PaddedScorer(model, **common),
                   "shared float32": RewardScorer(model, **common),
                   "padded bf16": PaddedScorer(model, precision="bf16", **common),
                   "shared bf16": RewardScorer(model, precision="bf16", **common)}
        scores = {name: s.score(conversations, name) for name, s in scorers.items()}
        times = time_interleaved({name: (lambda s=s: s.score(conversations, "timed")) for name, s in scorers.items()},
                                 warmup=0, repeats=1 if args.quick else 3)
    base = scores["padded float32"]
    setup: dict[str, Any] = {"model": model if args.eval else "random SmolLM2-shaped", "conversations": len(conversations),
                             "threads": threads}
    for name in ("shared float32", "padded bf16", "shared bf16"):
        setup[f"max_abs_score_gap[{name}]"] = float(np.abs(scores[name] - base).max())
        if prompts:
            ours, theirs = verdicts(scores[name], prompts), verdicts(base, prompts)
            setup[f"verdict_agreement[{name}]"] = float(np.mean(ours == theirs))
            setup[f"win_rate[{name}]"] = float(np.mean((ours + 1) / 2))
    if prompts:
        setup["win_rate[padded float32]"] = float(np.mean((verdicts(base, prompts) + 1) / 2))
    print(json.dumps(setup, indent=1))
    for name, against in (("shared float32", "padded float32"), ("shared bf16", "padded float32"),
                          ("shared bf16", "padded bf16")):
        tag = f"{name}-vs-{against}".replace(" ", "-")
        json_path = None if args.json is None else f"{args.json.removesuffix('.json')}-{tag}.json"
        report(f"reward scoring: {name} vs {against}", summarize(times[name]["wall"])["median"],
               summarize(times[against]["wall"])["median"], "s per scoring pass", setup, higher_is_better=False,
               json_path=json_path)


if __name__ == "__main__":
    main()
