"""Turning prompts + rollout output into the fixed-width tensors every role consumes.

Row layout (verl's): ``[left-padded prompt (P) | right-padded response (T)]``. ``response_mask``
marks the tokens the policy sampled (the loss mask); the attention mask marks every real token,
which differ only in multi-turn responses (inserted tool messages). Widths are fixed
per step (P = longest prompt of the step, T = max_response_length) so the parts produced by
different ranks concatenate, and packing (use_remove_padding) makes the pads free to compute.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alignctl.batch import Batch, pad_rows
from alignctl.models.loading import position_ids_from_mask
from alignctl.rollout.engine import RolloutOutput


def right_pad(tensor: torch.Tensor, width: int, value: float | int) -> torch.Tensor:
    """Pad (or keep) ``[N, R]`` to ``[N, width]`` on the right."""
    if tensor.shape[1] > width:
        raise ValueError(f"response width {tensor.shape[1]} exceeds max_response_length {width}")
    pad = torch.full((tensor.shape[0], width - tensor.shape[1]), value, dtype=tensor.dtype)
    return torch.cat([tensor.cpu(), pad], dim=1)


def assemble(prompt_ids: Sequence[Sequence[int]], out: RolloutOutput, *, prompt_width: int,
             response_width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Tensors of the ``N = B * n`` responses; prompt ``i`` is repeated for its n samples."""
    prompts, prompt_mask = pad_rows([prompt_ids[int(i)] for i in out.prompt_index], pad_id, width=prompt_width,
                                    side="left")
    responses = right_pad(out.response_ids, response_width, pad_id)
    real = right_pad(out.response_mask.long(), response_width, 0)
    attention_mask = torch.cat([prompt_mask, real], dim=1)
    # The loss (and the reward's position) covers sampled tokens only: in a multi-turn response the
    # inserted tool messages are attended to but were not written by the policy.
    loss_mask = right_pad(out.loss_mask.long(), response_width, 0) if out.loss_mask is not None else real
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": loss_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }
    if out.log_probs is not None:
        tensors["rollout_log_probs"] = right_pad(out.log_probs.float(), response_width, 0.0)
    return tensors


def expand_lists(prompts: Batch, out: RolloutOutput) -> dict[str, list]:
    """The prompt batch's per-prompt lists, one entry per generated response."""
    order = out.prompt_index.tolist()
    lists = {k: [v[i] for i in order] for k, v in prompts.lists.items()}
    lists["finish_reason"] = list(out.finish_reason)
    lists.update({key: list(values) for key, values in out.extras.items()})
    return lists
