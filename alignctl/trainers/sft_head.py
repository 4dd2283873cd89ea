"""SFT's loss head on a CPU: score only the completion tokens.

``trl.SFTTrainer`` patches the model with a fused LM head (``trl.trainer.utils.add_fused_lm_head``)
and calls it with ``fused_lm_head=True``. On devices with Triton it projects only the positions
whose label counts; elsewhere it projects every position, prompt and padding included, through
torch tiles over the whole vocabulary. On the quickstart's SFT batches (8 rows of 92 columns, 207
completion tokens, SmolLM2's 49152-token vocabulary) that made a forward + backward 4.7 s where
projecting the 207 label positions takes 3.5 s (2 CPU cores).

:func:`use_label_positions_head` wraps the patched forward: with ``fused_lm_head=True`` on a
non-CUDA device it runs the backbone, projects the label positions only (a token chunk at a time,
each checkpointed so its logits never stay in memory for backward) and returns TRL's
``FusedCausalLMOutput`` with the fields the trainer reads (loss, per-token log-probs, entropy,
top-1 hits, label mask). Anything it does not cover (CUDA, MoE router losses, logit scaling or
soft-capping, temperature) goes to TRL's own path unchanged.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from alignctl.models.forward import logprob_entropy_chunk

TOKEN_CHUNK = 1024
_SCALING_KEYS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def _chunk_outputs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log p(label), entropy (detached: TRL only reports it) and whether the label is the first
    argmax, per row; the log-softmax and entropy are the RL forward's (``models.forward``)."""
    logits = F.linear(hidden, weight, bias)
    label_log_probs, entropy = logprob_entropy_chunk(logits, labels, 1.0, True)
    return label_log_probs, entropy.detach(), logits.detach().argmax(-1) == labels


def label_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``hidden`` [N, H] at the label positions, ``labels`` [N] -> (log-probs, entropy, top-1) [N]."""
    outs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for start in range(0, hidden.shape[0], TOKEN_CHUNK):
        args = (hidden[start:start + TOKEN_CHUNK], weight, bias, labels[start:start + TOKEN_CHUNK])
        grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        outs.append(checkpoint(_chunk_outputs, *args, use_reentrant=False) if grad else _chunk_outputs(*args))
    if not outs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, torch.zeros(0, dtype=torch.bool, device=hidden.device)
    return tuple(torch.cat(parts) for parts in zip(*outs))  # type: ignore[return-value]


def _covered(model: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the label-positions head computes what TRL's would for this call."""
    text = model.config.get_text_config()
    if any(getattr(text, key, None) is not None for key in _SCALING_KEYS):
        return False
    if kwargs.get("output_router_logits") or getattr(text, "output_router_logits", False):
        return False
    head = model.get_output_embeddings()
    return head is not None and head.weight.device.type != "cuda"


def use_label_positions_head(model: Any) -> None:
    """Wrap the forward TRL patched (see the module docstring). A model TRL did not patch (no
    ``fused_lm_head`` in its forward) is left alone."""
    trl_forward = model.forward
    if "fused_lm_head" not in getattr(trl_forward, "__code__", types.SimpleNamespace(co_varnames=())).co_varnames:
        return
    from trl.trainer.utils import FusedCausalLMOutput

    def forward(self: Any, *args: Any, fused_lm_head: bool = False, labels: torch.Tensor | None = None,
                shift_labels: torch.Tensor | None = None, num_items_in_batch: Any = None, **kwargs: Any) -> Any:
        if not fused_lm_head or not _covered(self, kwargs):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        if shift_labels is None:
            assert labels is not None
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        mask = labels != -100
        head = self.get_output_embeddings()
        logp, entropy, top1 = label_log_probs(hidden[mask], head.weight, head.bias, labels[mask])
        per_token = [torch.zeros(mask.shape, dtype=x.dtype, device=mask.device).masked_scatter(mask, x)
                     for x in (logp, entropy, top1)]
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-per_token[0].sum() / count, log_probs=per_token[0], entropy=per_token[1],
                                   is_top1=per_token[2], label_mask=mask)

    model.forward = types.MethodType(forward, model)
