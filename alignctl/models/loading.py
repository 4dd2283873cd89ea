"""Loading Hugging Face models and tokenizers, offline-first.

Three model roles share one backbone family:

- policy / reference: ``AutoModelForCausalLM`` (:func:`load_causal_lm`);
- critic: a backbone (``AutoModel``) plus a scalar linear head per token (:class:`ValueModel`);
- reward model: ``AutoModelForSequenceClassification`` with ``num_labels=1``, scored at the last
  non-pad token (:func:`load_reward_model`, :func:`score_last_token`).

Value-model folder format (HF-compatible, written by :meth:`ValueModel.save_pretrained`)::

    DIR/config.json                  backbone config (``AutoModel.from_pretrained(DIR)`` loads it)
    DIR/model.safetensors            backbone weights (transformers' own layout)
    DIR/value_head.safetensors       {"weight": [1, hidden] , "bias": [1]} of the scalar head
    DIR/alignctl_value_model.json    {"format": "alignctl-value-model", "version": 1, "hidden_size": H}
    DIR/tokenizer*                   optional, when a tokenizer was saved next to it

A folder without ``value_head.safetensors`` (a causal LM, e.g. the SFT policy) loads as a critic
with a fresh head; a sequence-classification reward model's ``score`` row seeds the head (a
critic initialised from the reward model, as OpenRLHF does).

Offline rule: a path that exists or *looks* local (absolute, ``./``, ``../``, ``~``, more than one
``/``, or a first part that is a local folder) is never sent to a hub: ``local_files_only=True``. Only a bare ``org/name`` that does not
exist on disk is treated as a hub id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from alignctl.errors import UserError

# Importing registers the "alignctl_segment_sdpa" attention implementation with transformers, so
# it can be requested at load time like "sdpa".
from alignctl.models import attention as _attention  # noqa: F401

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_META_FILE = "alignctl_value_model.json"
VALUE_FORMAT = "alignctl-value-model"
VALUE_FORMAT_VERSION = 1

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """``"bfloat16"``/``"bf16"``/... -> torch dtype; ``"auto"`` passes through (checkpoint dtype)."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise UserError(f"model dtype '{dtype}' is not supported; expected one of {sorted(_DTYPES)} or 'auto'") from None


def looks_local(path_or_name: str | os.PathLike[str]) -> bool:
    """True when the string names a folder on disk rather than a hub repo id (``org/name``)."""
    text = os.fspath(path_or_name)
    if os.path.exists(text) or os.path.isabs(text):
        return True
    if text.startswith(("./", "../", "~", ".\\", "..\\")) or text in (".", ".."):
        return True
    if text.count("/") > 1 or text.endswith(("/", os.sep)):
        return True
    # "models/nope" where ./models exists is a typo'd local path, not a hub repo of user "models".
    return "/" in text and os.path.isdir(text.split("/", 1)[0])


MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def _check_local_folder(path: str, what: str, needs: tuple[str, ...]) -> Path:
    """The folder exists and holds at least one of ``needs``."""
    folder = Path(os.path.expanduser(path))
    expected = f"a Hugging Face {what} folder with {' or '.join(needs)}"
    if not folder.exists():
        raise UserError(f"{what} path '{path}' does not exist; expected {expected}")
    if not folder.is_dir():
        raise UserError(f"{what} path '{path}' is a file; expected {expected}")
    if not any((folder / name).is_file() for name in needs):
        raise UserError(f"{what} folder '{path}' has no {' or '.join(needs)}; expected {expected}")
    return folder


def _source(path_or_name: str | os.PathLike[str], what: str, needs: tuple[str, ...] = MODEL_FILES) -> tuple[str, bool]:
    """(string to hand to transformers, local_files_only)."""
    if looks_local(path_or_name):
        return str(_check_local_folder(os.fspath(path_or_name), what, needs)), True
    return os.fspath(path_or_name), False


def _load_kwargs(
    dtype: str | torch.dtype, attn_implementation: str | None, trust_remote_code: bool, local: bool
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "dtype": resolve_dtype(dtype),
        "trust_remote_code": trust_remote_code,
        "local_files_only": local,
    }
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return kwargs


def _from_pretrained(auto_cls: Any, source: str, what: str, expected: str, **kwargs: Any) -> Any:
    """Call ``auto_cls.from_pretrained`` and turn "wrong kind of folder" errors into UserErrors."""
    try:
        return auto_cls.from_pretrained(source, **kwargs)
    except (ValueError, KeyError) as exc:  # unknown config class / model type / architecture
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{what} '{source}' cannot be loaded as {expected}: {first}") from exc
    except OSError as exc:  # missing weights, hub id not in the local cache while offline
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{what} '{source}' could not be read ({expected} expected): {first}") from exc


