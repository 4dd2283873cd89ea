"""Config schema of the init-model stage (a tiny offline model + tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass

from alignctl.config.core import field


@dataclass
class InitModelConfig:
    """Train a tokenizer on local data and save a randomly initialised model (offline)."""

    out: str = field("models/tiny", help="Output model folder (HF format).")
    tokenizer_from: list[str] = field(default_factory=list, help="Parquet/jsonl files or folders whose text trains the tokenizer.")
    arch: str = field("llama", help="Architecture.", choices=("llama", "qwen2"))
    hidden: int = field(64, help="Hidden size.")
    layers: int = field(2, help="Decoder layers.")
    heads: int | None = field(None, help="Attention heads (default hidden // 64, at least 1).")
    intermediate: int | None = field(None, help="MLP width (default ~8/3 hidden).")
    vocab_size: int = field(2048, help="BPE vocabulary target (char takes it from the data).")
    tokenizer_kind: str = field("bpe", help="Tokenizer.", choices=("bpe", "char"))
    max_position_embeddings: int = field(1024, help="Maximum sequence length.")
    seed: int = field(0, help="Seed of the random weights.")
