"""The repeated transformer blocks of a model: FSDP2's wrap units and what ``model.freeze_layers`` counts.

transformers names, on every pretrained class, the block class that must stay whole on one device
(``_no_split_modules``: ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ``GPT2Block``, ...). Those
modules are the blocks, wherever the model keeps them (``model.layers``, ``transformer.h``,
``gpt_neox.layers``), so no rule about attribute names is needed. The attribute is read from every
submodule, so wrappers (a critic head around a backbone, a PEFT model) find their backbone's
blocks. Only the outermost matching modules count (a block is never nested in another one).

A model that declares no such class (or whose declared classes are absent) falls back to a shape
rule with a warning: the first ``nn.ModuleList`` as long as ``config.num_hidden_layers``, else the
first one whose name ends in ``layers``.
"""

from __future__ import annotations

import warnings

from torch import nn

from alignctl.errors import UserError

__all__ = ["freeze_bottom_layers", "transformer_blocks"]


def _no_split_class_names(model: nn.Module) -> set[str]:
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def _outermost_of_classes(model: nn.Module, class_names: set[str]) -> list[nn.Module]:
    blocks: list[nn.Module] = []
    prefixes: list[str] = []
    for name, module in model.named_modules():
        if type(module).__name__ in class_names and not any(name.startswith(p + ".") for p in prefixes):
            blocks.append(module)
            prefixes.append(name)
    return blocks


def _block_list_by_shape(model: nn.Module) -> tuple[str, list[nn.Module]] | None:
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    lists = [(name, child) for name, child in model.named_modules() if isinstance(child, nn.ModuleList)]
    for name, child in lists:
        if count is not None and len(child) == count:
            return name, list(child)
    for name, child in lists:
        if name.endswith("layers"):
            return name, list(child)
    return None


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks in module order (see the module docstring); [] with a
    warning when neither ``_no_split_modules`` nor the shape rule finds any."""
    declared = _no_split_class_names(model)
    blocks = _outermost_of_classes(model, declared) if declared else []
    if blocks:
        return blocks
    found = _block_list_by_shape(model)
    what = f"declares no-split classes {sorted(declared)} but has none of them" if declared else \
        "declares no _no_split_modules"
    where = f"using the ModuleList '{found[0]}' ({len(found[1])} blocks)" if found else \
        "found no block list either, so it is treated as one block"
    warnings.warn(f"{type(model).__name__} {what}; {where}", stacklevel=2)
    return found[1] if found else []


def freeze_bottom_layers(model: nn.Module, n: int, where: str, key: str = "model.freeze_layers") -> None:
    """Freeze the input embeddings and the first ``n`` blocks (``model.freeze_layers``).

    Nothing below block ``n`` then requires a gradient, so autograd's backward stops there: a
    step costs a forward plus the backward of the blocks that train. ``where`` starts the error,
    ``key`` is the config key it names."""
    if n == 0:
        return
    layers = transformer_blocks(model)
    if not layers:
        raise UserError(f"{where}: key '{key}' is {n} but no transformer layers were found in "
                        f"{type(model).__name__}; set {key}=0")
    if n > len(layers):
        raise UserError(f"{where}: key '{key}' is {n} but the model has {len(layers)} layers")
    for module in (model.get_input_embeddings(), *layers[:n]):
        for param in module.parameters():
            param.requires_grad_(False)
