"""Names that changed inside transformers 5.x, resolved in one place.

transformers 5.24 renamed the forward argument ``past_key_values`` to ``cache`` and
``gradient_checkpointing_enable(gradient_checkpointing_kwargs=)`` to
``activation_checkpointing_enable(activation_checkpointing_kwargs=)``; the old names still work
but print a deprecation warning from every worker, which would break the CLI's one-line errors and
clutter every run. alignctl supports ``transformers>=5.0``, so each helper asks the model which
name it has instead of pinning one.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn


@functools.cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def _innermost_model(model: nn.Module) -> nn.Module:
    """The transformers model under peft (``get_base_model``) and DDP (``.module``) wrappers; their
    own ``forward`` takes ``**kwargs`` and passes the cache through untouched."""
    while True:
        if hasattr(model, "get_base_model"):
            inner = model.get_base_model()
        elif isinstance(getattr(model, "module", None), nn.Module):
            inner = model.module
        else:
            return model
        if inner is model:
            return model
        model = inner


def cache_kwargs(model: nn.Module, cache: Any) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to ``model.forward`` (``cache=`` on transformers
    >= 5.24, ``past_key_values=`` before), with ``use_cache=True``."""
    params = _forward_parameters(type(_innermost_model(model)))
    name = "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"
    return {name: cache, "use_cache": True}


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing under whichever method name this transformers has.

    Non-reentrant also works when no input of a block requires grad (LoRA: the embeddings are
    frozen); the reentrant variant would drop the adapters' gradients there."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


@functools.cache
def training_checkpointing_key() -> str:
    """The ``TrainingArguments`` field that turns activation checkpointing on: 5.24 renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` (the old one warns)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def chat_token_ids(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """``tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)`` as a list of ints:
    transformers 5 returns a ``BatchEncoding`` there, 4.x returned the list itself."""
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return [int(t) for t in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded)]
