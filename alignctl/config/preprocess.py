"""Config schema of the preprocess stage (``alignctl preprocess DATASET``)."""

from __future__ import annotations

from dataclasses import dataclass

from alignctl.config.core import field, section
from alignctl.errors import UserError

DATASETS = ("gsm8k", "math", "hh-rlhf", "arith", "tools-arith", "custom")


@dataclass
class ArithConfig:
    """Sizes and difficulty of the offline synthetic arithmetic task."""

    num_train: int = field(2000, help="RL training prompts (train.parquet).")
    num_test: int = field(200, help="Held-out RL prompts (test.parquet).")
    num_sft: int = field(2000, help="SFT demonstrations (sft_train.parquet / sft_test.parquet).")
    num_pref: int = field(2000, help="Preference pairs (pref_train.parquet / pref_test.parquet).")
    min_value: int = field(1, help="Smallest operand.")
    max_value: int = field(20, help="Largest operand.")
    min_steps: int = field(1, help="Fewest operations per problem.")
    max_steps: int = field(2, help="Most operations per problem.")
    operations: list[str] = field(default_factory=lambda: ["+", "-"],
                                  help="Operations to draw from: any of +, -, *.")
    sft_terse_fraction: float = field(0.0, help="Fraction of SFT demonstrations that give only the "
                                                "final answer ('#### 9') instead of the worked steps.")
    disjoint_rl: bool = field(False, help="Draw the RL prompts after the SFT and preference questions, so RL "
                                          "trains on questions SFT never showed (default: the same "
                                          "questions come first in every train file).")


@dataclass
class ToolsArithConfig:
    """Sizes of the calculator task (multi-digit products, docs/agents.md)."""

    num_train: int = field(2000, help="RL training prompts (train.parquet).")
    num_test: int = field(200, help="Held-out RL prompts (test.parquet).")
    num_sft: int = field(500, help="Tool-use traces (sft_train.parquet), on questions of their own.")
    digits: int = field(3, help="Digits of each operand of the RL and test questions.")
    sft_digits: int = field(3, help="Digits of each operand of the SFT traces (fewer: the call format on "
                                    "easier questions).")


@dataclass
class PreprocessConfig:
    """Turn a raw dataset into verl-compatible parquet files."""

    dataset: str = field("gsm8k", help="Dataset kind.", choices=DATASETS)
    input: str | None = field(None, help="Local input: a folder, a jsonl/jsonl.gz/parquet/csv file, "
                                         "or (gsm8k, when online) a datasets hub name.")
    out: str = field("data/processed", help="Output folder (written atomically).")
    test_fraction: float = field(0.0, help="Deterministic held-out fraction when the source has "
                                           "a single split (0 keeps everything in train).")
    seed: int = field(0, help="Seed for splits and synthetic data.")
    skip_bad_rows: bool = field(False, help="Skip malformed input rows (reported with reasons) "
                                            "instead of failing on the first one.")
    max_rows: int | None = field(None, help="Keep at most this many rows per split (for quick runs).")
    map_fn: str | None = field(None, help="custom: 'path/to/file.py:function' mapping a raw row to "
                                          "a schema row.")
    kind: str = field("rl", help="custom: which schema the mapped rows follow.",
                      choices=("rl", "preference", "sft"))
    system_prompt: str | None = field(None, help="Put this system message first in every prompt (chat form), e.g. "
                                                 "to replace a chat template's long default system prompt.")
    arith: ArithConfig = section(ArithConfig, help="Options of the arith synthetic task.")
    tools_arith: ToolsArithConfig = section(ToolsArithConfig, help="Options of the tools-arith task.")

    def validate(self) -> None:
        if not 0.0 <= self.test_fraction < 1.0:
            raise UserError(f"key 'test_fraction' expected a number in [0, 1), got {self.test_fraction}")
        if self.dataset == "custom" and not self.map_fn:
            raise UserError("preprocess custom: key 'map_fn' is required ('path/to/file.py:function')")
        if self.dataset not in ("arith", "tools-arith") and self.dataset != "gsm8k" and not self.input:
            raise UserError(f"preprocess {self.dataset}: key 'input' is required (a local file or folder)")
        if self.system_prompt is not None and not self.system_prompt.strip():
            raise UserError("key 'system_prompt' expected a non-empty string (leave it out for none)")
        if self.max_rows is not None and self.max_rows <= 0:
            raise UserError(f"key 'max_rows' expected a positive integer, got {self.max_rows}")
