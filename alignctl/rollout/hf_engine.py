"""``hf`` rollout engine: in-process generation on the training module itself (the hybrid engine).

The engine holds a reference to the actor's ``nn.Module``; there is no weight copy, so
``sync_weights()`` is free and generation always sees the latest update.

Why it is faster than ``model.generate`` for RL rollouts:
  * one prefill per prompt: ``B`` prompts are prefilled once, then the KV cache is repeated ``n``
    times along the batch (``generate(num_return_sequences=n)`` prefills every copy);
  * the head every prompt starts with (a chat template's system message) is prefilled once for the
    whole batch and its cache repeated ``B`` times before the rest of each prompt is prefilled;
  * finished rows are dropped from the running batch (KV cache, positions and mask are
    index-selected), so compute shrinks as responses end instead of decoding padding;
  * a preallocated KV cache written in place (see ``kv_cache.py``) instead of a cat per token;
  * no logits processors / stopping-criteria objects: one fused sampling function per step, and the
    lm_head runs on the last position only (``logits_to_keep=1``).

Left padding and positions: prompts are left-padded to the longest prompt ``P`` (with a shared head
``h``: ``[head | left-padded rests]``, the pads between the head and each rest masked out). A row with ``p``
real tokens gets position ids ``0..p-1`` on its real tokens (pads get 0 and are masked out of
attention), and its ``t``-th generated token sits at position ``p + t`` — the same ids an unpadded
forward of that row would use (``models.loading.position_ids_from_mask``, the package's one rule).

Finished rows are compacted lazily: once at least ``compact_fraction`` of the running rows have
stopped (default 1/8), they are removed in one index-select. A finished row waiting for compaction
keeps decoding throw-away tokens that are masked out of the output; this bounds wasted compute at
``compact_fraction`` while avoiding one full KV-cache copy per finishing row.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache

from alignctl.batch import pad_rows
from alignctl.device import cuda_available
from alignctl.errors import UserError
from alignctl.models.compat import cache_kwargs
from alignctl.models.loading import position_ids_from_mask
from alignctl.models.reward_forward import common_prefix_length
from alignctl.rollout.engine import (
    FinishReason,
    RolloutEngine,
    RolloutOutput,
    RolloutSetup,
    SamplingParams,
    default_stop_ids,
    module_probe_log_probs,
    validate_prompts,
)
from alignctl.rollout.kv_cache import all_full_attention, make_cache
from alignctl.rollout.sampling import sample_next

GatherHook = Callable[[], AbstractContextManager[object]]


@dataclass
class _Running:
    """State of the rows still in the decode batch (``b`` rows; global row ids in ``rows``)."""

    rows: torch.Tensor  # [b] long, index into the N = B*n output rows
    attn: torch.Tensor  # [b, P + R] bool, prompt padding mask followed by ones
    pos: torch.Tensor  # [b] long, position id of the next input token
    done: torch.Tensor  # [b] bool, stopped but not yet compacted away

    def keep(self, keep: torch.Tensor) -> None:
        self.rows, self.attn, self.pos, self.done = self.rows[keep], self.attn[keep], self.pos[keep], self.done[keep]


@dataclass
class _Outputs:
    """Per-row output buffers over all N = B*n rows (written at global row ids)."""

    tokens: torch.Tensor  # [N, R] long
    logps: torch.Tensor  # [N, R] float32
    lengths: torch.Tensor  # [N] long, R until a stop token is sampled
    stopped: torch.Tensor  # [N] bool, a stop token was sampled

    @classmethod
    def empty(cls, rows: int, max_new: int, pad_id: int, device: torch.device) -> _Outputs:
        return cls(
            tokens=torch.full((rows, max_new), pad_id, dtype=torch.long, device=device),
            logps=torch.zeros((rows, max_new), dtype=torch.float32, device=device),
            lengths=torch.full((rows,), max_new, dtype=torch.long, device=device),
            stopped=torch.zeros((rows,), dtype=torch.bool, device=device),
        )


class HFRolloutEngine(RolloutEngine):
    """Batched sampling with a KV cache on a transformers causal LM held by reference."""

    name = "hf"

    def __init__(
        self,
        model: nn.Module,
        *,
        pad_token_id: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        gather_params: GatherHook | None = None,
        compact_fraction: float = 0.125,
        preallocate_cache: bool | None = None,
    ) -> None:
        self.model = model
        config = model.config
        gen_cfg = getattr(model, "generation_config", None)
        eos = eos_token_id if eos_token_id is not None else getattr(gen_cfg, "eos_token_id", None)
        self.default_stop_ids = default_stop_ids(eos if eos is not None else config.eos_token_id)
        pad = pad_token_id if pad_token_id is not None else getattr(config, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (self.default_stop_ids or (0,))[0])
        self.gather_params: GatherHook = gather_params or contextlib.nullcontext
        self.compact_fraction = compact_fraction
        # The in-place cache and the prebuilt decode mask assume every layer is full attention.
        self.preallocate = all_full_attention(config) if preallocate_cache is None else preallocate_cache

    @classmethod
    def from_setup(cls, rollout_cfg: Any, setup: RolloutSetup) -> HFRolloutEngine:
        """The training module itself (the hybrid engine, no copy), or the actor's low-precision copy
        (rollout.dtype), which then takes the trainer's weights by name before every rollout."""
        if setup.rollout_model is not None:
            engine = cls(setup.rollout_model, pad_token_id=setup.pad_token_id, eos_token_id=setup.eos_token_ids)
            engine.holds_own_weights = True
            return engine
        engine = cls(setup.model, pad_token_id=setup.pad_token_id, eos_token_id=setup.eos_token_ids,
                     gather_params=setup.gather_params)
        engine.holds_own_weights = setup.own_copy
        return engine

    # -- lifecycle: weights are shared with the trainer, and the KV cache lives only inside generate():
    # no tensor of a rollout outlives the call except the returned output (on the CPU).
    def wake(self) -> None:
        return None

    def sleep(self) -> None:
        """Hand the rollout's freed blocks (KV cache, logits) from torch's CUDA caching allocator
        back to the driver, for memory outside this process's allocator (another process on the
        GPU, NCCL buffers). Within the process the allocator would reuse them anyway, so this is
        ``rollout.free_cache_engine`` (on by default, as in verl); nothing to do on CPU."""
        if cuda_available() and torch.cuda.is_initialized():
            gc.collect()  # a reference cycle could still hold a cache block; empty_cache skips live ones
            torch.cuda.empty_cache()

    def sync_weights(self, weights: nn.Module | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """``None``: no-op (weights are shared). A module: generate with it from now on. (name, tensor)
        pairs: copy them into the held module (for a rollout that owns a separate copy)."""
        if weights is None:
            return
        if isinstance(weights, nn.Module):
            self.model = weights
            return
        params = dict(self.model.named_parameters(remove_duplicate=False))  # a tied head by both names
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"sync_weights: the rollout module has no parameter {name!r}")
                params[name].copy_(tensor)

    def probe_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor | None:
        """Only an engine with its own copy has anything to verify."""
        if not self.holds_own_weights:
            return None
        with self.gather_params(), _eval_mode(self.model):
            return module_probe_log_probs(self.model, token_ids)

    @property
    def compute_dtype(self) -> str:
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        vocab = getattr(self.model.config, "vocab_size", None)
        prompts = validate_prompts(prompt_ids, vocab)
        stop_ids = params.stop_token_ids if params.stop_token_ids is not None else self.default_stop_ids
        with self.gather_params(), torch.inference_mode(), _eval_mode(self.model):
            return self._generate(prompts, params, stop_ids)

    def _generate(self, prompts: list[list[int]], params: SamplingParams, stop_ids: tuple[int, ...]) -> RolloutOutput:
        device = _module_device(self.model)
        n, max_new = params.n, params.max_new_tokens
        head = shared_head_length(prompts)
        input_ids, prompt_mask = _head_and_rests(prompts, head, self.pad_token_id)
        input_ids, prompt_mask = input_ids.to(device), prompt_mask.bool().to(device)
        big_b, width = input_ids.shape[0] * n, input_ids.shape[1]
        cache = make_cache(self.model.config, width + max_new, self.preallocate)
        generator = None
        if params.seed is not None and not params.is_greedy:
            generator = torch.Generator(device=device).manual_seed(params.seed)

        t0 = time.perf_counter()
        logits = self._prefill(input_ids, prompt_mask, cache, head)
        if n > 1:  # share the prefill: repeat the cache, not the prompt
            cache.batch_repeat_interleave(n)
            logits, prompt_mask = logits.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        t_prefill = time.perf_counter() - t0

        attn = torch.ones((big_b, width + max_new), dtype=torch.bool, device=device)
        attn[:, :width] = prompt_mask
        state = _Running(torch.arange(big_b, device=device), attn, prompt_mask.sum(-1), torch.zeros_like(attn[:, 0]))
        out = _Outputs.empty(big_b, max_new, self.pad_token_id, device)
        stop_t = torch.tensor(stop_ids, dtype=torch.long, device=device)
        steps = self._decode(logits, cache, state, params, generator, stop_t, out, width)
        timing = {"prefill_s": t_prefill, "total_s": time.perf_counter() - t0, "decode_steps": float(steps)}
        return self._finish(out, params, len(prompts), timing)

    def _prefill(self, input_ids: torch.Tensor, mask: torch.Tensor, cache: Cache, head: int) -> torch.Tensor:
        """Run the padded prompts once (the first ``head`` columns, identical in every row, once for
        all rows); returns next-token logits [B, V]."""
        positions = position_ids_from_mask(mask)
        if head:
            self.model(input_ids=input_ids[:1, :head], attention_mask=mask[:1, :head].long(),
                       position_ids=positions[:1, :head], logits_to_keep=1, **cache_kwargs(self.model, cache))
            cache.batch_repeat_interleave(input_ids.shape[0])
        out = self.model(input_ids=input_ids[:, head:], attention_mask=mask.long(), position_ids=positions[:, head:],
                         logits_to_keep=1, **cache_kwargs(self.model, cache))
        return out.logits[:, -1]

    def _decode(
        self,
        logits: torch.Tensor,
        cache: Cache,
        state: _Running,
        params: SamplingParams,
        generator: torch.Generator | None,
        stop_t: torch.Tensor,
        out: _Outputs,
        width: int,
    ) -> int:
        """Sample/forward until every row stopped or ``max_new_tokens``; fills ``out`` in place.
        Returns the number of decode forwards run."""
        greedy, temp = params.is_greedy, params.logprob_temperature
        use_4d = self.preallocate and getattr(self.model.config, "_attn_implementation", None) == "sdpa"
        last = params.max_new_tokens - 1
        for t in range(params.max_new_tokens):
            tok, lp = sample_next(logits, temperature=temp, top_k=params.top_k, top_p=params.top_p,
                                  greedy=greedy, generator=generator)
            out.tokens[state.rows, t] = tok
            out.logps[state.rows, t] = lp
            if stop_t.numel() and self._record_stops(tok, t, stop_t, state, out):
                keep = self._compact(state, cache, final=t == last)
                if keep is not None:
                    if keep.numel() == 0:
                        return t
                    tok = tok[keep]
            if t == last:
                return t
            kv_len = width + t + 1
            # sdpa + full attention: the decode mask is just the padding mask; a view of the prebuilt
            # buffer replaces transformers' per-step mask construction.
            mask = state.attn[:, None, None, :kv_len] if use_4d else state.attn[:, :kv_len].long()
            logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=state.pos[:, None],
                                logits_to_keep=1, **cache_kwargs(self.model, cache)).logits[:, -1]
            state.pos += 1
        return params.max_new_tokens

    @staticmethod
    def _record_stops(tok: torch.Tensor, t: int, stop_t: torch.Tensor, state: _Running, out: _Outputs) -> bool:
        """Mark rows whose token ``t`` is a stop token (first time only). True if any row stopped."""
        new_stop = torch.isin(tok, stop_t) & ~state.done
        if not bool(new_stop.any()):
            return False
        rows = state.rows[new_stop]
        out.lengths[rows] = t + 1
        out.stopped[rows] = True
        state.done |= new_stop
        return True

    def _compact(self, state: _Running, cache: Cache, final: bool) -> torch.Tensor | None:
        """Drop finished rows once they are ``compact_fraction`` of the batch (or all of it).
        Returns the kept batch indices, or None when nothing was dropped."""
        n_done, b = int(state.done.sum()), state.rows.numel()
        if final or (n_done < b and n_done < max(1.0, self.compact_fraction * b)):
            return None
        keep = (~state.done).nonzero().squeeze(-1)
        state.keep(keep)
        if keep.numel():
            cache.batch_select_indices(keep)
        return keep

    def _finish(self, out: _Outputs, params: SamplingParams, n_prompts: int, timing: dict[str, float]) -> RolloutOutput:
        """Mask everything after each row's stop token, trim to the longest response, pack the output."""
        lengths = out.lengths
        r = int(lengths.max())
        mask = torch.arange(r, device=lengths.device)[None, :] < lengths[:, None]
        tokens = out.tokens[:, :r].masked_fill(~mask, self.pad_token_id)
        logps = out.logps[:, :r].masked_fill(~mask, 0.0)
        reasons: list[FinishReason] = ["stop" if s else "length" for s in out.stopped.tolist()]
        n, n_tokens = params.n, int(lengths.sum())
        metrics = {f"rollout/{k}": v for k, v in timing.items()}
        metrics.update({"rollout/tokens": float(n_tokens),
                        "rollout/tokens_per_s": n_tokens / max(timing["total_s"], 1e-9)})
        return RolloutOutput(
            prompt_index=torch.arange(n_prompts).repeat_interleave(n),
            sample_index=torch.arange(n).repeat(n_prompts),
            response_ids=tokens.cpu(),
            response_mask=mask.long().cpu(),
            response_lengths=lengths.cpu(),
            log_probs=logps.cpu() if params.logprobs else None,
            finish_reason=reasons,
            pad_token_id=self.pad_token_id,
            metrics=metrics,
        )


