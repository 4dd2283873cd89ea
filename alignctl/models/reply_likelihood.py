"""A causal language model used as a reward model: a reply's reward is ``beta`` times its summed
log-probability under the model (``train-rm`` key ``score_from: likelihood``).

Why: a Bradley-Terry head on the last token of a small model learns what a reply looks like, not
whether its arithmetic is right, while the model's own next-token distribution already holds the
arithmetic (on the quickstart's pairs the SFT model's likelihood ranked 94% of the held-out pairs
right, a score head trained on top of it 67-71%; docs/results.md). Trained with the same
Bradley-Terry loss on ``beta x`` summed log-probabilities (a preference loss with no reference model,
as in CPO and SimPO), the model stays a causal LM: the saved folder is a ``*ForCausalLM`` whose
config records ``alignctl_reward_kind: likelihood``, the reply marker and ``beta``. Every scorer (PPO's
reward worker, eval, audit) reads those keys and scores the same way.

The reply is what follows the last occurrence of the chat template's assistant header (its
generation prompt, e.g. ``<|im_start|>assistant\\n``), so the end-of-turn tokens count as part of
it. The marker is found in the token ids themselves, so a padded batch of full conversations, as
TRL's reward collator builds it, needs no side information. A row without the marker (cut from the
left by a length limit) is scored from its second token: prompt tokens then count, which a pair of
replies to one prompt share. Log-probabilities are computed only for the columns at and after the
earliest reply start of the batch: on the quickstart's pairs the prompt is two thirds of a sequence,
and the output layer (vocabulary 49152) is a fifth of a forward pass.

:func:`shared_prompt_likelihood_scores` computes the same scores with each distinct prompt (everything
before a reply) computed once, the replies packed after it (:func:`alignctl.models.forward.compute_log_probs`
with ``share_prompt``): a pair's two replies, or an RL group's four, then cost one prompt instead of
two or four, and no padding. The same math; the sums differ from the padded forward's by float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from alignctl.models.compat import chat_token_ids
from alignctl.models.forward import compute_log_probs
from alignctl.models.loading import position_ids_from_mask
from alignctl.models.reward_forward import attended_rows, common_prefix_length, forward_from_scores, reply_layout

__all__ = ["likelihood_scores", "reply_log_prob_sums", "reply_marker", "reply_start", "shared_prompt_likelihood_scores",
           "token_log_probs_from", "use_likelihood_forward"]

_PROBE = [{"role": "user", "content": "?"}]


def reply_marker(tokenizer: Any) -> list[int]:
    """The token ids a chat template writes before an assistant reply (what
    ``add_generation_prompt`` adds); empty when the tokenizer has no chat template or adds nothing."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    closed = chat_token_ids(tokenizer, _PROBE, add_generation_prompt=False)
    opened = chat_token_ids(tokenizer, _PROBE, add_generation_prompt=True)
    return opened[common_prefix_length(closed, opened):]


def reply_start(sequence: Sequence[int], marker: Sequence[int]) -> int:
    """Index of the first reply token: just after the last ``marker`` in ``sequence``; 1 when the
    marker is absent (token 0 has no context to be predicted from), at most ``len - 1``."""
    width = len(marker)
    start = 1
    if width:
        for i in range(len(sequence) - width, -1, -1):
            if list(sequence[i:i + width]) == list(marker):
                start = i + width
                break
    return max(1, min(start, len(sequence) - 1))


def token_log_probs_from(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         first: int) -> torch.Tensor:
    """Log-probability [B, S - first - 1] (float32, differentiable) of tokens ``first + 1 .. S - 1``
    of each padded row under the causal LM ``model``: column t of the result is token ``first + 1 + t``.
    The output layer runs only on the positions that predict them (it is large: vocabulary x hidden)."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, first:-1]).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, first + 1:, None])[..., 0]


def reply_log_prob_sums(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        starts: Sequence[int]) -> torch.Tensor:
    """Summed log-probability [B] (float32, differentiable) of each right-padded row's tokens from
    ``starts[i]`` to its last attended token, under the causal LM ``model``."""
    device = input_ids.device
    first = max(min(starts) - 1, 0)  # position t predicts token t + 1: nothing before the earliest start - 1 is needed
    token_logp = token_log_probs_from(model, input_ids, attention_mask, first)
    columns = torch.arange(first + 1, input_ids.shape[1], device=device)
    begin = torch.as_tensor(list(starts), device=device)
    counted = (columns[None, :] >= begin[:, None]) & attention_mask[:, first + 1:].bool()
    return (token_logp * counted).sum(dim=-1)


def likelihood_scores(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      marker: Sequence[int], beta: float) -> torch.Tensor:
    """Rewards [B]: ``beta`` x the summed log-probability of each row's reply (module docstring)."""
    starts = [reply_start(row, marker) for row in attended_rows(input_ids, attention_mask)]
    return beta * reply_log_prob_sums(model, input_ids, attention_mask, starts)


def shared_prompt_likelihood_scores(model: Any, sequences: Sequence[Sequence[int]], marker: Sequence[int], beta: float,
                                    pad_id: int, max_tokens_per_row: int | None = None) -> torch.Tensor:
    """Rewards [N] as :func:`likelihood_scores` gives them, with sequences whose prompts (the tokens
    before the reply) are identical packed after one copy of it (module docstring). Needs a model whose
    attention can run packed rows (``alignctl_segment_sdpa``, ``sdpa`` or ``eager``; flash attention
    packs without sharing). Differentiable: train-rm trains through it."""
    device = next(model.parameters()).device
    starts = [reply_start(seq, marker) for seq in sequences]
    ids, mask, width_t = reply_layout(sequences, starts, pad_id)  # the prompt is everything before the reply
    ids, mask = ids.to(device), mask.to(device)
    out = compute_log_probs(_ClassForward(model), ids, mask, width_t, position_ids=position_ids_from_mask(mask),
                            max_tokens_per_row=max_tokens_per_row, share_prompt=True)
    return beta * out.log_probs.sum(dim=-1)  # pads hold 0


class _ClassForward:
    """``model`` called through its class's forward: train-rm patches the instance's forward to
    return scores (:func:`use_likelihood_forward`), and the log-probs need the causal LM's own."""

    def __init__(self, model: Any) -> None:
        self.module = model  # where compute_log_probs looks up the config (as for DDP wrappers)

    def __call__(self, **inputs: Any) -> Any:
        return type(self.module).forward(self.module, **inputs)

    def parameters(self) -> Any:
        return self.module.parameters()


def use_likelihood_forward(model: Any, marker: Sequence[int], beta: float, *, share_prompt: bool = False,
                           pad_id: int = 0) -> None:
    """Make ``model(input_ids, attention_mask)`` of a causal LM return :func:`likelihood_scores` as a
    classifier's ``logits`` [B, 1], the form ``trl.RewardTrainer`` trains; with ``share_prompt``,
    :func:`shared_prompt_likelihood_scores` of the attended tokens of each row (a pair's prompt once).
    Patched on the instance; the saved folder stays a plain causal LM."""
    saved = list(marker)
    if share_prompt:
        forward_from_scores(model, lambda m, ids, mask: shared_prompt_likelihood_scores(
            m, attended_rows(ids, mask), saved, beta, pad_id).to(ids.device))
    else:
        forward_from_scores(model, lambda m, ids, mask: likelihood_scores(m, ids, mask, saved, beta))
