"""bf16 copies of the policy for the passes that only read it: the rollout and the reference.

On a CPU with bf16 matrix instructions a bf16 forward multiplies twice as fast as a float32 one and
reads half the bytes. bf16 *autocast* buys little in generation, because every decode step casts
every float32 weight again; a copy whose weights *are* bf16 does not. Training keeps its float32
weights, gradients and optimizer state: RL updates lost most of their gain under bf16 autocast here
(docs/models.md), so only the passes without a gradient move.

The output projection of a copy stays float32 (a separate, untied float32 weight when the model ties
it to the embeddings): the logits feed the sampler and every log-prob, and bf16 logits carry ~0.06 of
rounding at |logit| 16 (the reason ``workers.batch_transfer.float32_output_head`` exists).

The rollout's copy is kept current by the engine's own ``sync_weights((name, tensor) pairs)``, the
path for a rollout that holds its own weights (``workers.actor``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from alignctl.workers.batch_transfer import float32_output_head

DTYPES = {"bfloat16": torch.bfloat16}


def low_precision_copy(model: nn.Module, dtype: str, device: str) -> nn.Module:
    """A frozen eval-mode copy of ``model`` in ``dtype`` on ``device``, its output projection float32."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output projection to keep in float32")
    clone = copy.deepcopy(model).eval().requires_grad_(False).to(device)
    # Parameters only: buffers keep their dtype (rotary inverse frequencies rounded to bf16 would move
    # every position a little).
    for param in clone.parameters():
        param.data = param.data.to(DTYPES[dtype])
    clone_head = clone.get_output_embeddings()
    # Untie: the embeddings stay in dtype, the projection gets its own float32 weight.
    clone_head.weight = nn.Parameter(head.weight.detach().to(device=device, dtype=torch.float32).clone(),
                                     requires_grad=False)
    if getattr(clone_head, "bias", None) is not None:
        clone_head.bias = nn.Parameter(head.bias.detach().to(device=device, dtype=torch.float32).clone(),
                                       requires_grad=False)
    float32_output_head(clone, device)  # casts the bf16 hidden state up before the float32 projection
    return clone
