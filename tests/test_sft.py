"""``alignctl sft`` on TRL's SFTTrainer: completion-only labels, packing isolation, the loss going
down, the artifact, and one-line errors for bad data. Tiny offline models from ``init_model``."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from alignctl.config.core import load_config
from alignctl.config.sft import SFTConfig
from alignctl.errors import UserError


def make_arith_setup(root: Path, *, num_sft: int = 10, num_pref: int = 10, num_test: int = 50,
                     arith: dict | None = None, hidden: int = 32, layers: int = 2,
                     heads: int | None = None) -> tuple[Path, Path]:
    """arith parquet files + a tiny llama whose BPE tokenizer was trained on them: (data, model)."""
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model

    data, model = root / "arith", root / "tiny"
    options = ArithConfig(num_train=10, num_test=num_test, num_sft=num_sft, num_pref=num_pref, **(arith or {}))
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), arith=options), progress=False)
    init_model(out=model, tokenizer_from=sorted(data.glob("*.parquet")), tokenizer_kind="bpe", vocab_size=400,
               hidden=hidden, layers=layers, heads=heads, seed=0)
    return data, model


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_arith_setup(tmp_path_factory.mktemp("sft"), num_sft=256, num_test=16)


def sft_config(data: Path, model: Path, out: Path, *overrides: str) -> SFTConfig:
    base = [f"model.path={model}", f"data.train_files=[{data / 'sft_train.parquet'}]",
            f"data.val_files=[{data / 'sft_test.parquet'}]", f"output_dir={out}", "data.max_length=128"]
    return load_config(SFTConfig, None, [*base, *overrides])


def _trainer(cfg: SFTConfig):  # noqa: ANN202 - a trl.SFTTrainer
    from alignctl.trainers import sft_trainer as sft

    with sft.common.quiet_libraries():
        tokenizer = sft.common.load_tokenizer_for_training(str(cfg.model.path), False)
        train = sft.load_sft_split(cfg.data.train_files, "data.train_files", cfg, tokenizer)
        val = sft.load_sft_split(cfg.data.val_files, "data.val_files", cfg, tokenizer)
        return sft.build_sft_trainer(cfg, tokenizer, train, val, progress=False), tokenizer


def test_prompt_tokens_carry_no_loss(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, model = setup
    trainer, tokenizer = _trainer(sft_config(data, model, tmp_path / "out"))
    rows = pd.read_parquet(data / "sft_train.parquet").head(3)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    for i, row in enumerate(rows.itertuples()):
        # Reference, independent of TRL: the chat template renders prompt + generation prompt,
        # then the reply; exactly the reply tokens (ending with eos <|end|>) are trained on.
        prompt = list(row.prompt)
        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"]
        full_ids = tokenizer.apply_chat_template(prompt + list(row.completion), tokenize=True)["input_ids"]
        n, p = len(full_ids), len(prompt_ids)
        assert batch["input_ids"][i, :n].tolist() == full_ids
        labels = batch["labels"][i]
        assert (labels[:p] == -100).all()
        assert labels[p:n].tolist() == full_ids[p:]
        assert full_ids[-1] == tokenizer.eos_token_id
        assert (labels[n:] == -100).all() and (batch["attention_mask"][i, n:] == 0).all()


def _completion_nll(model_dir: Path, rows: pd.DataFrame, tokenizer) -> float:  # noqa: ANN001
    """Independent reference: mean NLL over all reply tokens, one sequence at a time."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows.itertuples():
            p = len(tokenizer.apply_chat_template(list(row.prompt), add_generation_prompt=True)["input_ids"])
            ids = torch.tensor([tokenizer.apply_chat_template(list(row.prompt) + list(row.completion))["input_ids"]])
            logp = torch.log_softmax(lm(ids).logits[0, :-1].double(), -1)
            target = ids[0, 1:]
            picked = logp.gather(-1, target[:, None])[:, 0][p - 1:]  # predictions of tokens p..n-1
            total -= float(picked.sum())
            count += picked.numel()
    return total / count


