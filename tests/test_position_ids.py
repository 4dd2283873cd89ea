"""One rule for position ids from an attention mask (``models.loading.position_ids_from_mask``),
used by rollout prefill, batch assembly and every training forward: real tokens count from 0 at
the row's first real token, left pads get 0, right pads repeat the last real position (verl's rule).
Pinned by what matters: a padded row's log-probs equal those of the same tokens run unpadded."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from alignctl.models.loading import position_ids_from_mask
from alignctl.rollout.engine import RolloutOutput
from alignctl.workers.sequences import assemble

VOCAB = 40


def test_rule_by_hand() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0],   # left and right padded
                         [1, 1, 1, 1, 1, 1, 1],   # no padding
                         [0, 1, 1, 0, 0, 0, 0]])  # noqa: E241
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2, 2],
                                                     [0, 1, 2, 3, 4, 5, 6],
                                                     [0, 0, 1, 1, 1, 1, 1]]
    assert torch.equal(position_ids_from_mask(mask.bool()), position_ids_from_mask(mask))


def test_assembled_rows_use_the_one_rule() -> None:
    out = RolloutOutput(prompt_index=torch.tensor([0, 1]), sample_index=torch.tensor([0, 0]),
                        response_ids=torch.tensor([[5, 6, 7], [8, 0, 0]]),
                        response_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]), response_lengths=torch.tensor([3, 1]),
                        log_probs=None, finish_reason=["stop", "stop"], pad_token_id=0)
    tensors = assemble([[1, 2], [3, 4, 5]], out, prompt_width=3, response_width=4, pad_id=0)
    # row 0: [pad 1 2 | 5 6 7 pad]; row 1: [3 4 5 | 8 pad pad pad]
    assert tensors["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 4], [0, 1, 2, 3, 3, 3, 3]]
    assert torch.equal(tensors["position_ids"], position_ids_from_mask(tensors["attention_mask"]))


def _tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg)
    else:  # learned absolute positions: a wrong position id changes the output directly
        cfg = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    return model.eval()


def _next_token_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[S, V] logits, [S] ids -> [S-1]: log p(ids[t+1] | ids[..t])."""
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None])[:, 0]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_padded_log_probs_equal_unpadded(kind: str) -> None:
    model = _tiny(kind)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in (5, 9, 3, 7)]
    left = [2, 0, 4, 1]  # pads before (prompt side) and after (response side) each row
    width = max(n + lp for n, lp in zip((5, 9, 3, 7), left)) + 2
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row, lp) in enumerate(zip(rows, left)):
        ids[i, lp:lp + len(row)] = row
        mask[i, lp:lp + len(row)] = 1
    assert (mask[:, -1] == 0).all() and (mask[:, 0] == 0).any()  # right padding everywhere, left in some rows
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        for i, (row, lp) in enumerate(zip(rows, left)):
            alone = model(input_ids=row[None]).logits[0]
            got = _next_token_log_probs(padded[i, lp:lp + len(row)], row)
            torch.testing.assert_close(got, _next_token_log_probs(alone, row), atol=1e-5, rtol=0, msg=f"row {i}")
