"""train-rm's ``loss: on_track`` (alignctl/algos/on_track.py, alignctl/trainers/rm_on_track.py): where a
pair parts and the token-level loss against hand-computed values, the trainer's loss against the model run
on each sequence alone, and a run end to end on the tiny model with its bad keys refused before training."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from alignctl.algos.on_track import on_track_loss
from alignctl.errors import UserError
from alignctl.models.reward_forward import pair_prompt_lengths
from tests.test_reward_model import _rm_trainer, rm_config, score
from tests.test_sft import make_arith_setup


def test_where_pairs_part_by_hand() -> None:
    """The trainer reads where each pair parts from pair_prompt_lengths ([chosen..., rejected...] order)."""
    assert pair_prompt_lengths([[1, 2, 3, 4], [1, 2, 9, 9]]) == [2, 2]
    assert pair_prompt_lengths([[5, 6], [7, 6]]) == [0, 0]
    # one reply a prefix of the other: they part at the shorter one's last token, which is scored
    assert pair_prompt_lengths([[1, 2, 3], [1, 2, 3, 4, 5]])[0] == 2 and pair_prompt_lengths([[1, 2, 3, 4], [1, 2]])[0] == 1


def test_on_track_loss_by_hand() -> None:
    """Two pairs; the chosen tokens from the departure on are positives, the rejected ones negatives:
    BCE by hand = mean over the 5 scored tokens of -log sigmoid(s) (chosen) and -log(1 - sigmoid(s))."""
    c1, r1 = torch.tensor([9.0, 9.0, 0.5, 2.0]), torch.tensor([9.0, 9.0, -1.0])
    c2, r2 = torch.tensor([3.0, 0.0]), torch.tensor([3.0, 1.5])
    loss = on_track_loss([c1, c2], [r1, r2], [2, 1])

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    by_hand = (-math.log(sig(0.5)) - math.log(sig(2.0)) - math.log(1 - sig(-1.0))  # pair 1 from token 2
               - math.log(sig(0.0)) - math.log(1 - sig(1.5))) / 5  # pair 2 from token 1
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError, match="expected the same positive number"):
        on_track_loss([c1], [r1, r2], [2])


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_arith_setup(tmp_path_factory.mktemp("rm-on-track"), num_pref=24, num_test=8)


@pytest.mark.parametrize("share", ["true", "false"])
def test_trainer_loss_equals_the_model_on_each_sequence_alone(small: tuple[Path, Path], tmp_path: Path,
                                                              share: str) -> None:
    """The trainer's loss on a collated batch of 4 pairs == the on-track BCE recomputed from the model run
    on each sequence alone (score head on every hidden state, departures by a plain loop) + 0.5 x the
    Bradley-Terry loss of the last tokens; the shared-prompt and padded forwards give the same."""
    data, model = small
    cfg = rm_config(model, data / "pref_train.parquet", None, tmp_path / "rm", "loss=on_track", "bt_weight=0.5",
                    f"share_prompt={share}")
    trainer, _, _ = _rm_trainer(cfg, data / "pref_train.parquet")
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch))

    net = trainer.model
    sequences = [row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
    with torch.no_grad():
        alone = [net.score(net.base_model(input_ids=torch.tensor([s])).last_hidden_state[0]).squeeze(-1) for s in sequences]
    terms, last = [], []
    for i in range(4):
        c, r = sequences[i], sequences[i + 4]
        k = 0
        while k < min(len(c), len(r)) - 1 and c[k] == r[k]:
            k += 1
        terms += [-torch.nn.functional.logsigmoid(x) for x in alone[i][k:]]
        terms += [-torch.nn.functional.logsigmoid(-x) for x in alone[i + 4][k:]]
        last.append(alone[i][-1] - alone[i + 4][-1])
    bt = torch.stack([-torch.nn.functional.logsigmoid(d) for d in last]).mean()
    expected = torch.stack(terms).mean() + 0.5 * bt
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert loss.requires_grad


def test_on_track_run_end_to_end(small: tuple[Path, Path], tmp_path: Path) -> None:
    """A short run reports the on-track part of its loss and writes a reward model that Auto classes load and
    score at the last token like any other."""
    from alignctl.trainers.rm_trainer import run_train_rm

    data, model = small
    cfg = rm_config(model, data / "pref_train.parquet", data / "pref_test.parquet", tmp_path / "rm", "loss=on_track",
                    "optim.lr=1e-3", "trainer.micro_batch_size=4", "trainer.total_epochs=2", "trainer.logging_steps=2")
    result = run_train_rm(cfg, progress=False)
    m = result.metrics
    assert m["val/pairs"] == 8 and 0 < m["train/on_track_loss_end"] < 10 and "train/on_track_loss_start" in m
    assert len(set(round(r, 6) for r in result.eval_chosen + result.eval_rejected)) > 8  # not a constant model
    # The saved folder is an ordinary reward model: Auto classes score a held-out pair as the run did.
    row = pd.read_parquet(data / "pref_test.parquet").iloc[result.eval_rows[0]]
    assert score(result.output_dir, list(row.prompt), list(row.chosen)) == pytest.approx(result.eval_chosen[0], abs=1e-4)


@pytest.mark.parametrize(("overrides", "message"), [
    (["loss=on_track", "score_from=likelihood"], "key 'loss': on_track trains a score head"),
    (["loss=on_track", "bt_weight=-1"], "key 'bt_weight' expected a number >= 0"),
    (["loss=pairs"], "loss"),
])
def test_bad_on_track_keys_are_one_line_errors(small: tuple[Path, Path], tmp_path: Path, overrides: list[str],
                                               message: str) -> None:
    data, model = small
    with pytest.raises(UserError, match=message) as err:
        rm_config(model, data / "pref_train.parquet", None, tmp_path / "rm", *overrides).validate()
    assert "\n" not in str(err.value)
