"""Tiny models built offline: a tokenizer trained on local data + a seeded random transformer.

``init_model(...)`` writes a Hugging Face folder (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json with a chat template) that
``AutoModelForCausalLM`` / ``AutoTokenizer`` load and vLLM can serve. No hub access anywhere.

Tokenizer kinds:
- ``bpe``: byte-level BPE (any text round-trips) trained to ``vocab_size`` entries;
- ``char``: one token per character seen in the data (arith task: digits, letters, punctuation),
  unseen characters map to ``<|unk|>``.

Chat format: ``<|user|>question<|end|><|assistant|>answer<|end|>``; ``eos = <|end|>`` so
generation stops at the end of the assistant turn; ``pad = <|pad|>`` (distinct from eos).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from alignctl.errors import UserError, writing
from alignctl.quiet import no_transformers_bars

BOS, EOS, PAD, UNK = "<|bos|>", "<|end|>", "<|pad|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)

# Where text lives in our parquet schema (messages or strings, nested dicts walked) and in jsonl.
PARQUET_TEXT_COLUMNS = ("prompt", "chosen", "rejected", "completion", "response", "reward_model", "extra_info")
JSONL_TEXT_KEYS = ("question", "answer", "text", "prompt", "chosen", "rejected", "completion", "response")
DATA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")
METADATA_FILES = frozenset({"meta.json", "manifest.json"})

ARCHITECTURES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}


@dataclass(frozen=True)
class TinyModelInfo:
    path: Path
    num_parameters: int
    vocab_size: int
    tokenizer_kind: str


# ---------------------------------------------------------------------------------------------
# Text extraction


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a cell: plain strings, message lists ({role, content}), nested dicts."""
    if isinstance(value, str):
        if value:
            yield value
    elif isinstance(value, dict):
        # A chat message: only its content is text; the role becomes a special token anyway.
        items = [value["content"]] if "content" in value else list(value.values())
        for item in items:
            yield from _strings(item)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        for item in value:
            yield from _strings(item)


def _data_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Artifact bookkeeping (preprocess meta.json, pipeline manifest.json) is not text data.
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(DATA_SUFFIXES)
                           and p.name not in METADATA_FILES)
            if not found:
                raise UserError(f"tokenizer data folder '{path}' has no {'/'.join(DATA_SUFFIXES)} files")
            files.extend(found)
        elif path.is_file():
            if not path.name.endswith(DATA_SUFFIXES):
                raise UserError(f"tokenizer data file '{path}' has an unknown type; expected {'/'.join(DATA_SUFFIXES)}")
            files.append(path)
        else:
            raise UserError(f"tokenizer data path '{path}' does not exist; expected a parquet/jsonl file or folder")
    return files


def _jsonl_texts(path: Path) -> Iterator[str]:
    from alignctl.data.readers import read_jsonl

    for _, row in read_jsonl(path):
        if isinstance(row, dict):
            for key in JSONL_TEXT_KEYS:
                yield from _strings(row.get(key))


def _parquet_texts(path: Path) -> Iterator[str]:
    from alignctl.data.readers import read_parquet

    table = read_parquet(path, "tokenizer training data")
    for column in (c for c in PARQUET_TEXT_COLUMNS if c in table.column_names):
        for cell in table.column(column).to_pylist():
            yield from _strings(cell)


def iter_texts(paths: Sequence[str | os.PathLike[str]]) -> Iterator[str]:
    """All text in the given parquet / jsonl(.gz) files or folders, file by file."""
    for path in _data_files(paths):
        yield from _parquet_texts(path) if path.suffix == ".parquet" else _jsonl_texts(path)


