"""A causal language model's own likelihood of a reply: the reply's token boundary, its
log-probabilities, and the summed and per-token mean log-probability of many replies.

Two readers. ``alignctl audit --likelihood-model DIR`` reports how often the chosen reply of a
preference pair gets the higher likelihood: set beside a reward model trained from the same model,
it says whether the reward model uses what the language model already knows (on the quickstart's
arithmetic pairs the SFT model's likelihood ranked 94% of the held-out pairs right while the reward
model trained on top of it reached 71%; docs/audit.md). ``alignctl eval`` with ``likelihood_model``
reports the same on the policy's and the reference's own answers, where exactly one is right
(``likelihood_rule_agreement``): whether a verifier built on that model could tell them apart.

Conversations are tokenized the way :class:`alignctl.eval.scoring.RewardScorer` tokenizes them
(the model's chat template, or the contents joined with eos appended); the reply is what follows
the longest common prefix with the prompt alone (rendered with the generation prompt), so the
chat template's end-of-turn tokens count as part of the reply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from alignctl.console import track
from alignctl.models.reward_forward import common_prefix_length

Messages = list[dict[str, str]]


def prompt_ids(tokenizer: Any, prompt: Messages) -> list[int]:
    """The prompt alone, as the reply's context: with the chat template's generation prompt."""
    if getattr(tokenizer, "chat_template", None):
        from alignctl.tools.chat import render_prompt  # RL's and eval's own rendering of a prompt

        return [int(t) for t in render_prompt(tokenizer, prompt, [])]
    return [int(t) for t in tokenizer("".join(m["content"] for m in prompt))["input_ids"]]


def encode_pair(tokenizer: Any, encode: Any, prompt: Messages, reply: Messages) -> tuple[list[int], int]:
    """(token ids of prompt + reply, index of the first reply token); at least one reply token."""
    full = encode(prompt, reply)
    # The reply's tokens begin where the rendered prompt stops matching the whole conversation.
    start = min(common_prefix_length(prompt_ids(tokenizer, prompt), full), len(full) - 1)
    return full, max(start, 1)  # token 0 has no context to be predicted from


def reply_log_probs(model: Any, rows: list[tuple[list[int], int]], pad_id: int) -> list[np.ndarray]:
    """Log-probabilities of each row's reply tokens (float32), one padded forward pass for all rows."""
    import torch

    from alignctl.batch import pad_rows
    from alignctl.models.reply_likelihood import token_log_probs_from

    device = next(model.parameters()).device
    ids, mask = pad_rows([r[0] for r in rows], pad_id)
    first = min(start for _, start in rows) - 1  # starts are >= 1 (encode_pair)
    with torch.inference_mode():
        logp = token_log_probs_from(model, ids.to(device), mask.to(device), first)
    # Column t of logp is token first + 1 + t: the reply tokens start .. len-1 sit in columns start-first-1 ..
    return [logp[i, start - first - 1:len(seq) - first - 1].cpu().numpy().copy() for i, (seq, start) in enumerate(rows)]


def plain_encoder(tokenizer: Any) -> Any:
    """A RewardScorer that only tokenizes: its rule (chat template, or plain text + eos) without
    truncation, so a reply is encoded as the reward models see it, at its full length."""
    from alignctl.eval.scoring import RewardScorer

    encoder = RewardScorer.__new__(RewardScorer)  # no model: encode() needs only these three
    encoder.tokenizer, encoder.max_length, encoder.truncated = tokenizer, None, 0
    return encoder


def reply_likelihoods(path: str, conversations: list[tuple[Messages, Messages]], *, device: str, batch_size: int,
                      label: str, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """(summed, per-token mean) log-probability of each ``(prompt, reply)``'s reply under the causal
    LM at ``path``, in float32 on ``device``; replies of similar length share a batch."""
    from alignctl.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(path, padding_side="right")
    model = load_causal_lm(path).to(device).eval()
    encode = plain_encoder(tokenizer).encode
    rows = [encode_pair(tokenizer, encode, prompt, reply) for prompt, reply in conversations]
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    order = sorted(range(len(rows)), key=lambda k: len(rows[k][0]))
    found: dict[int, np.ndarray] = {}
    for start in track(range(0, len(order), batch_size), label, enabled=None if progress else False):
        chunk = order[start:start + batch_size]
        found.update(zip(chunk, reply_log_probs(model, [rows[k] for k in chunk], pad)))
    summed = np.array([found[k].sum() for k in range(len(rows))], dtype=np.float64)
    mean = np.array([found[k].mean() for k in range(len(rows))], dtype=np.float64)
    return summed, mean