# Below this many shared tokens a second prefill call costs more than it saves.
MIN_SHARED_HEAD = 4


def shared_head_length(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_HEAD) -> int:
    """Leading tokens all ``prompts`` share, leaving each at least one of its own (its last token
    gives its first logits); 0 for a single prompt or a head shorter than ``minimum``."""
    if len(prompts) < 2:
        return 0
    head = min(min(common_prefix_length(prompts[0], p), len(p) - 1) for p in prompts)
    return head if head >= minimum else 0


def _head_and_rests(prompts: list[list[int]], head: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[head | left-padded rests]`` ids and mask [B, head + longest rest]."""
    rest_ids, rest_mask = pad_rows([p[head:] for p in prompts], pad_id, side="left")
    head_ids = torch.tensor(prompts[0][:head], dtype=torch.long).expand(len(prompts), head)
    return (torch.cat([head_ids, rest_ids], dim=1),
            torch.cat([torch.ones(len(prompts), head, dtype=rest_mask.dtype), rest_mask], dim=1))


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) during generation; the caller's train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _module_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    raise UserError("rollout model has no parameters; expected a causal LM module")


@contextlib.contextmanager
def fsdp2_gather_params(model: nn.Module) -> Iterator[None]:
    """Gather hook for FSDP2 (``fully_shard``) modules: unshard once for the whole rollout.

    Without it every decode forward would all-gather and reshard each layer. Inside the block the
    FSDP modules keep their parameters unsharded; on exit they reshard and ``reshard_after_forward``
    goes back to FSDP2's default for ``reshard_after_forward=None``: False for ``model`` (the root),
    True for the inner modules. Models sharded with other settings need their own hook. Use as
    ``HFRolloutEngine(model, gather_params=lambda: fsdp2_gather_params(model))``.
    """
    from torch.distributed.fsdp import FSDPModule

    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in fsdp_modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in fsdp_modules:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)