# ---------------------------------------------------------------------------------------------
# Tokenizers


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Byte-level BPE (``tokenizers.Tokenizer``) with the special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < BPE_MIN_VOCAB:
        raise UserError(f"vocab_size={vocab_size} is too small for byte-level BPE; expected >= {BPE_MIN_VOCAB}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_char_tokenizer(texts: Iterable[str]) -> Any:
    """One token per character seen (sorted, after the special tokens); no merges."""
    from tokenizers import Tokenizer, decoders, models

    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(chars):
        vocab.setdefault(ch, len(vocab))
    # BPE with no merges and no pre-tokenizer = split into characters; Fuse joins them back.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def wrap_tokenizer(tok: Any) -> Any:
    """``tokenizers.Tokenizer`` -> transformers fast tokenizer with specials and chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


# ---------------------------------------------------------------------------------------------
# Model


# How each setting is spelled on the command line (``alignctl init-model``); errors show both the
# flag and the key (the pipeline stage and the Python API use the key). kv_heads has no flag.
FLAGS = {"hidden": "--hidden", "layers": "--layers", "heads": "--heads", "kv_heads": None,
         "intermediate": "--intermediate", "vocab_size": "--vocab-size",
         "max_position_embeddings": "--max-positions", "arch": "--arch", "tokenizer_kind": "--tokenizer"}
BPE_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # every byte, then the special tokens


def _named(**values: Any) -> str:
    """``--hidden (hidden=0)``, or ``--hidden/--heads (hidden=30, heads=4)`` for several."""
    flags = "/".join(f for f in (FLAGS[k] for k in values) if f)
    keys = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return f"{flags} ({keys})" if flags else keys


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"init-model: {_named(**{name: value})}: expected a positive integer")


def _resolved_shape(hidden: int, heads: int | None, kv_heads: int | None,
                    intermediate: int | None) -> tuple[int, int, int]:
    """(heads, kv_heads, intermediate) with defaults filled in, or a UserError naming the flag.
    Defaults: heads = hidden // 64 (at least 1), kv_heads = heads, intermediate ~8/3 hidden."""
    _check_positive("hidden", hidden)
    for name, value in (("heads", heads), ("kv_heads", kv_heads), ("intermediate", intermediate)):
        if value is not None:
            _check_positive(name, value)
    default = " (heads defaults to hidden // 64)" if heads is None else ""
    heads = heads or max(1, hidden // 64)
    kv_heads = kv_heads or heads
    if hidden % heads:
        raise UserError(f"init-model: {_named(hidden=hidden, heads=heads)}: expected hidden to be a "
                        f"multiple of heads{default}")
    if (hidden // heads) % 2:  # rotary position embeddings rotate pairs of dimensions
        raise UserError(f"init-model: {_named(hidden=hidden, heads=heads)}: expected an even head size "
                        f"hidden / heads (rotary embeddings), got {hidden // heads}")
    if heads % kv_heads:
        raise UserError(f"init-model: {_named(heads=heads, kv_heads=kv_heads)}: expected heads to be a "
                        f"multiple of kv_heads")
    # ~8/3 * hidden (the SwiGLU ratio), rounded up to a multiple of 16.
    return heads, kv_heads, intermediate or -(-(8 * hidden // 3) // 16) * 16


def check_init_args(arch: str, hidden: int, layers: int, heads: int | None, kv_heads: int | None,
                    intermediate: int | None, vocab_size: int, tokenizer_kind: str,
                    max_position_embeddings: int) -> None:
    """Every size and choice, checked before any file is read or written: a bad value must not
    cost a tokenizer training run, nor surface as a traceback from inside transformers."""
    if arch not in ARCHITECTURES:
        raise UserError(f"init-model: --arch: model arch {arch!r} is not supported; "
                        f"expected one of {', '.join(sorted(ARCHITECTURES))}")
    if tokenizer_kind not in ("bpe", "char"):
        raise UserError(f"init-model: --tokenizer: tokenizer kind {tokenizer_kind!r} is not supported; "
                        f"expected bpe or char")
    _check_positive("layers", layers)
    _check_positive("max_position_embeddings", max_position_embeddings)
    _resolved_shape(hidden, heads, kv_heads, intermediate)
    if tokenizer_kind == "bpe":
        _check_positive("vocab_size", vocab_size)
        if vocab_size < BPE_MIN_VOCAB:
            raise UserError(f"init-model: {_named(vocab_size=vocab_size)} is too small for byte-level BPE; "
                            f"expected >= {BPE_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)")


def _model_config(
    arch: str, tokenizer: Any, hidden: int, layers: int, heads: int | None, kv_heads: int | None,
    intermediate: int | None, max_position_embeddings: int, tie_word_embeddings: bool,
) -> Any:  # fmt: skip
    import transformers

    heads, kv_heads, intermediate = _resolved_shape(hidden, heads, kv_heads, intermediate)
    config_cls = getattr(transformers, ARCHITECTURES[arch])
    return config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )


def _portable_tokenizer_class(folder: Path) -> None:
    """transformers 5 writes ``TokenizersBackend``, which 4.x readers (e.g. a vLLM pinned to an older
    transformers) do not know; ``PreTrainedTokenizerFast`` loads the same tokenizer.json in both."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _write_atomically(out: Path, overwrite: bool, write: Any) -> None:
    """``write(tmp_dir)`` then rename into place, so ``out`` is either absent or complete; never
    replaces a folder alignctl did not write (see alignctl.pipeline.ownership)."""
    from alignctl.pipeline.atomic import atomic_output_dir

    # init_model refused an existing ``out`` without overwrite before training the tokenizer
    with atomic_output_dir(out, overwrite=overwrite, kind="model") as tmp:
        write(tmp)


def init_model(
    *,
    out: str | os.PathLike[str],
    tokenizer_from: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab_size: int = 2048,
    tokenizer_kind: Literal["bpe", "char"] = "bpe",
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    overwrite: bool = False,
) -> TinyModelInfo:
    """Train a tokenizer on ``tokenizer_from`` and save it with a seeded random model into ``out``.

    ``vocab_size`` is the BPE target (``char`` takes its size from the data); ``heads`` defaults to
    hidden // 64 (at least 1), ``intermediate`` to ~8/3 * hidden."""
    check_init_args(arch, hidden, layers, heads, kv_heads, intermediate, vocab_size, tokenizer_kind,
                    max_position_embeddings)
    path = Path(out)
    if path.exists() and not overwrite:  # before the (slow) tokenizer training, not after
        raise UserError(f"output folder '{path}' already exists; expected a new path (or pass overwrite)")
    import torch
    import transformers

    sources = [tokenizer_from] if isinstance(tokenizer_from, (str, os.PathLike)) else list(tokenizer_from)
    texts = list(iter_texts(sources))
    if not texts:
        raise UserError(f"no text found in {[str(s) for s in sources]}; expected columns {PARQUET_TEXT_COLUMNS} or keys {JSONL_TEXT_KEYS}")
    if tokenizer_kind == "bpe":
        raw = train_bpe_tokenizer(texts, vocab_size)
    elif tokenizer_kind == "char":
        raw = train_char_tokenizer(texts)
    else:
        raise UserError(f"tokenizer kind '{tokenizer_kind}' is not supported; expected 'bpe' or 'char'")
    tokenizer = wrap_tokenizer(raw)
    config = _model_config(arch, tokenizer, hidden, layers, heads, kv_heads, intermediate, max_position_embeddings, tie_word_embeddings)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    def write(folder: Path) -> None:
        # transformers' "Writing model shards" bar is noise for a one-file model, and a failed
        # write would leave it half-drawn above the one-line error.
        with no_transformers_bars():
            model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        _portable_tokenizer_class(folder)

    with writing(path):  # a full disk or read-only folder: one line naming the folder
        _write_atomically(path, overwrite, write)
    return TinyModelInfo(path, sum(p.numel() for p in model.parameters()), len(tokenizer), tokenizer_kind)
