"""Advantage estimators: hand-computed goldens, slow pure-Python oracles, invariances, edge cases.

Oracles (``_oracle_*``) are written independently of the library: plain Python floats, explicit
per-row / per-group loops, and masked-in-the-middle tokens handled by COMPACTING each row to its
valid tokens (rather than the library's carry-through recursion).
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from alignctl.algos import advantages as math_fns

# The math by config name (the registry that maps names to entries with needs is tested in
# test_estimator_registry.py; these tests call the torch functions directly).
ADV_ESTIMATORS = {
    "gae": math_fns.gae_advantages, "grpo": math_fns.grpo_advantages, "rloo": math_fns.rloo_advantages,
    "opo": math_fns.opo_advantages, "reinforce_plus_plus": math_fns.reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": math_fns.reinforce_plus_plus_baseline_advantages,
    "remax": math_fns.remax_advantages, "grpo_passk": math_fns.grpo_passk_advantages,
}
get_adv_estimator = ADV_ESTIMATORS.__getitem__

TOL = dict(rtol=0.0, atol=1e-6)
F64 = torch.float64
GROUP_ESTIMATORS = ("grpo", "rloo", "opo", "reinforce_plus_plus_baseline", "grpo_passk")


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def _outcome(scores: list[float], lengths: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded batch with each score on the last valid token."""
    rewards = torch.zeros(len(scores), T, dtype=F64)
    mask = torch.zeros(len(scores), T, dtype=torch.long)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


def _all_kwargs(batch: int, T: int) -> dict[str, object]:
    return {
        "values": torch.zeros(batch, T, dtype=F64),
        "group_index": list(range(batch)),
        "baseline_rewards": torch.zeros(batch, dtype=F64),
    }


# ----------------------------------------------------------------------------- required inputs


@pytest.mark.parametrize(
    ("name", "kwarg"),
    [("gae", "values"), ("grpo", "group_index"), ("remax", "baseline_rewards"), ("opo", "group_index")],
)
def test_missing_required_input_is_a_clear_error(name: str, kwarg: str) -> None:
    kwargs = _all_kwargs(2, 3)
    del kwargs[kwarg]
    with pytest.raises(ValueError, match=kwarg):
        get_adv_estimator(name)(torch.zeros(2, 3, dtype=F64), torch.ones(2, 3), **kwargs)


# ----------------------------------------------------------------------------- goldens


def test_gae_golden_by_hand() -> None:
    # gamma=0.9, lam=0.8, rewards [0, 0, 1], values [0.5, 0.6, 0.7]:
    # t=2: delta = 1 - 0.7 = 0.3                      A2 = 0.3
    # t=1: delta = 0.9*0.7 - 0.6 = 0.03               A1 = 0.03 + 0.72*0.3   = 0.246
    # t=0: delta = 0.9*0.6 - 0.5 = 0.04               A0 = 0.04 + 0.72*0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]; advantages = whiten(A) over valid tokens.
    raw = [0.21712, 0.246, 0.3]
    adv, ret = get_adv_estimator("gae")(
        t([[0.0, 0.0, 1.0]]), torch.ones(1, 3), values=t([[0.5, 0.6, 0.7]]), gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(ret, t([[0.71712, 0.846, 1.0]]), **TOL)
    mean, var = statistics.mean(raw), statistics.variance(raw)  # unbiased variance
    torch.testing.assert_close(adv, t([[(a - mean) / math.sqrt(var + 1e-8) for a in raw]]), **TOL)


def test_gae_skips_masked_positions_inside_a_response() -> None:
    # Multi-turn: position 1 is an observation token (mask 0, junk value 99). The recursion skips
    # it, so valid positions get exactly the GAE of the compacted row [0.5, 0.6, 0.7] above.
    adv, ret = get_adv_estimator("gae")(
        t([[0.0, 5.0, 0.0, 1.0]]), torch.tensor([[1, 0, 1, 1]]), values=t([[0.5, 99.0, 0.6, 0.7]]), gamma=0.9, lam=0.8
    )
    torch.testing.assert_close(ret, t([[0.71712, 0.0, 0.846, 1.0]]), **TOL)
    assert adv[0, 1].item() == 0.0


def test_grpo_and_dr_grpo_golden() -> None:
    # Groups: a = scores [1, 0, 0]; b = [1, 1] (all equal -> 0); c = [0.5] (singleton -> 0).
    # Group a: mean 1/3; unbiased var = ((2/3)^2 + 2*(1/3)^2) / 2 = 1/3; std = sqrt(1/3).
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 1.0, 0.5], [3, 2, 1, 3, 2, 2], T=3)
    ids = ["a", "a", "a", "b", "b", "c"]
    std = math.sqrt(1 / 3)
    adv, ret = get_adv_estimator("grpo")(rewards, mask, group_index=ids, epsilon=1e-6)
    expected = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, t(expected).unsqueeze(-1) * mask, **TOL)
    assert torch.equal(adv, ret)
    dr_adv, _ = get_adv_estimator("grpo")(rewards, mask, group_index=ids, norm_adv_by_std=False)
    torch.testing.assert_close(dr_adv, t([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]).unsqueeze(-1) * mask, **TOL)
    # The same groups given as an int tensor.
    adv_t, _ = get_adv_estimator("grpo")(rewards, mask, group_index=torch.tensor([7, 7, 7, 2, 2, 9]))
    assert torch.equal(adv_t, adv)