def test_sft_lowers_completion_loss_and_writes_artifact(setup: tuple[Path, Path], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from alignctl.trainers.sft_trainer import run_sft

    data, model = setup
    out = tmp_path / "sft-model"
    # All 16 held-out rows in one eval batch, so TRL's eval loss is the token mean over them.
    cfg = sft_config(data, model, out, "optim.lr=3e-3", "trainer.max_steps=100", "trainer.micro_batch_size=16",
                     "trainer.logging_steps=5")
    result = run_sft(cfg, progress=False)
    m = result.metrics
    assert m["train/steps"] == 100 and m["train/rows"] == 256 and m["train/dropped_rows"] == 0
    assert m["val/loss"] < 0.6 * m["val/loss_start"], m
    assert m["train/loss_end"] < m["train/loss_start"], m

    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "manifest.json"} <= files
    assert "training_args.bin" not in files and not any(p.name.startswith(".") for p in tmp_path.iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "sft" and manifest["metrics"]["val/loss"] == pytest.approx(m["val/loss"])
    assert manifest["config"]["trainer"]["max_steps"] == 100

    tokenizer = AutoTokenizer.from_pretrained(out)
    rows = pd.read_parquet(data / "sft_test.parquet")
    assert _completion_nll(out, rows, tokenizer) == pytest.approx(m["val/loss"], abs=1e-4)
    assert _completion_nll(model, rows, tokenizer) == pytest.approx(m["val/loss_start"], abs=1e-4)


def test_packed_eval_loss_equals_padded(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """Packing (TRL bfd, padding-free rows + cu_seq_lens) with alignctl's segment sdpa must give
    the same loss as padded batches: packed rows do not see each other."""
    data, model = setup
    padded, _ = _trainer(sft_config(data, model, tmp_path / "a", "trainer.micro_batch_size=16"))
    packed, _ = _trainer(sft_config(data, model, tmp_path / "b", "trainer.micro_batch_size=16", "packing=true",
                                    "data.max_length=256"))
    assert packed.model.config._attn_implementation == "alignctl_segment_sdpa"
    batch = packed.data_collator([packed.eval_dataset[i] for i in range(len(packed.eval_dataset))])
    assert batch["input_ids"].shape[0] == 1 and len(batch["cu_seq_lens_q"]) > 2
    loss_padded = padded.evaluate()["eval_loss"]
    loss_packed = packed.evaluate()["eval_loss"]
    assert loss_packed == pytest.approx(loss_padded, abs=1e-5)


def test_sft_seeded_runs_are_identical(setup: tuple[Path, Path], tmp_path: Path) -> None:
    from alignctl.trainers.sft_trainer import run_sft

    data, model = setup
    args = ("optim.lr=3e-3", "trainer.max_steps=3", "trainer.micro_batch_size=8", "trainer.logging_steps=1")
    a = run_sft(sft_config(data, model, tmp_path / "a", *args), progress=False).metrics
    b = run_sft(sft_config(data, model, tmp_path / "b", *args), progress=False).metrics
    assert a["train/loss_end"] == b["train/loss_end"] and a["val/loss"] == b["val/loss"]


def test_freeze_layers_trains_only_the_layers_above(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """model.freeze_layers=1 on a 2-layer model: the embeddings (tied with the LM head) and layer 0
    come out bit-identical, layer 1 and the final norm move, and the frozen tensors get no gradient
    (backward never reaches them)."""
    data, model = setup
    trainer, _ = _trainer(sft_config(data, model, tmp_path / "out", "model.freeze_layers=1", "optim.lr=3e-3",
                                     "trainer.max_steps=3", "trainer.micro_batch_size=8"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    frozen = [n for n in before if ".layers.0." in n or "embed_tokens" in n]
    trained = [n for n in before if ".layers.1." in n]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(before[name], after[name]), name
        assert after[name].grad is None and not after[name].requires_grad, name
    moved = [n for n in trained if not torch.equal(before[n], after[n])]
    assert len(moved) == len(trained), sorted(set(trained) - set(moved))


def test_freeze_layers_out_of_range_is_a_one_line_error(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, model = setup
    with pytest.raises(UserError, match="'model.freeze_layers' expected an integer >= 0, got -1"):
        sft_config(data, model, tmp_path / "o", "model.freeze_layers=-1")
    msg = _one_line_error(sft_config(data, model, tmp_path / "o", "model.freeze_layers=3"))
    assert "'model.freeze_layers' is 3 but the model has 2 layers" in msg and str(model) in msg
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------- data shapes


def test_gsm8k_style_rows_become_chat_prompt_completion() -> None:
    import datasets

    from alignctl.trainers.sft_data import to_prompt_completion

    rows = datasets.Dataset.from_list([
        {"prompt": [{"role": "user", "content": "1+1?"}], "extra_info": {"answer": "2 #### 2", "index": 0}},
        {"prompt": [{"role": "user", "content": "2+2?"}], "extra_info": {"answer": "4 #### 4", "index": 1}},
    ])
    ds = to_prompt_completion(rows, "prompt", "extra_info.answer", chat=True, where="gsm8k.parquet")
    assert ds[1] == {"prompt": [{"role": "user", "content": "2+2?"}],
                     "completion": [{"role": "assistant", "content": "4 #### 4"}]}
    plain = datasets.Dataset.from_list([{"question": "q", "response": "r"}])
    assert to_prompt_completion(plain, "question", "response", chat=False, where="x")[0] == \
        {"prompt": "q", "completion": "r"}
    with pytest.raises(UserError, match=r"x row 0 'response': empty text"):
        to_prompt_completion(datasets.Dataset.from_list([{"question": "q", "response": " "}]),
                             "question", "response", chat=True, where="x")


def _one_line_error(cfg: SFTConfig) -> str:
    from alignctl.trainers.sft_trainer import run_sft

    with pytest.raises(UserError) as info:
        run_sft(cfg, progress=False)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_bad_datasets_give_one_line_errors(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, model = setup
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"prompt": ["hi"], "answer": ["there"]}).to_parquet(bad)
    msg = _one_line_error(sft_config(data, model, tmp_path / "o", f"data.train_files=[{bad}]"))
    assert str(bad) in msg and "missing column 'completion'" in msg

    msg = _one_line_error(sft_config(data, model, tmp_path / "o", f"data.train_files=[{tmp_path / 'nope.parquet'}]"))
    assert "nope.parquet" in msg and "not found" in msg

    empty = tmp_path / "empty.parquet"
    pd.DataFrame({"prompt": pd.Series([], dtype=object), "completion": pd.Series([], dtype=object)}).to_parquet(empty)
    msg = _one_line_error(sft_config(data, model, tmp_path / "o", f"data.val_files=[{empty}]"))
    assert str(empty) in msg and "no rows" in msg

    msg = _one_line_error(sft_config(data, tmp_path / "no-model", tmp_path / "o"))
    assert "model.path" in msg and "does not exist" in msg
    assert not (tmp_path / "o").exists()


def test_config_validation_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="'model.path' is required"):
        load_config(SFTConfig, None, ["data.train_files=[a.parquet]"])
    with pytest.raises(UserError, match="'trainer.micro_batch_size' expected a positive integer"):
        load_config(SFTConfig, None, ["model.path=m", "data.train_files=[a]", "trainer.micro_batch_size=0"])
    with pytest.raises(UserError, match="'trainer.deepspeed': .*ds.json is not a file"):
        load_config(SFTConfig, None, ["model.path=m", "data.train_files=[a]", f"trainer.deepspeed={tmp_path / 'ds.json'}"])


def test_pipeline_yaml_loads() -> None:
    from tests.conftest import REPO_ROOT

    cfg = load_config(SFTConfig, REPO_ROOT / "pipelines" / "arith_sft.yaml")
    assert cfg.data.train_files and cfg.model.path
