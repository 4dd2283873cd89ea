"""``train-rm`` with ``score_from: likelihood``: a causal LM as the reward model, scoring a reply by
beta x its summed log-probability. The scores are checked against an independent slow reference
(one forward per reply token, the reply found by rendering the prompt alone with the generation
prompt, not by the marker search the library uses), in training, in the saved folder and through
the scorer PPO and eval use."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from alignctl.errors import UserError
from tests.test_reward_model import _rm_trainer, rm_config
from tests.test_sft import make_arith_setup


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_arith_setup(tmp_path_factory.mktemp("rm-likelihood"), num_pref=24, num_test=6)


def _ids(encoded: object) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)  # type: ignore[index]


def slow_reply_log_prob(model: object, tokenizer: object, prompt: list[dict], reply: list[dict]) -> float:
    """Sum of log p(token t | tokens < t) over the reply, one unpadded forward per token (reference)."""
    full = _ids(tokenizer.apply_chat_template(prompt + reply, tokenize=True))  # type: ignore[attr-defined]
    head = _ids(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))  # type: ignore[attr-defined]
    assert full[:len(head)] == head  # the reply follows the rendered prompt
    total = 0.0
    with torch.no_grad():
        for t in range(len(head), len(full)):
            logits = model(input_ids=torch.tensor([full[:t]])).logits[0, -1].double()  # type: ignore[operator]
            total += float(torch.log_softmax(logits, dim=-1)[full[t]])
    return total


def test_reply_marker_is_the_generation_prompt_and_the_start_follows_its_last_copy(small: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    from alignctl.models.reply_likelihood import reply_marker, reply_start

    tokenizer = AutoTokenizer.from_pretrained(small[1])
    marker = reply_marker(tokenizer)
    prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    head = _ids(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    full = _ids(tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": "7"}], tokenize=True))
    assert marker and head[-len(marker):] == marker
    assert reply_start(full, marker) == len(head)
    other = [t for t in range(30, 60) if t not in marker][:3]
    assert reply_start(full + marker + other[:2], marker) == len(full) + len(marker)  # the last copy counts
    assert reply_start(other, marker) == 1 and reply_start(other, []) == 1  # absent: from token 1
    assert reply_start(other + marker, marker) == len(other) + len(marker) - 1  # at least one token is scored


@pytest.fixture(scope="module")
def trained(small: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - RMResult
    from alignctl.trainers.rm_trainer import run_train_rm

    data, model = small
    out = tmp_path_factory.mktemp("likelihood-rm") / "rm"
    cfg = rm_config(model, data / "pref_train.parquet", data / "pref_test.parquet", out, "score_from=likelihood",
                    "likelihood_beta=0.5", "optim.lr=1e-3", "trainer.micro_batch_size=4", "trainer.max_steps=3")
    return run_train_rm(cfg, progress=False)


def test_saved_likelihood_rm_is_a_marked_causal_lm_scoring_like_the_reference(small: tuple[Path, Path],
                                                                               trained) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignctl.eval.scoring import RewardScorer

    data, _ = small
    out = trained.output_dir
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"][0].endswith("ForCausalLM") and config["alignctl_reward_kind"] == "likelihood"
    assert config["alignctl_likelihood_beta"] == 0.5 and config["alignctl_reply_marker"]
    assert trained.metrics["train/steps"] == 3

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    rows = pd.read_parquet(data / "pref_test.parquet")
    scorer = RewardScorer(str(out), device="cpu", dtype="float32", batch_size=4, max_length=None, normalize=False,
                          progress=False)
    pairs = [(list(rows.prompt[k]), list(rows.chosen[k]), list(rows.rejected[k])) for k in range(len(rows))]
    chosen, rejected = scorer.score_pairs(pairs, "pairs")
    for k, (prompt, good, bad) in enumerate(pairs):
        want_good = 0.5 * slow_reply_log_prob(model, tokenizer, prompt, good)
        want_bad = 0.5 * slow_reply_log_prob(model, tokenizer, prompt, bad)
        assert chosen[k] == pytest.approx(want_good, abs=1e-4) and rejected[k] == pytest.approx(want_bad, abs=1e-4)
        # train-rm's own held-out scores (TRL's padded batches, the patched forward) are the same numbers
        at = trained.eval_rows.index(k)
        assert trained.eval_chosen[at] == pytest.approx(want_good, abs=1e-4)
        assert trained.eval_rejected[at] == pytest.approx(want_bad, abs=1e-4)
    assert len({round(float(v), 5) for v in [*chosen, *rejected]}) > 6  # replies differ, so do their scores
    accuracy = sum(c > r for c, r in zip(trained.eval_chosen, trained.eval_rejected)) / len(trained.eval_rows)
    assert trained.metrics["val/accuracy"] == pytest.approx(accuracy)

    # Normalised with the mean / std train-rm stored, as PPO's reward worker reads it.
    normal = RewardScorer(str(out), device="cpu", dtype="float32", batch_size=4, max_length=None, normalize=True,
                          progress=False).score_pairs(pairs, "pairs")[0]
    mean, std = config["alignctl_reward_mean"], config["alignctl_reward_std"]
    assert std > 0 and normal == pytest.approx((chosen - mean) / std, abs=1e-6)


def test_the_first_training_loss_is_the_bradley_terry_loss_of_the_start_models_likelihoods(
        small: tuple[Path, Path], tmp_path: Path) -> None:
    """The loss of step 1 (before its update): TRL's logged loss is -log sigmoid(beta x (log p(chosen) - log p(rejected)))
    of the untouched start model, averaged over the pairs of the step (reference computed here)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignctl.trainers.rm_trainer import run_train_rm

    data, model_dir = small
    cfg = rm_config(model_dir, data / "pref_train.parquet", None, tmp_path / "rm", "score_from=likelihood",
                    "likelihood_beta=2.0", "optim.lr=1e-3", "trainer.micro_batch_size=24", "trainer.max_steps=1",
                    "data.val_fraction=0", "trainer.logging_steps=1")
    result = run_train_rm(cfg, progress=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = pd.read_parquet(data / "pref_train.parquet")
    losses = []
    for k in range(len(rows)):
        prompt = list(rows.prompt[k])
        delta = (slow_reply_log_prob(model, tokenizer, prompt, list(rows.chosen[k]))
                 - slow_reply_log_prob(model, tokenizer, prompt, list(rows.rejected[k])))
        losses.append(-math.log(1 / (1 + math.exp(-2.0 * delta))))
    assert result.metrics["train/pairs"] == len(rows) == 24
    assert result.metrics["train/loss_start"] == pytest.approx(sum(losses) / len(losses), rel=1e-3)


def test_likelihood_needs_a_chat_template(small: tuple[Path, Path], tmp_path: Path) -> None:
    from alignctl.trainers.rm_trainer import run_train_rm

    data, model_dir = small
    plain = tmp_path / "plain"
    shutil.copytree(model_dir, plain)
    settings = json.loads((plain / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(settings))
    for extra in plain.glob("chat_template.*"):
        extra.unlink()
    cfg = rm_config(plain, data / "pref_train.parquet", None, tmp_path / "rm", "score_from=likelihood")
    with pytest.raises(UserError, match="score_from=likelihood needs a tokenizer whose chat template") as err:
        run_train_rm(cfg, progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "rm").exists()
    with pytest.raises(UserError, match="likelihood_beta"):
        rm_config(model_dir, data / "pref_train.parquet", None, tmp_path / "rm", "likelihood_beta=0").validate()


def test_preflight_takes_a_likelihood_rm_as_a_reward_model_but_not_a_plain_lm(small: tuple[Path, Path],
                                                                               trained) -> None:  # noqa: ANN001
    from alignctl.preflight.context import Context
    from alignctl.preflight.models import check_model

    ctx = Context()
    check_model(str(trained.output_dir), "reward_model.model.path", ctx, "reward")
    with pytest.raises(UserError, match="not a reward model"):
        check_model(str(small[1]), "reward_model.model.path", ctx, "reward")


def test_zero_steps_keeps_the_start_model_and_reports_its_held_out_accuracy(small: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    """trainer.max_steps=0 (likelihood only): the saved weights are the start model's, and the
    held-out accuracy is its likelihood's, recounted here with the slow reference."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignctl.trainers.rm_trainer import run_train_rm

    data, model_dir = small
    cfg = rm_config(model_dir, data / "pref_train.parquet", data / "pref_test.parquet", tmp_path / "rm",
                    "score_from=likelihood", "trainer.max_steps=0")
    result = run_train_rm(cfg, progress=False)
    assert result.metrics["train/steps"] == 0
    saved, start = load_file(result.output_dir / "model.safetensors"), load_file(model_dir / "model.safetensors")
    assert saved.keys() == start.keys() and all(torch.equal(saved[k], start[k]) for k in start)

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = pd.read_parquet(data / "pref_test.parquet")
    right = [slow_reply_log_prob(model, tokenizer, list(r.prompt), list(r.chosen))
             > slow_reply_log_prob(model, tokenizer, list(r.prompt), list(r.rejected)) for r in rows.itertuples()]
    assert result.metrics["val/pairs"] == len(rows) == 6
    assert result.metrics["val/accuracy"] == pytest.approx(sum(right) / len(right))
    with pytest.raises(UserError, match="trainer.max_steps"):  # a score head must train
        rm_config(model_dir, data / "pref_train.parquet", None, tmp_path / "rm2", "trainer.max_steps=0")


def test_zero_steps_scores_under_the_trainers_bf16_autocast(small: tuple[Path, Path], tmp_path: Path) -> None:
    """trainer.precision=bf16 with max_steps 0: nothing trains, so nothing wraps the model's forward in
    autocast; the held-out pairs must still be scored in bf16 (as a trained model's are, and as eval
    scores them with rm_precision bf16), not in float32. Reference: the trainer's own batches through the
    same model, once under torch.autocast(bf16) (must match exactly) and once without (must differ)."""
    from alignctl.trainers.rm_trainer import score_prepared_pairs

    data, model_dir = small
    cfg = rm_config(model_dir, data / "pref_test.parquet", None, tmp_path / "rm",
                    "score_from=likelihood", "trainer.max_steps=0", "trainer.precision=bf16")
    trainer, _, _ = _rm_trainer(cfg, data / "pref_test.parquet")
    assert trainer.args.bf16
    prepared = trainer.train_dataset  # tokenized by TRL
    chosen, rejected = score_prepared_pairs(trainer, prepared)
    got = torch.stack([chosen, rejected], dim=1).flatten()

    def reference(bf16: bool) -> torch.Tensor:
        scores = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for batch in trainer.get_eval_dataloader(prepared):
                out = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
                c, r = out.logits.squeeze(-1).float().chunk(2)
                scores.append(torch.stack([c, r], dim=1).flatten())
        return torch.cat(scores)

    assert torch.equal(got, reference(bf16=True))
    assert not torch.allclose(got, reference(bf16=False), rtol=0, atol=1e-4)  # float32 scores differ


def test_ppo_reward_worker_scores_a_likelihood_rm_normalised(small: tuple[Path, Path], trained,  # noqa: ANN001
                                                             tmp_path: Path) -> None:
    """PPO's reward-model role on the trained likelihood RM (no Ray: the role object itself): each
    response's score is (0.5 x its summed log-probability - mean) / std, the reference computed here."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignctl.batch import Batch
    from alignctl.config.core import to_dict
    from alignctl.workers.worker_process import DistContext
    from alignctl.workers.rm_worker import RewardModelWorker
    from rl_helpers import rl_config

    data, model_dir = small
    assets = {"data": data, "model": model_dir, "reward": model_dir}
    cfg = rl_config(assets, tmp_path / "run", "reward_model.enable=true", f"reward_model.model.path={trained.output_dir}")
    worker = RewardModelWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg))
    prompt = [{"role": "user", "content": "What is 5 + 7 - 2?"}]
    texts = ["5 + 7 = 12. 12 - 2 = 10. #### 10", "5 + 7 = 13. 13 - 2 = 11. #### 11", "#### 10"]
    got = worker.compute_rm_score(Batch(lists={"response_text": texts, "raw_prompt": [prompt] * 3}))["rm_scores"]
    config = json.loads((trained.output_dir / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(trained.output_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(trained.output_dir)
    for text, score in zip(texts, got.tolist()):
        raw = 0.5 * slow_reply_log_prob(model, tokenizer, prompt, [{"role": "assistant", "content": text}])
        assert score == pytest.approx((raw - config["alignctl_reward_mean"]) / config["alignctl_reward_std"], abs=1e-4)


def _conversations(tokenizer: object, rows: pd.DataFrame) -> list[list[int]]:
    """Token ids of every chosen and rejected conversation, a pair's two next to each other."""
    seqs = []
    for k in range(len(rows)):
        for side in ("chosen", "rejected"):
            seqs.append(_ids(tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                list(rows.prompt[k]) + list(rows[side][k]), tokenize=True)))
    return seqs


def test_shared_prompt_scores_and_gradients_equal_the_padded_forwards(small: tuple[Path, Path]) -> None:
    """shared_prompt_likelihood_scores (each prompt once, packed) against likelihood_scores on
    right-padded rows (every sequence whole), the padded forward being the reference: pairs, a group of
    three replies to one prompt, a lone reply and a row without the reply marker; the scores and the
    gradients of their sum agree to float32 rounding, and the shared layout holds fewer tokens."""
    from transformers import AutoTokenizer

    from alignctl.models.attention import SEGMENT_SDPA
    from alignctl.models.forward import pack_shared_prompts
    from alignctl.models.loading import load_causal_lm
    from alignctl.models.reply_likelihood import likelihood_scores, reply_marker, reply_start, shared_prompt_likelihood_scores
    from alignctl.models.reward_forward import reply_layout

    data, model_dir = small
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    marker, pad = reply_marker(tokenizer), int(tokenizer.pad_token_id)
    seqs = _conversations(tokenizer, pd.read_parquet(data / "pref_test.parquet"))[:6]
    prompt = seqs[0][:reply_start(seqs[0], marker)]
    seqs += [prompt + seqs[2][reply_start(seqs[2], marker):], [t for t in seqs[1] if t not in marker][:9]]
    assert reply_start(seqs[-1], marker) == 1  # no marker: scored from its second token
    padded_model = load_causal_lm(str(model_dir), dtype="float32", attn_implementation="sdpa")
    shared_model = load_causal_lm(str(model_dir), dtype="float32", attn_implementation=SEGMENT_SDPA)

    ids, mask, _ = reply_layout(seqs, [0] * len(seqs), pad)
    want = likelihood_scores(padded_model, ids, mask, marker, 0.5)
    got = shared_prompt_likelihood_scores(shared_model, seqs, marker, 0.5, pad)
    assert got.shape == (len(seqs),) and torch.allclose(got, want, rtol=0, atol=1e-4)
    assert float((want[0::2][:3] - want[1::2][:3]).detach().abs().min()) > 1e-3  # a pair's replies score differently
    want.sum().backward()
    got.sum().backward()
    for (name, a), b in zip(padded_model.named_parameters(), shared_model.parameters()):
        assert a.grad is not None and b.grad is not None, name
        assert torch.allclose(b.grad, a.grad, rtol=1e-3, atol=1e-5), name

    starts = [reply_start(s, marker) for s in seqs]
    lay_ids, lay_mask, width_t = reply_layout(seqs, starts, pad)
    rows = pack_shared_prompts(lay_ids, lay_mask, width_t)
    assert sum(int(r.input_ids.numel()) for r in rows) < sum(len(s) for s in seqs) - 3 * len(prompt)


def test_train_rm_held_out_scores_are_the_same_with_and_without_shared_prompts(small: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    """train-rm's held-out scoring of a likelihood model (max_steps 0) with ``share_prompt`` on (each pair's
    prompt once, the CPU default) and off (TRL's padded batches): the same scores to float rounding."""
    from alignctl.trainers.rm_trainer import run_train_rm

    data, model_dir = small
    results = {}
    for share in ("true", "false"):
        cfg = rm_config(model_dir, data / "pref_train.parquet", data / "pref_test.parquet", tmp_path / f"rm-{share}",
                        "score_from=likelihood", "trainer.max_steps=0", f"share_prompt={share}")
        results[share] = run_train_rm(cfg, progress=False)
    shared, padded = results["true"], results["false"]
    assert shared.eval_rows == padded.eval_rows and len(shared.eval_rows) == 6
    assert shared.eval_chosen == pytest.approx(padded.eval_chosen, abs=1e-4)
    assert shared.eval_rejected == pytest.approx(padded.eval_rejected, abs=1e-4)
    assert shared.metrics["val/accuracy"] == padded.metrics["val/accuracy"]
