"""Responses of one model to the eval prompts, with the ``hf`` rollout engine (batched, seeded).

Each model tokenizes the prompts with its own chat template (a policy and a reference may use
different tokenizers). Batch ``b`` of a model samples with seed ``SeedSequence([seed, role, b])``,
so results do not depend on which other models ran before, and the policy and the reference draw
independent samples even when they are the same checkpoint.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alignctl.console import track
from alignctl.eval.data import PromptRow
from alignctl.tools.chat import render_prompt

ROLE_IDS = {"policy": 0, "reference": 1}


@dataclass
class Generations:
    """``texts[i][j]``: sample ``j`` of prompt ``i`` (special tokens removed)."""

    texts: list[list[str]]
    token_lengths: list[list[int]]
    truncated: list[list[bool]]  # hit max_new_tokens without a stop token

    @property
    def char_lengths(self) -> np.ndarray:
        return np.array([[len(t) for t in row] for row in self.texts], dtype=np.float64)


def tokenize_prompts(tokenizer: Any, rows: Sequence[PromptRow]) -> list[list[int]]:
    """Chat-templated prompt ids ending in the assistant turn, rendered as RL renders its prompts
    (``tools/chat.py:render_prompt``); plain text when the tokenizer has no template."""
    out = []
    for row in rows:
        if getattr(tokenizer, "chat_template", None):
            ids = render_prompt(tokenizer, row.messages, [])
        else:
            ids = tokenizer(row.text)["input_ids"]
        out.append([int(t) for t in ids])
    return out


def batch_seed(seed: int, role: str, batch: int) -> int:
    return int(np.random.SeedSequence([seed, ROLE_IDS[role], batch]).generate_state(1)[0])


def generate(model_path: str, tokenizer: Any, prompt_ids: list[list[int]], *, role: str, params: Any,
             batch_size: int, seed: int, device: str, dtype: str, progress: bool) -> Generations:
    """Load the model, generate ``params.n`` responses per prompt, free the model.

    ``params`` is a :class:`alignctl.rollout.SamplingParams` (its seed is replaced per batch)."""
    import dataclasses

    import torch

    from alignctl.models.loading import load_causal_lm
    from alignctl.rollout import get_rollout_engine

    model = load_causal_lm(model_path, dtype=dtype).to(device)
    eos = None
    if getattr(model.generation_config, "eos_token_id", None) is None and model.config.eos_token_id is None:
        eos = tokenizer.eos_token_id  # the engine's defaults come from the model; fall back to the tokenizer
    engine = get_rollout_engine("hf", model=model, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    texts: list[list[str]] = []
    lengths: list[list[int]] = []
    truncated: list[list[bool]] = []
    starts = range(0, len(prompt_ids), batch_size)
    for b, start in enumerate(track(starts, f"generating ({role})", enabled=None if progress else False)):
        out = engine.generate(prompt_ids[start:start + batch_size],
                              dataclasses.replace(params, seed=batch_seed(seed, role, b)))
        decoded = tokenizer.batch_decode(out.responses(), skip_special_tokens=True)
        n = params.n
        for i in range(len(decoded) // n):
            texts.append(decoded[i * n:(i + 1) * n])
            lengths.append(out.response_lengths[i * n:(i + 1) * n].tolist())
            truncated.append([r == "length" for r in out.finish_reason[i * n:(i + 1) * n]])
    del engine, model
    if device.startswith("cuda"):  # hand the memory back before the next model loads
        gc.collect()
        torch.cuda.empty_cache()
    return Generations(texts, lengths, truncated)
