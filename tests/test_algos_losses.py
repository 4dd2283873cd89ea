"""Policy losses, KL estimators, value loss, entropy, Bradley-Terry, KL controllers.

Every golden number is computed by hand in the comment next to it (float64 inputs, atol 1e-6).
"""

from __future__ import annotations

import math

import pytest
import torch

from alignctl.algos import (
    KL_PENALTY_KINDS,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    bradley_terry_loss,
    compute_value_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
    preference_accuracy,
)

TOL = dict(rtol=0.0, atol=1e-6)
F64 = torch.float64


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def _logps(ratios: list[float], logp: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, new) log-probs with new = logp and new - old = log(ratio); new requires grad."""
    new = t([logp]).requires_grad_()
    old = (new - torch.log(t([ratios]))).detach()
    return old, new


# ----------------------------------------------------------------------------- policy losses


def test_policy_loss_registry() -> None:
    assert set(POLICY_LOSSES) == {"vanilla", "gspo", "gpg", "cispo"}
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo2'.*cispo.*vanilla"):
        get_policy_loss("ppo2")


def test_vanilla_ppo_golden_every_branch() -> None:
    # eps_lo = 0.2, eps_hi = 0.28 (clip-higher) -> ratio bounds [0.8, 1.28]; dual clip c = 3.
    # tok  ratio  A    -A*r   -A*clip(r)   max     dual (A<0): min(max, -A*c=3)   clipped?  lower?
    # 0    1.1    1    -1.1   -1.1         -1.1    -                              no        no
    # 1    1.5    1    -1.5   -1.28        -1.28   -                              yes       no
    # 2    0.5   -1     0.5    0.8          0.8    0.8                            yes       no
    # 3    4.0   -1     4.0    1.28         4.0    3.0                            no        yes
    # 4    (masked, junk ratio 50)
    # token-mean = (-1.1 - 1.28 + 0.8 + 3) / 4 = 0.355. Only token 0 is unclipped:
    # d loss / d logp_0 = -A * r / 4 = -1.1 / 4 = -0.275.
    old, new = _logps([1.1, 1.5, 0.5, 4.0, 50.0], [-1.0, -2.0, -0.5, -3.0, -0.1])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, diag = get_policy_loss("vanilla")(
        old, new, t([[1.0, 1.0, -1.0, -1.0, 1.0]]), mask,
        loss_agg_mode="token-mean", clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
    )
    torch.testing.assert_close(loss, t(0.355), **TOL)
    torch.testing.assert_close(diag["pg_clipfrac"], t(2 / 4), **TOL)
    torch.testing.assert_close(diag["pg_clipfrac_lower"], t(1 / 4), **TOL)
    torch.testing.assert_close(diag["ppo_kl"], t(-math.log(1.1 * 1.5 * 0.5 * 4.0) / 4), **TOL)
    loss.backward()
    torch.testing.assert_close(new.grad, t([[-0.275, 0.0, 0.0, 0.0, 0.0]]), **TOL)


def test_vanilla_symmetric_clip_defaults_and_rejects_bad_dual_clip() -> None:
    # clip_ratio 0.2 for both sides: ratio 1.25 with A = 1 clips to 1.2 -> loss -1.2.
    old, new = _logps([1.25], [-1.0])
    loss, _ = get_policy_loss("vanilla")(old, new, t([[1.0]]), torch.ones(1, 1), loss_agg_mode="token-mean")
    torch.testing.assert_close(loss, t(-1.2), **TOL)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        get_policy_loss("vanilla")(old, new, t([[1.0]]), torch.ones(1, 1), loss_agg_mode="token-mean", clip_ratio_c=1.0)


def test_gspo_golden() -> None:
    # Bounds [0.9, 1.1]. Row 0: log-ratios [0.1, 0.3] -> mean 0.2 -> s = e^0.2 = 1.2214 > 1.1,
    # A = 1 -> each token max(-1.2214, -1.1) = -1.1 (clipped, no gradient).
    # Row 1: log-ratios [-0.05, 0.05, 0] -> s = 1, A = -2 -> each token 2 (unclipped).
    # seq-mean-token-mean = (-1.1 + 2) / 2 = 0.45; clipfrac = 2 clipped / 5 tokens = 0.4.
    # Gradient, row 1 token t: d(-A * s_it)/d logp_t = -A * s = 2, times 1/3 (token mean) * 1/2
    # (seq mean) = 1/3.
    new = t([[-1.0, -2.0, 0.0], [-0.5, -1.5, -2.5]]).requires_grad_()
    old = (new - t([[0.1, 0.3, 0.0], [-0.05, 0.05, 0.0]])).detach()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    loss, diag = get_policy_loss("gspo")(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean", clip_ratio=0.1)
    torch.testing.assert_close(loss, t(0.45), **TOL)
    torch.testing.assert_close(diag["pg_clipfrac"], t(0.4), **TOL)
    loss.backward()
    torch.testing.assert_close(new.grad, t([[0.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]), **TOL)


def test_gspo_token_form_gradient_follows_per_token_advantages() -> None:
    # GSPO-token: log-ratios [0.1, -0.1] -> s = e^0 = 1 at both tokens, A = [1, -3], bounds
    # [0.5, 1.5] (no clipping). Token losses -A * s = [-1, 3] -> seq-mean-token-mean = 1.
    # d/dlogp_t = -A_t * s / 2 tokens = [-0.5, 1.5]: each token's own advantage. (GSPO-seq would
    # spread the mean advantage: [0.5, 0.5].)
    new = t([[-1.0, -2.0]]).requires_grad_()
    old = (new - t([[0.1, -0.1]])).detach()
    loss, _ = get_policy_loss("gspo")(
        old, new, t([[1.0, -3.0]]), torch.ones(1, 2), loss_agg_mode="seq-mean-token-mean", clip_ratio=0.5
    )
    torch.testing.assert_close(loss, t(1.0), **TOL)
    loss.backward()
    torch.testing.assert_close(new.grad, t([[-0.5, 1.5]]), **TOL)


def test_gspo_token_form_gradient_equals_sequence_level_gspo() -> None:
    # Reference GSPO-seq written directly: s_i = exp(mean_t log-ratio), loss_i = max(-A_i s_i,
    # -A_i clip(s_i)), loss = mean_i, gradient through every token of s_i. With per-sequence
    # advantages and seq-mean-token-mean, GSPO-token must give the same loss and gradient.
    g = torch.Generator().manual_seed(7)
    B, T = 6, 5
    mask = torch.ones(B, T, dtype=F64)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    old = -torch.rand(B, T, generator=g, dtype=F64)
    new_init = old + torch.randn(B, T, generator=g, dtype=F64) * 0.2
    seq_adv = torch.randn(B, generator=g, dtype=F64)

    new = new_init.clone().requires_grad_()
    loss, _ = get_policy_loss("gspo")(
        old, new, seq_adv.unsqueeze(-1).expand(B, T), mask, loss_agg_mode="seq-mean-token-mean", clip_ratio=0.05
    )
    loss.backward()

    ref_new = new_init.clone().requires_grad_()
    s = torch.exp(((ref_new - old) * mask).sum(-1) / mask.sum(-1))
    ref = torch.maximum(-seq_adv * s, -seq_adv * torch.clamp(s, 0.95, 1.05)).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(new.grad, ref_new.grad, **TOL)
    assert (new.grad != 0).any()


def test_gpg_golden() -> None:
    # l = -logp * A: logp [-1, -2], A [0.5, -1] -> [0.5, -2] -> token-mean -0.75;
    # d/dlogp = -A / 2 = [-0.25, 0.5].
    old, new = _logps([1.0, 1.0], [-1.0, -2.0])
    loss, diag = get_policy_loss("gpg")(old, new, t([[0.5, -1.0]]), torch.ones(1, 2), loss_agg_mode="token-mean")
    torch.testing.assert_close(loss, t(-0.75), **TOL)
    assert diag["pg_clipfrac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(new.grad, t([[-0.25, 0.5]]), **TOL)


def test_cispo_golden() -> None:
    # Bounds [0.8, 1.2]; ratios [1.5, 0.5, 1.0] -> detached weights w = [1.2, 0.8, 1.0].
    # l = -w * A * logp with logp [-1, -2, -0.5], A [1, 1, -2]:
    #   -1.2*1*(-1) = 1.2, -0.8*1*(-2) = 1.6, -1*(-2)*(-0.5) = -1.0 -> token-mean 1.8/3 = 0.6.
    # Gradient -w * A / 3 = [-0.4, -0.8/3, 2/3] (every token keeps a gradient, clipped or not).
    old, new = _logps([1.5, 0.5, 1.0], [-1.0, -2.0, -0.5])
    loss, diag = get_policy_loss("cispo")(old, new, t([[1.0, 1.0, -2.0]]), torch.ones(1, 3), loss_agg_mode="token-mean")
    torch.testing.assert_close(loss, t(0.6), **TOL)
    torch.testing.assert_close(diag["pg_clipfrac"], t(2 / 3), **TOL)
    torch.testing.assert_close(diag["pg_clipfrac_lower"], t(1 / 3), **TOL)
    loss.backward()
    torch.testing.assert_close(new.grad, t([[-0.4, -0.8 / 3, 2 / 3]]), **TOL)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_policy_losses_ignore_masked_junk_and_empty_mask_is_zero(name: str) -> None:
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    new = old + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    keep = mask.bool()
    fn = get_policy_loss(name)
    clean, clean_diag = fn(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean")
    dirty, dirty_diag = fn(
        torch.where(keep, old, -40.0), torch.where(keep, new, 3.0), torch.where(keep, adv, 1e6), mask,
        loss_agg_mode="seq-mean-token-mean",
    )
    assert torch.equal(clean, dirty)
    assert all(torch.equal(clean_diag[k], dirty_diag[k]) for k in clean_diag)
    empty_loss, empty_diag = fn(old, new, adv, torch.zeros_like(mask), loss_agg_mode="token-mean")
    assert empty_loss.item() == 0.0 and all(v.item() == 0.0 for v in empty_diag.values())


# ----------------------------------------------------------------------------- KL


X = t([0.5, -1.0, 0.0])  # logp - ref


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("k1", "kl"), [0.5, -1.0, 0.0]),
        (("abs",), [0.5, 1.0, 0.0]),
        (("k2", "mse"), [0.125, 0.5, 0.0]),  # x^2 / 2
        # exp(-x) - 1 + x: e^-0.5 - 0.5 = 0.1065307, e^1 - 2 = 0.7182818, 0
        (("k3", "low_var_kl"), [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]),
    ],
)
def test_kl_estimators_golden(kinds: tuple[str, ...], expected: list[float]) -> None:
    ref = t([-1.0, -0.5, -2.0])
    for kind in kinds:
        torch.testing.assert_close(kl_penalty(ref + X, ref, kind), t(expected), **TOL)


def test_k3_is_clamped_like_verl() -> None:
    # x = -30: exp(min(30, 20)) - 20 - 1 is huge -> 10. x = 30: exp(-20) + 20 - 1 = 19 -> 10.
    torch.testing.assert_close(kl_penalty(t([-30.0, 30.0]), t([0.0, 0.0]), "k3"), t([10.0, 10.0]), **TOL)


@pytest.mark.parametrize("kind", ["k3+", "low_var_kl+", "k1+", "abs+"])
def test_straight_through_kl_value_of_named_gradient_of_k2(kind: str) -> None:
    g = torch.Generator().manual_seed(5)
    ref = -torch.rand(4, 6, generator=g, dtype=F64)
    init = ref + 0.5 * torch.randn(4, 6, generator=g, dtype=F64)
    weights = torch.randn(4, 6, generator=g, dtype=F64)  # arbitrary upstream gradient
    logp_st = init.clone().requires_grad_()
    logp_k2 = init.clone().requires_grad_()
    st = kl_penalty(logp_st, ref, kind)
    assert torch.equal(st, kl_penalty(init, ref, kind[:-1]))  # forward: the named estimator
    (st * weights).sum().backward()
    (kl_penalty(logp_k2, ref, "k2") * weights).sum().backward()
    assert torch.equal(logp_st.grad, logp_k2.grad)  # backward: exactly k2's gradient


def test_unknown_kl_kind_lists_valid_kinds() -> None:
    assert "k3+" in KL_PENALTY_KINDS and "low_var_kl" in KL_PENALTY_KINDS
    with pytest.raises(ValueError, match=r"unknown KL penalty kind 'full'.*low_var_kl"):
        kl_penalty(X, X, "full")


def test_kl_penalized_rewards_golden() -> None:
    # k1 with beta = 0.5: rewards = score - 0.5 * (logp - ref), masked positions 0.
    # Row 0: [0 - 0.05, 0 - 0.1, 1 - 0.15] ; row 1: [0 - 0.2, 2 - 0.25, masked].
    # batch KL = mean(mean(0.1, 0.2, 0.3), mean(0.4, 0.5)) = mean(0.2, 0.45) = 0.325.
    ref = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    logp = ref + t([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    rewards, batch_kl = kl_penalized_rewards(scores, logp, ref, torch.tensor([[1, 1, 1], [1, 1, 0]]), 0.5, "k1")
    torch.testing.assert_close(rewards, t([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]]), **TOL)
    torch.testing.assert_close(batch_kl, t(0.325), **TOL)


# ----------------------------------------------------------------------------- value loss


def test_value_loss_golden() -> None:
    # c = 0.2, old values 0.5 -> vpreds clipped into [0.3, 0.7].
    # tok  v    R     (v-R)^2   v_clip  (v_clip-R)^2   max    clipped?
    # 0    1.0  1.2   0.04      0.7     0.25           0.25   yes
    # 1    2.0  0.0   4.0       0.7     0.49           4.0    no
    # 2    0.0  1.0   1.0       0.3     0.49           1.0    no
    # 3    masked (junk)
    # loss = 0.5 * (0.25 + 4 + 1) / 3 = 0.875; clipfrac = 1/3.
    # Unclipped (c=None): 0.5 * (0.04 + 4 + 1) / 3 = 0.84. Gradient (clipped case): the
    # clipped-branch token 0 has none; tokens 1, 2: 0.5 * 2 (v - R) / 3 = [2/3, -1/3].
    vpreds = t([[1.0, 2.0, 0.0, 50.0]]).requires_grad_()
    returns, values = t([[1.2, 0.0, 1.0, -7.0]]), t([[0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, 0.2, "token-mean")
    torch.testing.assert_close(loss, t(0.875), **TOL)
    torch.testing.assert_close(clipfrac, t(1 / 3), **TOL)
    loss.backward()
    torch.testing.assert_close(vpreds.grad, t([[0.0, 2 / 3, -1 / 3, 0.0]]), **TOL)
    plain, plain_frac = compute_value_loss(vpreds, returns, values, mask, None)
    torch.testing.assert_close(plain, t(0.84), **TOL)
    assert plain_frac.item() == 0.0


# ----------------------------------------------------------------------------- entropy


def test_entropy_golden() -> None:
    # Uniform over 4 -> ln 4. Logits [0, ln 3] -> p = [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4).
    # Logits [0, 0, 0, 1000] would overflow a naive softmax; the entropy is e^-1000-small, i.e. 0.
    logits = t([[[0.0, 0.0, 0.0, 0.0], [-1e4, -1e4, 0.0, math.log(3.0)], [0.0, 0.0, 0.0, 1000.0]]])
    expected = [math.log(4.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0]
    torch.testing.assert_close(entropy_from_logits(logits), t([expected]), **TOL)


def test_entropy_keeps_its_precision_for_large_logits() -> None:
    # Entropy is shift-invariant: [1e4, 1e4 + 1, 1e4 - 2] has the entropy of [0, 1, -2], i.e. with
    # Z = 1 + e + e^-2: H = ln Z - (1 * e - 2 * e^-2) / Z = 0.7138657579886...
    # (all three logits are exact in float32). In float32, logsumexp(z) - sum p z is off by ~3 nats.
    z = 1.0 + math.e + math.exp(-2.0)
    expected = torch.tensor([math.log(z) - (math.e - 2.0 * math.exp(-2.0)) / z])
    for offset in (0.0, 1e4, 1e5, -1e5):
        logits = torch.tensor([[offset, offset + 1.0, offset - 2.0]], dtype=torch.float32)
        torch.testing.assert_close(entropy_from_logits(logits), expected, **TOL, msg=f"offset {offset}")
    # Two-way by hand in bfloat16 (computed in float32): [0, ln 3] -> p = [1/4, 3/4].
    half = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.bfloat16)
    p = torch.softmax(half.float(), -1)[0]  # ln 3 rounds in bfloat16: use the p it stands for
    torch.testing.assert_close(entropy_from_logits(half), -(p * p.log()).sum().reshape(1), **TOL)


def test_entropy_chunked_equals_unchunked_values_and_gradients() -> None:
    g = torch.Generator().manual_seed(9)
    base = torch.randn(3, 7, 11, generator=g) * 4
    full_in = base.clone().requires_grad_()
    chunk_in = base.clone().requires_grad_()
    full = entropy_from_logits(full_in)
    chunked = entropy_from_logits(chunk_in, chunk_size=4)  # 21 positions -> 6 chunks, last partial
    assert chunked.shape == (3, 7)
    torch.testing.assert_close(chunked, full, rtol=0.0, atol=1e-6)
    weights = torch.randn(3, 7, generator=g)
    (full * weights).sum().backward()
    (chunked * weights).sum().backward()
    torch.testing.assert_close(chunk_in.grad, full_in.grad, rtol=0.0, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(entropy_from_logits(base, chunk_size=5), full.detach(), rtol=0.0, atol=1e-6)


def test_entropy_half_precision_is_computed_in_float32() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    out = entropy_from_logits(logits, chunk_size=1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([math.log(4.0)]), rtol=0.0, atol=1e-6)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


# ----------------------------------------------------------------------------- Bradley-Terry


def test_bradley_terry_golden() -> None:
    # diffs [1, -1]: -log sigmoid(1) = log(1 + e^-1) = 0.3132617, -log sigmoid(-1) = log(1 + e)
    # = 1.3132617 -> mean 0.8132617.
    chosen, rejected = t([2.0, 0.0]), t([1.0, 1.0])
    l1, l2 = math.log1p(math.exp(-1.0)), math.log1p(math.e)
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected), t((l1 + l2) / 2), **TOL)
    # margin [0.5, 0]: diffs [0.5, -1] -> (log(1 + e^-0.5) + l2) / 2.
    with_margin = (math.log1p(math.exp(-0.5)) + l2) / 2
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected, margin=t([0.5, 0.0])), t(with_margin), **TOL)
    # centring 0.01 * mean((2 + 1)^2, (0 + 1)^2) = 0.01 * 5 = 0.05.
    torch.testing.assert_close(
        bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01), t((l1 + l2) / 2 + 0.05), **TOL
    )
    torch.testing.assert_close(preference_accuracy(chosen, rejected), t(0.5), **TOL)


def test_bradley_terry_is_finite_for_huge_margins() -> None:
    chosen = t([0.0]).requires_grad_()
    loss = bradley_terry_loss(chosen, t([1000.0]))
    torch.testing.assert_close(loss, t(1000.0), **TOL)
    loss.backward()
    torch.testing.assert_close(chosen.grad, t([-1.0]), **TOL)  # d/dr_c of -logsigmoid(r_c - r_r)


# ----------------------------------------------------------------------------- KL controllers


def test_adaptive_kl_controller_golden_and_state_roundtrip() -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)  # e = clip(9/6 - 1 = 0.5) = 0.2 -> x (1 + 0.2*256/1e4)
    assert ctrl.value == pytest.approx(0.1 * 1.00512, abs=1e-12)
    ctrl.update(current_kl=5.4, n_steps=256)  # e = 5.4/6 - 1 = -0.1 -> x (1 - 0.1*256/1e4)
    assert ctrl.value == pytest.approx(0.1 * 1.00512 * 0.99744, abs=1e-12)
    restored = AdaptiveKLController(init_kl_coef=1.0, target_kl=1.0, horizon=1.0)
    restored.load_state_dict(ctrl.state_dict())
    assert (restored.value, restored.target, restored.horizon) == (ctrl.value, 6.0, 10000.0)
    with pytest.raises(ValueError, match="expected 'fixed'"):
        FixedKLController(0.1).load_state_dict(ctrl.state_dict())


def test_fixed_kl_controller_and_factory() -> None:
    fixed = make_kl_controller("fixed", kl_coef=0.05)
    fixed.update(current_kl=100.0, n_steps=64)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    assert fixed.state_dict() == {"type": "fixed", "value": 0.05}
    adaptive = make_kl_controller("adaptive", kl_coef=0.2, target_kl=3.0, horizon=100)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="horizon > 0"):
        make_kl_controller("adaptive", kl_coef=0.2, target_kl=3.0, horizon=0)
    with pytest.raises(ValueError, match="valid types: fixed, adaptive"):
        make_kl_controller("pid", kl_coef=0.2)
