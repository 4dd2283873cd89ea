"""The rollout contract: sampling parameters, the output batch, and the engine interface.

Every engine (``hf``, ``vllm``) takes token-id prompts and returns a :class:`RolloutOutput` whose
rows are grouped prompt-major: prompt ``i``'s ``n`` samples sit at rows ``i*n .. i*n+n-1``. GRPO /
RLOO group statistics use ``prompt_index`` as the group id, so the layout is part of the contract.

Log-probability convention (shared by all engines)
--------------------------------------------------
``log_probs[r, t]`` is ``log softmax(logits / T)[token]`` where ``T`` is the sampling temperature,
computed BEFORE top-k / top-p filtering. That is exactly what the actor recomputes in a full
forward pass for the PPO ratio (verl's ``compute_log_prob`` scales logits by the temperature and
never filters), so rollout log-probs and training log-probs agree up to kernel noise. Greedy
decoding (``greedy=True`` or ``temperature == 0``) reports ``log softmax(logits)`` (``T = 1``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from alignctl.batch import pad_rows
from alignctl.errors import UserError

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses.

    ``top_k <= 0`` and ``top_p >= 1`` disable those filters. ``temperature == 0`` means greedy (as in
    vLLM). ``stop_token_ids=None`` means the engine's default (the tokenizer / model EOS ids); an
    empty tuple means "never stop early". ``seed=None`` draws from the global torch RNG.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    greedy: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UserError(f"sampling n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise UserError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise UserError(f"sampling max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The ``T`` of the documented log-prob convention (1 for greedy)."""
        return 1.0 if self.is_greedy else self.temperature


