"""Model and tokenizer folders: they exist, hold a model, and are the kind the role needs.

Read from ``config.json`` only (no weights loaded, no transformers import), so checking every
model of a run costs milliseconds. A name that looks like a hub id (``org/name``) and is not on
disk is asked about once, with a short timeout, instead of letting transformers retry a hub for
a minute before saying a local folder is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from alignctl.errors import UserError
from alignctl.hub import hub_problem, is_network_problem
from alignctl.models.loading import TOKENIZER_FILES, looks_local
from alignctl.models.reward_kind import is_likelihood_reward_folder
from alignctl.preflight.context import Context

Kind = Literal["causal", "reward", "critic", "tokenizer"]


def _architectures(folder: Path, key: str) -> list[str]:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{key} {folder}: config.json is not readable JSON ({type(exc).__name__})") from None
    return list(config.get("architectures") or [])


def _check_kind(folder: Path, key: str, kind: Kind) -> None:
    """The architecture recorded in config.json suits the role."""
    if kind == "tokenizer":
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(f"{key} {folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); expected a "
                            f"Hugging Face model or tokenizer folder")
        return
    if not (folder / "config.json").is_file():
        if any(folder.glob("*.gguf")):
            return  # a GGUF file: transformers reads its config from the file itself
        raise UserError(f"{key} {folder}: no config.json; expected a Hugging Face model folder")
    archs = _architectures(folder, key)
    scored = [a for a in archs if a.endswith("ForSequenceClassification")]
    if kind == "reward" and not scored and is_likelihood_reward_folder(folder):
        return  # a causal LM that scores replies by their likelihood (train-rm score_from=likelihood)
    if kind == "reward" and not scored:
        found = ", ".join(archs) or "no architecture recorded"
        raise UserError(f"{key} {folder}: not a reward model ({found}); expected a sequence classifier with a "
                        f"score head, e.g. a train-rm output (a plain causal LM would score with a random head; "
                        f"train-rm score_from=likelihood makes one that scores replies by their likelihood)")
    if kind == "causal" and archs and not any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                                              for a in archs):
        raise UserError(f"{key} {folder}: {', '.join(archs)} is not a causal language model; expected a policy "
                        f"(an SFT, init-model or RL output)")


def check_model(path: str | None, key: str, ctx: Context, kind: Kind = "causal", *,
                needs_tokenizer: bool = False) -> None:
    """``path`` names a usable folder of ``kind`` (or a reachable hub id); UserError otherwise.
    ``needs_tokenizer``: the folder must also hold the tokenizer the stage reads from it."""
    if path is None or ctx.later(path):
        return
    if not path.strip():
        raise UserError(f"{key}: empty path; expected a Hugging Face model folder")
    folder = Path(path).expanduser()
    if not folder.exists():
        if looks_local(path):
            raise UserError(f"{key} {path}: folder does not exist; expected a Hugging Face model folder")
        why = hub_problem(path, "model", cached_file="config.json")
        if why and ctx.offline_ok and is_network_problem(why):
            from alignctl.console import console

            console.print(f"[yellow]note:[/] {key} {path}: hub model not checked ({why})")
            return
        if why:
            raise UserError(f"{key} {path}: no such local folder, and not usable as a hub model id ({why})")
        return
    if not folder.is_dir():
        raise UserError(f"{key} {path}: is a file; expected a Hugging Face model folder")
    _check_kind(folder, key, kind)
    if needs_tokenizer and kind != "tokenizer" and not any(folder.glob("*.gguf")):
        _check_kind(folder, key, "tokenizer")


def check_layer_count(path: str | None, freeze_layers: int, key: str, ctx: Context) -> None:
    """``key`` (a ``freeze_layers``) is at most the model's ``num_hidden_layers`` in config.json:
    said before any worker starts instead of from inside one. Unknown counts pass."""
    if not freeze_layers or path is None or ctx.later(path):
        return
    config_file = Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    layers = config.get("num_hidden_layers", (config.get("text_config") or {}).get("num_hidden_layers"))
    if isinstance(layers, int) and freeze_layers > layers:
        raise UserError(f"key '{key}' is {freeze_layers} but {path} has {layers} transformer layers "
                        f"(config.json num_hidden_layers); expected at most {layers}")
