"""Loading Hugging Face models and tokenizers, offline-first.

Three model roles share one backbone family:

- policy / reference: ``AutoModelForCausalLM`` (:func:`load_causal_lm`);
- critic: ``AutoModelForTokenClassification`` with ``num_labels=1`` (verl's and TRL's choice): the
  backbone plus a ``Linear(hidden, 1)`` head read at every position (:func:`load_value_model`);
- reward model: ``AutoModelForSequenceClassification`` with ``num_labels=1``, scored at the last
  non-pad token (:func:`load_reward_model`, :func:`score_last_token`).

A critic folder is whatever ``save_pretrained`` writes for that class (``config.json`` naming
``*ForTokenClassification`` with one label and ``classifier_dropout`` 0, ``model.safetensors``):
``AutoModelForTokenClassification.from_pretrained(DIR)`` loads it with no alignctl code. A critic
can also start from a causal LM (the SFT policy: fresh zero head, every value 0 at first) or from a
sequence-classification reward model (its one-row ``score`` seeds the head, as in OpenRLHF).

Folders written by alignctl before the critic became a token classifier hold the bare backbone
plus ``value_head.safetensors`` and ``alignctl_value_model.json``; they still load (the saved head
is copied into ``score``), and saving the loaded model writes the standard folder.

Offline rule: a path that exists or *looks* local (absolute, ``./``, ``../``, ``~``, more than one
``/``, or a first part that is a local folder) is never sent to a hub: ``local_files_only=True``. Only a bare ``org/name`` that does not
exist on disk is treated as a hub id.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from alignctl.errors import UserError
from alignctl.quiet import no_transformers_bars

# Importing registers the "alignctl_segment_sdpa" attention implementation with transformers, so
# it can be requested at load time like "sdpa".
from alignctl.models import attention as _attention  # noqa: F401

# Files that mark a critic folder of the old (pre token-classification) alignctl format.
LEGACY_VALUE_HEAD_FILE = "value_head.safetensors"
LEGACY_VALUE_META_FILE = "alignctl_value_model.json"

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
        with no_transformers_bars():  # a "Loading weights" bar per model would bury the stage's own output
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


def critic_config(config: Any) -> Any:
    """A copy of ``config`` for a one-label token classifier. Dropout before the head is off: the
    values of one state must not change between the rollout pass and the update (PPO clips against
    them), and transformers' default for configs without the key is 0.1."""
    config = copy.deepcopy(config)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    return config


def value_head(model: Any) -> nn.Linear:
    """The ``Linear(hidden, 1)`` of a token-classification critic (``score`` in decoder LMs,
    ``classifier`` in GPT-2 and encoder models)."""
    model = getattr(model, "module", model)  # DDP-style wrappers
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            return head
    raise UserError(f"{type(model).__name__} has no 'score' or 'classifier' linear head; expected a "
                    f"*ForTokenClassification critic")


def _head_params(model: Any) -> dict[str, nn.Parameter]:
    """The head's parameters under their state-dict names (``score.weight``, ``score.bias``)."""
    head = value_head(model)
    prefix = next(name for name, module in model.named_modules() if module is head)
    return {f"{prefix}.{name}": param for name, param in head.named_parameters()}


def _zero_head(model: Any, missing: set[str] | None = None) -> None:
    """Zero the head parameters named in ``missing`` (all of them when None): a fresh critic
    predicts 0 everywhere, so the first value loss is the plain scale of the returns."""
    with torch.no_grad():
        for name, param in _head_params(model).items():
            if missing is None or name in missing:
                param.zero_()


def new_value_model(config: Any, dtype: str | torch.dtype = "float32", attn_implementation: str | None = "sdpa") -> Any:
    """A critic with random backbone weights and a zero head, from a (causal LM) config."""
    from transformers import AutoModelForTokenClassification

    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)} if dtype != "auto" else {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForTokenClassification.from_config(critic_config(config), **kwargs)
    _zero_head(model)
    return model


def _copy_legacy_head(model: Any, folder: Path) -> None:
    """Old-format folder: its ``value_head.safetensors`` ({weight [1, H], bias [1]}) into the head."""
    from safetensors.torch import load_file

    head_file = folder / LEGACY_VALUE_HEAD_FILE
    head = value_head(model)
    state = load_file(str(head_file))
    try:
        head.load_state_dict({k: v.to(head.weight.dtype) for k, v in state.items()})
    except RuntimeError as exc:
        raise UserError(f"value head '{head_file}' does not match the model: expected weight [1, "
                        f"{head.in_features}] and bias [1]") from exc


def _check_one_label(config: Any, source: str) -> None:
    archs = getattr(config, "architectures", None) or []
    labels = len(getattr(config, "id2label", None) or {})
    if any(a.endswith(("ForTokenClassification", "ForSequenceClassification")) for a in archs) and labels > 1:
        raise UserError(f"value model '{source}' is a classifier with {labels} labels; a critic needs one "
                        f"(num_labels=1)")


def load_value_model(
    path: str | os.PathLike[str],
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
) -> Any:
    """Critic (``AutoModelForTokenClassification``, one label) from a critic folder, a causal LM
    folder, a reward-model folder or an old-format alignctl critic folder (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    source, local = _source(path, "value model")
    kwargs = _load_kwargs(dtype, attn_implementation, trust_remote_code, local)
    config = _from_pretrained(AutoConfig, source, "value model", "a model config",
                              trust_remote_code=trust_remote_code, local_files_only=local)
    _check_one_label(config, source)
    model, info = _from_pretrained(
        AutoModelForTokenClassification, source, "value model", "a token-classification critic",
        config=critic_config(config), output_loading_info=True, **kwargs,
    )
    missing = set(info["missing_keys"])
    _zero_head(model, missing)  # new from a causal LM: all of it; from a reward model: the bias
    # Only a folder whose weights lack the head is read as the old format (a stale head file left
    # next to a re-saved standard critic must not override its trained head).
    if local and missing.issuperset(_head_params(model)) and (Path(source) / LEGACY_VALUE_HEAD_FILE).is_file():
        _copy_legacy_head(model, Path(source))
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
    """Position ids [B, S] of a padded batch: real tokens count 0, 1, 2, ... from each row's first
    real token; left pads get 0 and right pads repeat the row's last real position (verl's
    ``compute_position_id_with_mask``). The one rule of the package (rollout prefill, batch assembly,
    training forwards, reward scoring). A pad's position only reaches that pad's own output (causal
    attention, pads masked), so real tokens get the log-probs of the same row run unpadded."""
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