def test_rloo_golden() -> None:
    # Group [1, 0, 0]: A0 = 1 - mean(0, 0) = 1; A1 = 0 - mean(1, 0) = -0.5; A2 = -0.5.
    # Group [3, 1]: A = 3 - 1 = 2 and 1 - 3 = -2. Singleton [4]: 0.
    rewards, mask = _outcome([1.0, 0.0, 0.0, 3.0, 1.0, 4.0], [2, 2, 2, 1, 2, 2], T=2)
    adv, _ = get_adv_estimator("rloo")(rewards, mask, group_index=[0, 0, 0, 1, 1, 2])
    torch.testing.assert_close(adv, t([1.0, -0.5, -0.5, 2.0, -2.0, 0.0]).unsqueeze(-1) * mask, **TOL)


def test_opo_golden() -> None:
    # Group 0: scores [1, 0], lengths [1, 3]: b = (1*1 + 3*0) / 4 = 0.25 -> A = [0.75, -0.25].
    # Group 1: scores [2, 4], lengths [2, 2]: b = (4 + 8) / 4 = 3    -> A = [-1, 1].
    rewards, mask = _outcome([1.0, 0.0, 2.0, 4.0], [1, 3, 2, 2], T=3)
    adv, _ = get_adv_estimator("opo")(rewards, mask, group_index=[0, 0, 1, 1])
    torch.testing.assert_close(adv, t([0.75, -0.25, -1.0, 1.0]).unsqueeze(-1) * mask, **TOL)


