"""Pure sampling math: golden values computed by hand in the comments."""

from __future__ import annotations

import math

import torch

from alignctl.rollout.sampling import sample_from_probs, sample_next, top_k_filter, top_p_filter


def test_top_k_keeps_the_k_largest_and_ties() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    assert torch.equal(top_k_filter(probs, 2), torch.tensor([[0.0, 0.4, 0.0, 0.3]]))
    # all four tie with the 2nd largest -> all kept (HF TopKLogitsWarper keeps ties too)
    flat = torch.full((1, 4), 0.25)
    assert torch.equal(top_k_filter(flat, 2), flat)
    assert torch.equal(top_k_filter(probs, 0), probs)  # disabled
    assert torch.equal(top_k_filter(probs, 4), probs)  # k >= V: nothing to drop


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    # descending 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95
    # p=0.7: drop where mass before >= 0.7 -> keep {0.5, 0.3}
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0.0, 0.5, 0.0, 0.3]]))
    # p=0.85 -> keep {0.5, 0.3, 0.15}
    assert torch.equal(top_p_filter(probs, 0.85), torch.tensor([[0.0, 0.5, 0.15, 0.3]]))
    # p tiny -> the argmax always survives
    assert torch.equal(top_p_filter(probs, 0.01), torch.tensor([[0.0, 0.5, 0.0, 0.0]]))
    # unnormalised weights (x2) give the same nucleus
    assert torch.equal(top_p_filter(probs * 2, 0.7), torch.tensor([[0.0, 1.0, 0.0, 0.6]]))


def test_sample_from_probs_frequencies_and_zero_weights() -> None:
    rows = 20000
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0]]).expand(rows, -1)
    draws = sample_from_probs(weights, torch.Generator().manual_seed(0))
    assert set(draws.unique().tolist()) == {1, 3}
    # P(3) = 3/4; binomial sd = sqrt(0.75 * 0.25 / 20000) = 0.0031 -> 5 sd = 0.0153
    assert abs(draws.eq(3).float().mean().item() - 0.75) < 0.0153


def test_sample_next_temperature_top_k_distribution_and_prefilter_logprob() -> None:
    rows = 20000
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).expand(rows, -1)
    tokens, logp = sample_next(logits, temperature=0.5, top_k=2, top_p=1.0, greedy=False,
                               generator=torch.Generator().manual_seed(1))
    # T = 0.5 squares the weights: 1, 4, 9, 16 (sum 30); top-2 keeps 9 and 16 -> P(3) = 16/25 = 0.64
    assert set(tokens.unique().tolist()) == {2, 3}
    # sd = sqrt(0.64 * 0.36 / 20000) = 0.0034 -> 5 sd = 0.017
    assert abs(tokens.eq(3).float().mean().item() - 0.64) < 0.017
    # reported log-prob is of the tempered distribution BEFORE top-k: log(16/30) or log(9/30)
    expected = torch.where(tokens == 3, math.log(16 / 30), math.log(9 / 30))
    assert torch.allclose(logp, expected.float(), atol=1e-6, rtol=0)


def test_greedy_picks_argmax_with_untempered_logprob() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logp = sample_next(logits, temperature=1.0, top_k=-1, top_p=1.0, greedy=True, generator=None)
    assert tokens.tolist() == [1, 0]
    # row 0: 2 - log(e^0 + e^2 + e^1); row 1: 3 - log(e^3 + 2)
    expected = torch.tensor([2 - math.log(1 + math.e**2 + math.e), 3 - math.log(math.e**3 + 2)])
    assert torch.allclose(logp, expected, atol=1e-6, rtol=0)
