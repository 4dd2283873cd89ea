"""Loading causal LMs, tokenizers, critics (value models) and reward models from local folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForTokenClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    LlamaModel,
    T5Config,
)

from alignctl.errors import UserError
from alignctl.models.attention import SEGMENT_SDPA
from alignctl.models.forward import compute_values
from alignctl.models.loading import (
    LEGACY_VALUE_HEAD_FILE,
    LEGACY_VALUE_META_FILE,
    last_token_index,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    load_value_model,
    looks_local,
    position_ids_from_mask,
    score_last_token,
    value_head,
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


def verl_rows(lengths: list[tuple[int, int]], prompt_width: int = 4, response_width: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """[left-padded prompt | right-padded response] rows with (prompt, response) real lengths."""
    torch.manual_seed(5)
    ids = torch.randint(3, 40, (len(lengths), prompt_width + response_width))
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(lengths):
        mask[b, prompt_width - p : prompt_width + r] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def test_new_critic_from_causal_lm_has_a_zero_one_label_head(lm_dir: Path) -> None:
    critic = load_value_model(lm_dir)
    assert isinstance(critic, LlamaForTokenClassification)
    assert critic.config.num_labels == 1 and critic.config.classifier_dropout == 0.0
    assert value_head(critic).weight.shape == (1, 16)
    ids, mask = verl_rows([(4, 5), (2, 3)])
    assert torch.count_nonzero(compute_values(critic, ids, mask, 5)) == 0  # every value starts at 0


def test_saved_critic_loads_with_transformers_alone(tmp_path: Path, lm_dir: Path) -> None:
    """Saved by alignctl, read back by plain transformers: the same values as alignctl's packed forward."""
    critic = load_value_model(lm_dir, attn_implementation=SEGMENT_SDPA).train()  # train(): dropout must be off
    torch.manual_seed(2)
    torch.nn.init.normal_(critic.score.weight)
    torch.nn.init.normal_(critic.score.bias)
    critic.save_pretrained(tmp_path / "critic")
    assert not (tmp_path / "critic" / LEGACY_VALUE_HEAD_FILE).exists()
    assert json.loads((tmp_path / "critic" / "config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]

    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").train()
    assert type(plain) is LlamaForTokenClassification and plain.config.num_labels == 1
    ids, mask = verl_rows([(4, 5), (2, 3), (3, 1)])
    with torch.no_grad():
        ours = compute_values(critic, ids, mask, 5, max_tokens_per_row=12)
        theirs = torch.zeros(3, 5)
        for b in range(3):  # each sequence alone, no padding: value at column p is for token p+1
            real = ids[b][mask[b].bool()]
            n_prompt = int(mask[b, :4].sum())
            out = plain(real[None]).logits[0, :, 0]
            n = real.numel() - n_prompt
            theirs[b, :n] = out[n_prompt - 1 : n_prompt - 1 + n]
    assert theirs.abs().sum() > 0
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    reloaded = load_value_model(tmp_path / "critic")
    with torch.no_grad():
        torch.testing.assert_close(compute_values(reloaded, ids, mask, 5), ours, atol=1e-5, rtol=0)


def write_old_format_critic(folder: Path, seed: int) -> tuple[AutoModel, torch.Tensor, torch.Tensor]:
    """A critic folder as alignctl wrote it before the token-classification format: the bare
    backbone, ``value_head.safetensors`` and ``alignctl_value_model.json``."""
    torch.manual_seed(seed)
    backbone = LlamaModel(tiny_config()).eval()
    weight, bias = torch.randn(1, 16), torch.randn(1)
    backbone.save_pretrained(folder)
    save_file({"weight": weight, "bias": bias}, str(folder / LEGACY_VALUE_HEAD_FILE))
    meta = {"format": "alignctl-value-model", "version": 1, "hidden_size": 16}
    (folder / LEGACY_VALUE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return backbone, weight, bias


def test_old_format_critic_folder_still_loads(tmp_path: Path) -> None:
    backbone, weight, bias = write_old_format_critic(tmp_path / "old", seed=6)
    critic = load_value_model(tmp_path / "old")
    assert isinstance(critic, LlamaForTokenClassification)
    torch.testing.assert_close(critic.score.weight.detach(), weight, atol=0, rtol=0)
    torch.testing.assert_close(critic.score.bias.detach(), bias, atol=0, rtol=0)
    ids, mask = verl_rows([(4, 5), (1, 2)])
    with torch.no_grad():
        hidden = backbone(ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).last_hidden_state
        expected = (hidden @ weight.T + bias)[..., 0][:, 3:-1] * mask[:, 4:]
        torch.testing.assert_close(compute_values(critic, ids, mask, 5), expected, atol=1e-5, rtol=0)
    # Saving the loaded critic converts the folder to the standard one, even in place: the stale
    # value_head.safetensors left there no longer counts once the weights hold the head.
    with torch.no_grad():
        critic.score.weight.mul_(2)
    critic.save_pretrained(tmp_path / "old")
    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "old")
    torch.testing.assert_close(plain.score.weight, 2 * weight, atol=0, rtol=0)
    torch.testing.assert_close(load_value_model(tmp_path / "old").score.weight, 2 * weight, atol=0, rtol=0)


def test_critic_seeded_from_reward_model(rm_dir: Path) -> None:
    critic = load_value_model(rm_dir)
    score = load_file(str(rm_dir / "model.safetensors"))["score.weight"]
    torch.testing.assert_close(critic.score.weight.detach(), score, atol=0, rtol=0)
    assert torch.count_nonzero(critic.score.bias) == 0  # the reward head has no bias: a fresh zero one


def test_many_label_classifier_is_not_a_critic(tmp_path: Path) -> None:
    config = tiny_config()
    config.num_labels = 3
    LlamaForTokenClassification(config).save_pretrained(tmp_path)
    with pytest.raises(UserError) as exc:
        load_value_model(tmp_path)
    assert_one_line_user_error(exc, "3 labels", "num_labels=1")


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


def test_loading_draws_no_transformers_bar_and_restores_the_setting(lm_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Every loader goes through one ``from_pretrained`` wrapper that turns transformers' tqdm bars
    off for the load ("Loading weights" once per model buried eval's output) and back on after."""
    import transformers

    transformers.logging.enable_progress_bar()
    capfd.readouterr()
    load_causal_lm(lm_dir)
    transformers.AutoModelForCausalLM.from_pretrained(lm_dir)  # the bare call, as a control
    captured = capfd.readouterr()
    assert captured.err.count("Loading weights") >= 1  # the control drew its bar: the check can see one
    load_causal_lm(lm_dir)
    assert "Loading weights" not in capfd.readouterr().err
    assert transformers.logging.is_progress_bar_enabled()


def test_deepspeed_cpu_notice_is_filtered_and_nothing_else() -> None:
    """Workers and TRL stages attach one filter to DeepSpeed's logger: its GPU-not-found notice goes,
    any other record passes; attaching twice keeps one filter."""
    import logging

    from alignctl.quiet import DEEPSPEED_LOGGER, filter_deepspeed_cpu_notice, not_cpu_accelerator_notice

    filter_deepspeed_cpu_notice()
    filter_deepspeed_cpu_notice()
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    assert logger.filters.count(not_cpu_accelerator_notice) == 1

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(DEEPSPEED_LOGGER, logging.WARNING, "real_accelerator.py", 213, message, None, None)

    notice = record("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
    assert not logger.filter(notice)
    assert logger.filter(record("ZeRO stage 3 offload: out of pinned memory"))