def test_reinforce_plus_plus_golden() -> None:
    # gamma = 0.5. Row 0 rewards [0, 0, 1] -> G = [0.25, 0.5, 1]. Row 1 rewards [0, 2, junk], mask
    # [1, 1, 0] -> G = [1, 2, 0]. Valid G: 0.25, 0.5, 1, 1, 2: mean 0.95, squared deviations
    # 0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025 = 1.8, unbiased var 1.8 / 4 = 0.45.
    adv, ret = get_adv_estimator("reinforce_plus_plus")(
        t([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), gamma=0.5
    )
    torch.testing.assert_close(ret, t([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]), **TOL)
    s = math.sqrt(0.45 + 1e-8)
    expected = t([[(0.25 - 0.95) / s, (0.5 - 0.95) / s, (1 - 0.95) / s], [(1 - 0.95) / s, (2 - 0.95) / s, 0.0]])
    torch.testing.assert_close(adv, expected, **TOL)


def test_reinforce_plus_plus_baseline_golden() -> None:
    # Groups [1, 0] and [3, 1] -> centred 0.5, -0.5, 1, -1; lengths 2, 2, 1, 1. Token values:
    # 0.5, 0.5, -0.5, -0.5, 1, -1: mean 0, sum of squares 3, unbiased var 3/5 = 0.6.
    rewards, mask = _outcome([1.0, 0.0, 3.0, 1.0], [2, 2, 1, 1], T=2)
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(rewards, mask, group_index=["p", "p", "q", "q"])
    s = math.sqrt(0.6 + 1e-8)
    torch.testing.assert_close(adv, t([[0.5 / s, 0.5 / s], [-0.5 / s, -0.5 / s], [1 / s, 0.0], [-1 / s, 0.0]]), **TOL)


def test_remax_golden() -> None:
    # Row 0: rewards [0, 1, 2] -> G = [3, 3, 2]; greedy baseline 0.5 -> A = [2.5, 2.5, 1.5].
    # Row 1: rewards [1, 1, junk], mask [1, 1, 0] -> G = [2, 1, 0]; baseline 3 -> A = [-1, -2, 0].
    adv, ret = get_adv_estimator("remax")(
        t([[0.0, 1.0, 2.0], [1.0, 1.0, 9.0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), baseline_rewards=t([0.5, 3.0])
    )
    torch.testing.assert_close(ret, t([[3.0, 3.0, 2.0], [2.0, 1.0, 0.0]]), **TOL)
    torch.testing.assert_close(adv, t([[2.5, 2.5, 1.5], [-1.0, -2.0, 0.0]]), **TOL)


def test_grpo_passk_golden() -> None:
    # Group 0 scores [0.2, 1.0, 0.5]: only the best (index 1) gets max - second max = 0.5,
    # divided by the unbiased group std + eps. Group 1 ties at the top [1, 1, 0]: gap 0.
    # Group 2 is a singleton: 0.
    rewards, mask = _outcome([0.2, 1.0, 0.5, 1.0, 1.0, 0.0, 3.0], [1] * 7, T=1)
    ids = [0, 0, 0, 1, 1, 1, 2]
    std0 = statistics.stdev([0.2, 1.0, 0.5])
    adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, group_index=ids, epsilon=1e-6)
    torch.testing.assert_close(adv[:, 0], t([0.0, 0.5 / (std0 + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0]), **TOL)
    raw, _ = get_adv_estimator("grpo_passk")(rewards, mask, group_index=ids, norm_adv_by_std=False)
    torch.testing.assert_close(raw[:, 0], t([0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]), **TOL)


# ----------------------------------------------------------------------------- slow oracles


def _rows(rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None) -> list[dict]:
    """Each row compacted to its valid positions: index list, rewards, values."""
    out = []
    for i in range(rewards.shape[0]):
        idx = [j for j in range(rewards.shape[1]) if mask[i, j]]
        out.append(
            {
                "idx": idx,
                "r": [float(rewards[i, j]) for j in idx],
                "v": [float(values[i, j]) for j in idx] if values is not None else None,
            }
        )
    return out


def _whiten(rows_vals: list[list[float]]) -> list[list[float]]:
    flat = [x for row in rows_vals for x in row]
    if not flat:
        return rows_vals
    mean = statistics.mean(flat)
    var = statistics.variance(flat) if len(flat) > 1 else 0.0
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in rows_vals]


def _scatter(rows: list[dict], per_row: list[list[float]], shape: tuple[int, int]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=F64)
    for i, row in enumerate(rows):
        for j, val in zip(row["idx"], per_row[i]):
            out[i, j] = val
    return out


def _oracle_gae(rewards, mask, values, gamma, lam):  # type: ignore[no-untyped-def]
    rows = _rows(rewards, mask, values)
    raw, rets = [], []
    for row in rows:
        r, v, n = row["r"], row["v"], len(row["r"])
        adv = [0.0] * n
        for k in range(n):  # direct sum definition: A_k = sum_l (gamma*lam)^l delta_{k+l}
            for m in range(k, n):
                v_next = v[m + 1] if m + 1 < n else 0.0
                adv[k] += (gamma * lam) ** (m - k) * (r[m] + gamma * v_next - v[m])
        raw.append(adv)
        rets.append([a + b for a, b in zip(adv, v)])
    return _scatter(rows, _whiten(raw), rewards.shape), _scatter(rows, rets, rewards.shape)


def _oracle_return_to_go(rewards, mask, gamma):  # type: ignore[no-untyped-def]
    rows = _rows(rewards, mask)
    rets = []
    for row in rows:
        r = row["r"]
        rets.append([sum(gamma ** (m - k) * r[m] for m in range(k, len(r))) for k in range(len(r))])
    return rows, rets


def _oracle_rfpp(rewards, mask, gamma):  # type: ignore[no-untyped-def]
    rows, rets = _oracle_return_to_go(rewards, mask, gamma)
    return _scatter(rows, _whiten(rets), rewards.shape), _scatter(rows, rets, rewards.shape)


def _groups(ids: list[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return groups


def _oracle_outcome(rewards, mask, ids, per_group):  # type: ignore[no-untyped-def]
    rows = _rows(rewards, mask)
    scores = [sum(row["r"]) for row in rows]
    adv = [0.0] * len(rows)
    for members in _groups(ids).values():
        s = [scores[i] for i in members]
        if len(set(s)) > 1:  # all-equal and singleton groups keep 0
            for i, a in zip(members, per_group(s, [len(rows[i]["idx"]) for i in members])):
                adv[i] = a
    return _scatter(rows, [[adv[i]] * len(row["idx"]) for i, row in enumerate(rows)], rewards.shape)


def _grpo_group(s, _lengths, eps=1e-6):  # type: ignore[no-untyped-def]
    return [(x - statistics.mean(s)) / (statistics.stdev(s) + eps) for x in s]


def _rloo_group(s, _lengths):  # type: ignore[no-untyped-def]
    return [x - statistics.mean(s[:k] + s[k + 1 :]) for k, x in enumerate(s)]


def _opo_group(s, lengths):  # type: ignore[no-untyped-def]
    total = sum(lengths)
    b = sum(n * x for n, x in zip(lengths, s)) / total if total else 0.0
    return [x - b for x in s]


def _random_batch(seed: int, B: int = 10, T: int = 6) -> dict[str, object]:
    rng = random.Random(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i in range(B):
        n = rng.choice([0, 1, 3, T, T])
        mask[i, :n] = 1
        if n > 2 and rng.random() < 0.5:
            mask[i, rng.randrange(1, n - 1)] = 0  # observation token inside the response
    rewards = torch.tensor([[rng.choice([0.0, 0.0, 1.0, 0.5, -1.0]) for _ in range(T)] for _ in range(B)], dtype=F64)
    values = torch.tensor([[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)], dtype=F64)
    ids = [rng.randrange(4) for _ in range(B)]
    return {"rewards": rewards, "mask": mask, "values": values, "ids": ids}


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_oracle(seed: int) -> None:
    b = _random_batch(seed)
    adv, ret = get_adv_estimator("gae")(b["rewards"], b["mask"], values=b["values"], gamma=0.95, lam=0.9)
    o_adv, o_ret = _oracle_gae(b["rewards"], b["mask"], b["values"], 0.95, 0.9)
    torch.testing.assert_close(ret, o_ret, **TOL)
    torch.testing.assert_close(adv, o_adv, **TOL)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_oracle(seed: int, gamma: float) -> None:
    b = _random_batch(seed)
    adv, ret = get_adv_estimator("reinforce_plus_plus")(b["rewards"], b["mask"], gamma=gamma)
    o_adv, o_ret = _oracle_rfpp(b["rewards"], b["mask"], gamma)
    torch.testing.assert_close(ret, o_ret, **TOL)
    torch.testing.assert_close(adv, o_adv, **TOL)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("name", "per_group"), [("grpo", _grpo_group), ("rloo", _rloo_group), ("opo", _opo_group)])
def test_group_estimators_match_oracle(seed: int, name: str, per_group) -> None:  # type: ignore[no-untyped-def]
    b = _random_batch(seed)
    adv, _ = get_adv_estimator(name)(b["rewards"], b["mask"], group_index=b["ids"])
    torch.testing.assert_close(adv, _oracle_outcome(b["rewards"], b["mask"], b["ids"], per_group), **TOL)


# ----------------------------------------------------------------------------- invariances & edges


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_junk_at_masked_positions_changes_nothing(name: str) -> None:
    b = _random_batch(11)
    keep = b["mask"].bool()
    junk = torch.arange(keep.numel(), dtype=F64).reshape(keep.shape) * 37.0 - 500.0
    kwargs = dict(group_index=b["ids"], baseline_rewards=t([0.3] * keep.shape[0]), gamma=0.9, lam=0.95)
    clean = get_adv_estimator(name)(b["rewards"], b["mask"], values=b["values"], **kwargs)
    dirty = get_adv_estimator(name)(
        torch.where(keep, b["rewards"], junk), b["mask"], values=torch.where(keep, b["values"], -junk), **kwargs
    )
    for c, d in zip(clean, dirty):
        torch.testing.assert_close(d, c, rtol=0.0, atol=0.0)
        assert torch.equal(c[~keep], torch.zeros_like(c[~keep]))  # outputs zeroed on masked tokens


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_empty_masks_give_zeros_not_nan(name: str) -> None:
    B, T = 4, 3
    kwargs = {**_all_kwargs(B, T), "group_index": [0, 0, 1, 1]}
    adv, ret = get_adv_estimator(name)(torch.ones(B, T, dtype=F64), torch.zeros(B, T), **kwargs)
    assert torch.equal(adv, torch.zeros(B, T, dtype=F64))
    assert torch.equal(ret, torch.zeros(B, T, dtype=F64))


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_all_equal_rewards_give_exact_zero(name: str) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: a naive mean would leave ~1e-17 / (std ~1e-17) noise.
    rewards, mask = _outcome([0.1, 0.1, 0.1, 0.7, 0.7], [3, 1, 2, 2, 3], T=3)
    adv, ret = get_adv_estimator(name)(rewards, mask, group_index=[0, 0, 0, 1, 1])
    assert torch.equal(adv, torch.zeros_like(adv))
    assert not torch.isnan(ret).any()


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_singleton_groups_give_zero(name: str) -> None:
    rewards, mask = _outcome([1.0, -2.0, 0.5], [2, 2, 1], T=2)
    adv, _ = get_adv_estimator(name)(rewards, mask, group_index=["x", "y", "z"])
    assert torch.equal(adv, torch.zeros_like(adv))


def test_float32_inputs_stay_float32_and_finite() -> None:
    b = _random_batch(3)
    for name in sorted(ADV_ESTIMATORS):
        adv, ret = get_adv_estimator(name)(
            b["rewards"].float(), b["mask"], values=b["values"].float(), group_index=b["ids"],
            baseline_rewards=torch.zeros(10),
        )
        assert adv.dtype == torch.float32 and ret.dtype == torch.float32, name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