def load_causal_lm(
    path_or_name: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> Any:
    """Policy / reference model (``AutoModelForCausalLM``). ``attn_implementation`` may also be
    ``"alignctl_segment_sdpa"`` (sdpa that runs packed sequences segment by segment)."""
    from transformers import AutoModelForCausalLM

    source, local = _source(path_or_name, "model")
    kwargs = _load_kwargs(dtype, attn_implementation, trust_remote_code, local)
    return _from_pretrained(AutoModelForCausalLM, source, "model", "a causal language model", **kwargs)


def load_tokenizer(
    path_or_name: str | os.PathLike[str],
    *,
    padding_side: Literal["left", "right"],
    trust_remote_code: bool = False,
) -> Any:
    """Tokenizer with a pad token (eos when the checkpoint has none) and an explicit padding side:
    ``"left"`` for generation (prompts end at the same column), ``"right"`` for training."""
    from transformers import AutoTokenizer

    if padding_side not in ("left", "right"):
        raise UserError(f"tokenizer padding_side '{padding_side}' is invalid; expected 'left' or 'right'")
    source, local = _source(path_or_name, "tokenizer", TOKENIZER_FILES)
    tokenizer = _from_pretrained(
        AutoTokenizer, source, "tokenizer", "a tokenizer", trust_remote_code=trust_remote_code, local_files_only=local
    )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(f"tokenizer '{source}' has neither a pad token nor an eos token; expected at least eos")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


class ValueModel(nn.Module):
    """Critic: transformer backbone + ``Linear(hidden, 1)`` applied at every position.

    ``forward(input_ids [B,S], attention_mask, position_ids, **attention_kwargs) -> values [B,S]``
    (float32). Extra keyword arguments (a 4D attention mask, ``cu_seq_lens_q`` ...) go to the
    backbone unchanged, so the packed forward in :mod:`alignctl.models.forward` works here too.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = int(backbone.config.hidden_size)
        dtype = next(backbone.parameters()).dtype
        self.value_head = nn.Linear(hidden, 1, dtype=dtype)
        # Zero head: every value starts at 0, so the first critic loss is the plain return scale.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
        )
        return self.value_head(out.last_hidden_state).squeeze(-1).float()

    def save_pretrained(self, out_dir: str | os.PathLike[str]) -> None:
        """Write the folder format documented at the top of this module."""
        from safetensors.torch import save_file

        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(folder)
        head = {k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(folder / VALUE_HEAD_FILE))
        meta = {"format": VALUE_FORMAT, "version": VALUE_FORMAT_VERSION, "hidden_size": self.value_head.in_features}
        (folder / VALUE_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _seed_head_from_folder(model: ValueModel, folder: Path) -> None:
    """Load the saved head, or copy a reward model's ``score`` row into it when there is one."""
    from safetensors.torch import load_file

    head_file = folder / VALUE_HEAD_FILE
    if head_file.is_file():
        state = load_file(str(head_file))
        try:
            model.value_head.load_state_dict({k: v.to(model.value_head.weight.dtype) for k, v in state.items()})
        except RuntimeError as exc:
            raise UserError(f"value head '{head_file}' does not match the backbone: expected weight [1, hidden]") from exc
        return
    score = _reward_score_weight(folder)
    if score is not None:
        with torch.no_grad():
            model.value_head.weight.copy_(score.to(model.value_head.weight.dtype))


def _reward_score_weight(folder: Path) -> torch.Tensor | None:
    """``score.weight`` [1, H] of a sequence-classification checkpoint, else None."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    if not any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return None
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            if "score.weight" in f.keys():
                weight = f.get_tensor("score.weight")
                return weight if weight.shape[0] == 1 else None
    return None


def load_value_model(
    path: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> ValueModel:
    """Critic from a value-model folder, a causal LM folder, or a reward-model folder."""
    from transformers import AutoModel

    source, local = _source(path, "value model")
    kwargs = _load_kwargs(dtype, attn_implementation, trust_remote_code, local)
    backbone = _from_pretrained(AutoModel, source, "value model", "a transformer backbone (AutoModel)", **kwargs)
    if not hasattr(backbone.config, "hidden_size"):
        raise UserError(f"value model '{source}' config has no hidden_size; expected a decoder transformer")
    model = ValueModel(backbone)
    if local:
        _seed_head_from_folder(model, Path(source))
    return model


def load_reward_model(
    path: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> Any:
    """Scalar reward model (``AutoModelForSequenceClassification``, ``num_labels=1``). A causal LM
    folder loads with a freshly initialised ``score`` head (the start of reward-model training)."""
    from transformers import AutoModelForSequenceClassification

    source, local = _source(path, "reward model")
    kwargs = _load_kwargs(dtype, attn_implementation, trust_remote_code, local)
    model = _from_pretrained(
        AutoModelForSequenceClassification,
        source,
        "reward model",
        "a sequence-classification model",
        num_labels=1,
        **kwargs,
    )
    if getattr(model, "score", None) is None:
        raise UserError(f"reward model '{source}' has no 'score' head; expected a decoder *ForSequenceClassification")
    return model


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last non-pad token per row [B]; works for left and right padding because it
    is the largest column index whose mask is 1 (not ``sum - 1``, which is wrong for left padding)."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (columns * attention_mask.to(columns.dtype)).argmax(dim=1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting non-pad tokens only (0 at each row's first real token; pads get 0)."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def score_last_token(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Reward [B] (float32) read at each row's last non-pad token.

    Done here rather than by the HF head's own pooling, which finds the last token by comparing with
    ``pad_token_id``: that is wrong when pad == eos and the sequence ends with eos."""
    hidden = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    last_hidden = hidden[rows, last_token_index(attention_mask)]
    return model.score(last_hidden).squeeze(-1).float()
