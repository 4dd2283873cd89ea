"""The advantage-estimator registry: entries declare their needs, config validation and the loop
read them, and the built-in entries give exactly the numbers of the math they wrap."""

from __future__ import annotations

import pytest
import torch

from alignctl.algos import advantages as math_fns
from alignctl.batch import Batch
from alignctl.config import load_config
from alignctl.config.rl import AlgorithmConfig, RLConfig
from alignctl.errors import UserError
from alignctl.trainers.estimators import ADV_ESTIMATORS, compute_advantage, get_adv_estimator, register_adv_estimator
from alignctl.trainers.extra_rollouts import EXTRA_ROLLOUTS

BASE = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "actor_rollout_ref.rollout.n": 2}


def rl(**flags: object) -> RLConfig:
    return load_config(RLConfig, None, [], flags={**BASE, **flags})


@pytest.fixture
def registered():
    """Register test estimators; unregister them afterwards."""
    names: list[str] = []

    def register(name: str, **needs: object):  # type: ignore[no-untyped-def]
        def decorator(fn):  # type: ignore[no-untyped-def]
            names.append(name)
            return register_adv_estimator(name, **needs)(fn)

        return decorator

    yield register
    for name in names:
        if name in ADV_ESTIMATORS:
            ADV_ESTIMATORS.unregister(name)


def test_builtins_declare_their_needs() -> None:
    needs = {name: (e.critic, e.min_group_size, e.extra_rollouts) for name in ADV_ESTIMATORS
             for e in [get_adv_estimator(name)]}
    assert needs == {
        "gae": (True, 1, ()), "reinforce_plus_plus": (False, 1, ()), "remax": (False, 1, ("greedy_baseline",)),
        **{g: (False, 2, ()) for g in ("grpo", "rloo", "opo", "reinforce_plus_plus_baseline", "grpo_passk")},
    }
    assert "greedy_baseline" in EXTRA_ROLLOUTS


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'.*gae.*grpo.*rloo"):
        get_adv_estimator("nope")
    with pytest.raises(ValueError, match=r"unknown extra rollout 'beam'.*greedy_baseline"):
        register_adv_estimator("never", extra_rollouts=("beam",))


def test_a_second_function_under_one_name_is_refused_the_same_one_is_not(registered) -> None:
    def outcome(data, config):  # type: ignore[no-untyped-def]
        return data["token_level_rewards"], data["token_level_rewards"]

    registered("test_outcome")(outcome)
    register_adv_estimator("test_outcome")(outcome)  # a plugin imported twice: no error
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("test_outcome")(lambda data, config: (None, None))


def test_builtin_entries_give_the_numbers_of_the_math() -> None:
    torch.manual_seed(0)
    rewards, values = torch.randn(6, 4), torch.randn(6, 4)
    mask = torch.tensor([[1, 1, 1, 0]] * 3 + [[1, 1, 0, 0]] * 3)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    batch = Batch({"token_level_rewards": rewards, "response_mask": mask, "values": values, "group_index": group,
                   "baseline_rewards": torch.randn(6)})
    algo = AlgorithmConfig(gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=False)
    full = dict(values=values, group_index=group, baseline_rewards=batch["baseline_rewards"], gamma=0.9, lam=0.8,
                norm_adv_by_std=False)
    for name in ADV_ESTIMATORS:
        algo.adv_estimator = name
        out = compute_advantage(batch, algo)
        adv, ret = getattr(math_fns, f"{name}_advantages")(rewards, mask.float(), **full)
        assert torch.equal(out["advantages"], adv) and torch.equal(out["returns"], ret), name


def test_validation_and_the_roles_ask_the_registry(registered) -> None:
    registered("needs_critic_and_four", critic=True, min_group_size=4)(lambda data, config: (None, None))
    cfg = rl(**{"algorithm.adv_estimator": "needs_critic_and_four", "actor_rollout_ref.rollout.n": 4})
    assert cfg.use_critic and cfg.roles == ("actor", "critic")
    with pytest.raises(UserError, match=r"needs_critic_and_four compares responses.*rollout.n >= 4 \(got 3\)"):
        rl(**{"algorithm.adv_estimator": "needs_critic_and_four", "actor_rollout_ref.rollout.n": 3})
    assert not rl(**{"algorithm.adv_estimator": "grpo"}).use_critic
    with pytest.raises(UserError, match=r"rloo compares responses.*>= 2 \(got 1\)"):
        rl(**{"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 1})


def test_estimator_kwargs_are_the_estimators_own_declared_options(registered) -> None:
    registered("with_temp", options={"temp": 0.5, "mode": "soft"})(lambda data, config: (None, None))
    cfg = rl(**{"algorithm.adv_estimator": "with_temp", "algorithm.estimator_kwargs": {"temp": 2}})
    assert cfg.algorithm.estimator_kwargs == {"temp": 2, "mode": "soft"}  # defaults filled in
    with pytest.raises(UserError, match=r"'algorithm.estimator_kwargs': .*'with_temp' has no option 'tmp' "
                                        r"\(its options: mode, temp\)"):
        rl(**{"algorithm.adv_estimator": "with_temp", "algorithm.estimator_kwargs": {"tmp": 2}})
    with pytest.raises(UserError, match=r"'grpo' has no option 'temp' \(its options: none\)"):
        rl(**{"algorithm.estimator_kwargs": {"temp": 2}})
    with pytest.raises(UserError, match="unknown config key 'algorithm.temp'"):
        rl(**{"algorithm.temp": 2})  # outside estimator_kwargs an unknown key stays an error


def test_an_extra_rollout_under_dapo_sampling_is_refused() -> None:
    with pytest.raises(UserError, match=r"remax needs the extra rollout\(s\) greedy_baseline.*filter_groups"):
        rl(**{"algorithm.adv_estimator": "remax", "algorithm.filter_groups.enable": True})
