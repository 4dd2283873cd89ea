"""The on-track loss for reward-model training (``alignctl train-rm`` with ``loss: on_track``).

A preference pair whose rejected reply is a corrupted copy of the chosen one (an arithmetic slip in one
step, a wrong operation, a wrong final number) says more than "chosen > rejected": it says *where* the
rejected reply went wrong, at the first token where it departs from the chosen one. The Bradley-Terry
loss reads one score per reply, at its last token, and leaves the model to find that place itself; on
the quickstart's arith pairs a score head trained that way learned to compare the final number with the
last step and stayed at chance on slips (docs/results.md).

The on-track loss reads the score head at every token of both replies after the point where they part
(their common prefix, prompt included, is not scored) and trains each as a binary classifier with the
cross-entropy of

    chosen token   -> 1   (the reply is still on a right track)
    rejected token -> 0   (it has left it: at and after the first differing token)

so the rejected reply's first wrong token, say the ``4`` of ``7 + 5 = 14``, is itself a labelled
example, next to the ``2`` of the chosen ``12``. The last token is where the score is read afterwards (eval, PPO's
reward, the audit: unchanged); train-rm adds the Bradley-Terry loss of those last-token scores with a
weight (``bt_weight``). This is a process reward model's step-level supervision (Lightman et al. 2023;
Math-Shepherd, Wang et al. 2024) with the steps and their labels read off the pair instead of annotated.

Notation: for pair i, c_i / r_i the chosen / rejected token ids, k_i their common prefix length,
s(x)_t the score at token t; the loss is the mean, over every token t >= k_i of both replies of every
pair, of ``BCE(s(x)_t, label_t)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["on_track_loss"]


def on_track_loss(chosen_scores: Sequence[torch.Tensor], rejected_scores: Sequence[torch.Tensor],
                  departures: Sequence[int]) -> torch.Tensor:
    """Scalar loss from each pair's per-token scores (``[len(sequence)]`` float tensors, every token
    in order) and where the pair parts (k_i: the common prefix length of its two token sequences, capped
    so each keeps a scored token, as ``models.reward_forward.pair_prompt_lengths`` computes it for the
    shared-prompt forward): the token-level cross-entropy above, averaged over all scored tokens of the batch."""
    if not (len(chosen_scores) == len(rejected_scores) == len(departures)) or not departures:
        raise ValueError(f"{len(chosen_scores)} chosen, {len(rejected_scores)} rejected and {len(departures)} "
                         "departures: expected the same positive number of each")
    logits = torch.cat([*(c[k:] for c, k in zip(chosen_scores, departures)),
                        *(r[k:] for r, k in zip(rejected_scores, departures))])
    n_chosen = sum(len(c) - k for c, k in zip(chosen_scores, departures))
    targets = torch.zeros_like(logits)
    targets[:n_chosen] = 1.0
    return F.binary_cross_entropy_with_logits(logits, targets)