@dataclass
class RolloutOutput:
    """Generated responses, prompt-major (row ``i*n + j`` = prompt ``i``, sample ``j``).

    Shapes (``N = B * n`` rows, ``R`` = longest response in this batch):
      prompt_index     [N]     long  which prompt the row came from (the GRPO group id)
      sample_index     [N]     long  ``j`` in ``0..n-1``
      response_ids     [N, R]  long  right-padded with ``pad_token_id``
      response_mask    [N, R]  long  1 on generated tokens up to and including the stop token
      response_lengths [N]     long  ``response_mask.sum(-1)``
      log_probs        [N, R]  float see the module docstring; 0 on padding; None if not requested
      finish_reason    N strs  "stop" (a stop token was sampled) or "length" (hit max_new_tokens)
      loss_mask        [N, R]  long  multi-turn only: 1 on the sampled tokens (``response_mask``
                                     then also covers inserted tool-message tokens); None otherwise
      extras           per-row lists the rollout adds (multi-turn: tool calls, errors, turns)
    """

    prompt_index: torch.Tensor
    sample_index: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    response_lengths: torch.Tensor
    log_probs: torch.Tensor | None
    finish_reason: list[FinishReason]
    pad_token_id: int
    metrics: dict[str, float] = field(default_factory=dict)
    loss_mask: torch.Tensor | None = None
    extras: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.prompt_index.shape[0])

    @classmethod
    def from_ragged(
        cls,
        responses: Sequence[Sequence[int]],
        log_probs: Sequence[Sequence[float]] | None,
        finish_reason: Sequence[str],
        n: int,
        pad_token_id: int,
        metrics: dict[str, float] | None = None,
    ) -> RolloutOutput:
        """Pack prompt-major ragged responses (``len(responses) == B * n``) into padded tensors."""
        if len(responses) % n:
            raise ValueError(f"{len(responses)} responses is not a multiple of n={n}")
        rows = len(responses)
        ids, mask = pad_rows(responses, pad_token_id)
        logps = torch.zeros(ids.shape, dtype=torch.float32)
        if log_probs is not None:
            logps, logp_mask = pad_rows(log_probs, 0.0, width=ids.shape[1], dtype=torch.float32)
            if not torch.equal(logp_mask, mask):
                raise ValueError("log_probs rows must have one entry per response token")
        reasons: list[FinishReason] = []
        for i, r in enumerate(finish_reason):
            if r not in ("stop", "length"):
                raise ValueError(f"response {i} has finish reason {r!r}; expected 'stop' or 'length'")
            reasons.append("stop" if r == "stop" else "length")
        return cls(
            prompt_index=torch.arange(rows // n).repeat_interleave(n),
            sample_index=torch.arange(n).repeat(rows // n),
            response_ids=ids,
            response_mask=mask,
            response_lengths=mask.sum(-1),
            log_probs=logps if log_probs is not None else None,
            finish_reason=reasons,
            pad_token_id=pad_token_id,
            metrics=dict(metrics or {}),
        )

    def responses(self) -> list[list[int]]:
        """The responses as ragged token lists (padding removed)."""
        lengths = self.response_lengths.tolist()
        return [row[:length] for row, length in zip(self.response_ids.tolist(), lengths)]


@dataclass
class RolloutSetup:
    """What the actor hands an engine's ``from_setup``: the policy it generates for.

    model            the training module (full parameters inside ``gather_params``)
    model_path       the folder the policy was loaded from (engines with their own copy load it)
    dtype            the training parameters' dtype name ("float32", "bfloat16", ...)
    max_model_len    longest prompt + response the run can produce, in tokens
    gather_params    a context manager factory that gathers sharded parameters (FSDP2 / ZeRO-3)
    rollout_model    the actor's own low-precision copy for engines with ``dtype_copy`` (else None)
    seed             the run's seed
    own_copy         ``model`` belongs to the engine (a rollout worker's), not to a trainer
    """

    model: Any
    model_path: str
    pad_token_id: int
    eos_token_ids: list[int]
    dtype: str = "float32"
    max_model_len: int | None = None
    gather_params: Any = None
    rollout_model: Any = None
    seed: int = 0
    own_copy: bool = False


class RolloutEngine(ABC):
    """Generation engine lifecycle used by the hybrid actor/rollout worker.

    Per RL step the worker calls ``wake()`` -> ``sync_weights(...)`` (after each actor update) ->
    ``generate(...)`` -> ``sleep()`` so the rollout's memory (KV cache, its own weight copy for vLLM)
    is free while the actor trains.
    """

    name: str = ""
    # True when the engine generates with a copy of its own: the actor pushes the trainer's weights
    # (sync_weights) and verifies them (probe_log_probs) after every update.
    holds_own_weights: bool = False

    @classmethod
    def from_setup(cls, rollout_cfg: Any, setup: RolloutSetup) -> RolloutEngine:
        """Build the engine from ``actor_rollout_ref.rollout`` and the actor's :class:`RolloutSetup`;
        each engine reads the keys it needs."""
        raise NotImplementedError(f"rollout engine {cls.__name__} cannot be built from a config")

    def probe_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor | None:
        """``log softmax(logits)[t+1]`` at every position ``t`` of ``token_ids`` (length ``len - 1``)
        under the weights the engine generates with, or None for an engine that shares the trainer's
        module (nothing to verify). The actor compares it with its own after each weight sync."""
        return None

    def status_metrics(self) -> dict[str, float]:
        """Per-step facts about the engine (e.g. whether sleep really frees memory here)."""
        return {}

    @abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses for every prompt (token ids, no padding)."""

    @abstractmethod
    def sync_weights(self, weights: torch.nn.Module | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Make generation use the training module's current weights."""

    @abstractmethod
    def wake(self) -> None:
        """Reacquire generation resources before a rollout phase."""

    @abstractmethod
    def sleep(self) -> None:
        """Release generation resources during the training phase."""


def validate_prompts(prompt_ids: Sequence[Sequence[int]], vocab_size: int | None = None) -> list[list[int]]:
    """Check prompts are non-empty lists of in-range ids; returns them as plain int lists."""
    if len(prompt_ids) == 0:
        raise UserError("rollout got an empty list of prompts; expected at least one prompt")
    prompts: list[list[int]] = []
    for i, ids in enumerate(prompt_ids):
        row = [int(t) for t in ids]
        if not row:
            raise UserError(f"rollout prompt {i} is empty; expected at least one token id")
        if vocab_size is not None and (min(row) < 0 or max(row) >= vocab_size):
            raise UserError(f"rollout prompt {i} has a token id outside [0, {vocab_size}); got {min(row)}..{max(row)}")
        prompts.append(row)
    return prompts


@torch.no_grad()
def module_probe_log_probs(model: torch.nn.Module, token_ids: Sequence[int]) -> torch.Tensor:
    """``log softmax(logits)[t+1]`` at every position ``t`` of ``token_ids`` under ``model``, float32
    without autocast, on the CPU: the trainer's side of the weight-sync check, and the hf engine's own."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    with torch.autocast(device_type=device.type, enabled=False):
        logits = model(input_ids=ids).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].cpu()


def default_stop_ids(eos: Any) -> tuple[int, ...]:
    """Normalise an ``eos_token_id`` field (None, int or list) to a tuple of ids."""
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(int(t) for t in eos)
