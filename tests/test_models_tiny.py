"""Offline tiny models: tokenizer training on local data, HF-loadable output, chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from alignctl.errors import UserError
from alignctl.models.tiny import SPECIAL_TOKENS, init_model, iter_texts

QA = [
    {"question": "What is 12+30?", "answer": "12+30 = 42\n#### 42"},
    {"question": "Tom has 3 apples and eats 1. How many are left?", "answer": "3-1 = 2\n#### 2"},
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    with open(folder / "qa.jsonl", "w") as f:
        for row in QA * 20:
            f.write(json.dumps(row) + "\n")
    # Our preference schema: message lists for prompt/chosen/rejected.
    pd.DataFrame(
        {
            "prompt": [[{"role": "user", "content": "Say hello!"}]] * 10,
            "chosen": [[{"role": "assistant", "content": "Hello there."}]] * 10,
            "rejected": ["Go away."] * 10,
            "data_source": ["unused-column"] * 10,
        }
    ).to_parquet(folder / "pairs.parquet")
    return folder


def test_iter_texts_reads_jsonl_and_parquet_messages(data_dir: Path) -> None:
    texts = set(iter_texts([data_dir]))
    assert texts == {QA[0]["question"], QA[0]["answer"], QA[1]["question"], QA[1]["answer"], "Say hello!", "Hello there.", "Go away."}


def test_bpe_model_loads_with_auto_classes_and_chats(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "tiny"
    info = init_model(out=out, tokenizer_from=data_dir, hidden=32, layers=2, heads=2, vocab_size=300, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert info.vocab_size == len(tok) == model.config.vocab_size <= 300
    assert info.num_parameters == sum(p.numel() for p in model.parameters())
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id == model.config.eos_token_id

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12+30?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>Be brief.<|end|><|user|>What is 12+30?<|end|><|assistant|>"
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    assert tok.decode(ids) == text
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "42"}], tokenize=False)
    assert full.endswith("<|assistant|>42<|end|>")  # the turn ends with eos: generation stops there
    # Byte-level BPE: any text round-trips, including characters never seen in training.
    assert tok.decode(tok("naïve ✓ 7*8")["input_ids"]) == "naïve ✓ 7*8"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))


def test_char_tokenizer_vocabulary_is_the_seen_characters(tmp_path: Path) -> None:
    data = tmp_path / "arith.jsonl"
    data.write_text(json.dumps({"question": "2+3", "answer": "5"}) + "\n")
    init_model(out=tmp_path / "m", tokenizer_from=data, tokenizer_kind="char", hidden=16, layers=1, heads=1)
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    # specials first, then the sorted characters seen: '+', '2', '3', '5'.
    expected = SPECIAL_TOKENS + ["+", "2", "3", "5"]
    assert [tok.convert_ids_to_tokens(i) for i in range(len(tok))] == expected
    assert tok("3+2")["input_ids"] == [expected.index("3"), expected.index("+"), expected.index("2")]
    assert tok.decode(tok("5+5")["input_ids"]) == "5+5"
    assert tok.convert_ids_to_tokens(tok("9")["input_ids"]) == ["<|unk|>"]  # unseen character
    chat = tok.apply_chat_template([{"role": "user", "content": "2+3"}], add_generation_prompt=True)["input_ids"]
    assert tok.convert_ids_to_tokens(chat) == ["<|user|>", "2", "+", "3", "<|end|>", "<|assistant|>"]


def test_seed_determines_weights(tmp_path: Path, data_dir: Path) -> None:
    kwargs = dict(tokenizer_from=data_dir / "qa.jsonl", hidden=16, layers=1, heads=1, tokenizer_kind="char")
    init_model(out=tmp_path / "a", seed=7, **kwargs)
    init_model(out=tmp_path / "b", seed=7, **kwargs)
    init_model(out=tmp_path / "c", seed=8, **kwargs)
    a, b, c = (AutoModelForCausalLM.from_pretrained(tmp_path / n).model.embed_tokens.weight for n in "abc")
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_atomic_output_and_errors(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "m"
    kwargs = dict(tokenizer_from=data_dir / "qa.jsonl", hidden=16, layers=1, heads=1, tokenizer_kind="char")
    init_model(out=out, **kwargs)
    with pytest.raises(UserError, match="already exists"):
        init_model(out=out, **kwargs)
    init_model(out=out, overwrite=True, seed=3, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary folders left behind
    with pytest.raises(UserError, match="does not exist"):
        init_model(out=tmp_path / "x", tokenizer_from=tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="hidden=30, heads=4"):
        init_model(out=tmp_path / "x", tokenizer_from=data_dir / "qa.jsonl", hidden=30, heads=4)
    with pytest.raises(UserError, match="vocab_size=100"):
        init_model(out=tmp_path / "x", tokenizer_from=data_dir / "qa.jsonl", vocab_size=100)
    with pytest.raises(UserError, match="arch 'gpt9'"):
        init_model(out=tmp_path / "x", tokenizer_from=data_dir / "qa.jsonl", arch="gpt9")
    assert not (tmp_path / "x").exists()


def test_tokenizer_from_a_preprocess_output_folder(tmp_path):
    """A preprocess folder holds meta.json next to the parquet files: it is bookkeeping, not data."""
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess

    data = tmp_path / "arith"
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), arith=ArithConfig(num_train=20, num_test=5,
                                                                                       num_sft=10, num_pref=5)),
                   progress=False)
    assert (data / "meta.json").exists()
    info = init_model(out=tmp_path / "m", tokenizer_from=data, tokenizer_kind="char", hidden=32, layers=1)
    assert info.vocab_size > 10
