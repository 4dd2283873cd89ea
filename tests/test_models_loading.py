"""Loading causal LMs, tokenizers, value models and reward models from local folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, T5Config

from alignctl.errors import UserError
from alignctl.models.attention import SEGMENT_SDPA
from alignctl.models.loading import (
    VALUE_HEAD_FILE,
    ValueModel,
    last_token_index,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    load_value_model,
    looks_local,
    score_last_token,
)

PAD = 0


def tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=32, pad_token_id=PAD, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("lm")
    LlamaForCausalLM(tiny_config()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("rm")
    config = tiny_config()
    config.num_labels = 1
    LlamaForSequenceClassification(config).save_pretrained(folder)
    return folder


def assert_one_line_user_error(exc: pytest.ExceptionInfo[UserError], *needles: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("loader", [load_causal_lm, load_value_model, load_reward_model])
def test_missing_folder_is_one_line_user_error(tmp_path: Path, loader: object) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(UserError) as exc:
        loader(str(missing))  # type: ignore[operator]
    assert_one_line_user_error(exc, str(missing), "does not exist", "config.json")


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as exc:
        load_causal_lm(tmp_path)
    assert_one_line_user_error(exc, str(tmp_path), "no config.json")


def test_incompatible_architecture(tmp_path: Path) -> None:
    T5Config(d_model=8, d_ff=16, num_layers=1, num_heads=1, vocab_size=20).save_pretrained(tmp_path)
    with pytest.raises(UserError) as exc:
        load_causal_lm(tmp_path)
    assert_one_line_user_error(exc, str(tmp_path), "causal language model")


def test_config_without_weights(tmp_path: Path) -> None:
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(UserError) as exc:
        load_causal_lm(tmp_path)
    assert_one_line_user_error(exc, str(tmp_path))


def test_looks_local() -> None:
    assert not looks_local("Qwen/Qwen2.5-0.5B-Instruct")  # hub id
    for local in ("./models/x", "../x", "/abs/path", "runs/sft/actor", "~/m", "models/"):
        assert looks_local(local), local


def test_load_causal_lm_dtype_and_attention(lm_dir: Path) -> None:
    model = load_causal_lm(lm_dir, dtype="bfloat16", attn_implementation=SEGMENT_SDPA)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config._attn_implementation == SEGMENT_SDPA
    with pytest.raises(UserError, match="float64"):
        load_causal_lm(lm_dir, dtype="float64")


def test_segment_sdpa_model_on_padded_batch_equals_sdpa(lm_dir: Path) -> None:
    """Without packing kwargs the registered implementation is plain sdpa (used by generation)."""
    ids = torch.randint(3, 40, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        a = load_causal_lm(lm_dir)(ids, attention_mask=mask).logits
        b = load_causal_lm(lm_dir, attn_implementation=SEGMENT_SDPA)(ids, attention_mask=mask).logits
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-6, rtol=0)


def test_load_tokenizer_pad_fallback_and_side(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2, "<unk>": 3}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path, padding_side="left")
    assert tok.pad_token == "</s>" and tok.pad_token_id == 2 and tok.padding_side == "left"
    assert load_tokenizer(tmp_path, padding_side="right").padding_side == "right"
    with pytest.raises(UserError, match="padding_side"):
        load_tokenizer(tmp_path, padding_side="middle")  # type: ignore[arg-type]


def test_value_model_round_trip_in_hf_format(tmp_path: Path, lm_dir: Path) -> None:
    critic = load_value_model(lm_dir)
    # A causal LM folder gives a fresh zero head: all values start at 0.
    ids = torch.randint(3, 40, (2, 5))
    assert torch.count_nonzero(critic(ids)) == 0
    torch.manual_seed(2)
    torch.nn.init.normal_(critic.value_head.weight)
    torch.nn.init.normal_(critic.value_head.bias)
    critic.save_pretrained(tmp_path / "critic")
    meta = json.loads((tmp_path / "critic" / "alignctl_value_model.json").read_text())
    assert meta == {"format": "alignctl-value-model", "version": 1, "hidden_size": 16}
    head = load_file(str(tmp_path / "critic" / VALUE_HEAD_FILE))
    assert head["weight"].shape == (1, 16) and head["bias"].shape == (1,)
    AutoModel.from_pretrained(tmp_path / "critic")  # the backbone is a plain HF folder
    reloaded = load_value_model(tmp_path / "critic")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), critic(ids), atol=0, rtol=0)


def test_value_model_seeded_from_reward_model(rm_dir: Path) -> None:
    critic = load_value_model(rm_dir)
    score = load_file(str(rm_dir / "model.safetensors"))["score.weight"]
    torch.testing.assert_close(critic.value_head.weight.detach(), score, atol=0, rtol=0)
    assert isinstance(critic, ValueModel)


def test_last_token_index_left_and_right_padding() -> None:
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 4, 2]


def test_score_last_token_left_right_and_alone(rm_dir: Path) -> None:
    model = load_reward_model(rm_dir).eval()
    torch.manual_seed(3)
    seqs = [torch.randint(3, 40, (n,)) for n in (5, 3)]
    seqs[0][-1] = 1  # ends with eos: the HF pooling would still work here since pad != eos
    with torch.no_grad():
        alone = torch.cat([model(s[None]).logits[:, 0] for s in seqs])  # HF's own head, batch of 1, no pads
        results = []
        for side in ("left", "right"):
            ids = torch.full((2, 6), PAD)
            mask = torch.zeros(2, 6, dtype=torch.long)
            for b, s in enumerate(seqs):
                cols = slice(6 - len(s), 6) if side == "left" else slice(0, len(s))
                ids[b, cols], mask[b, cols] = s, 1
            results.append(score_last_token(model, ids, mask))
    for got in results:
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)


def test_reward_model_from_causal_lm_folder(lm_dir: Path) -> None:
    model = load_reward_model(lm_dir)
    assert model.config.num_labels == 1 and model.score.weight.shape == (1, 16)
