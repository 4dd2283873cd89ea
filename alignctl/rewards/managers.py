"""Reward managers: turn decoded responses into token-level scores.

A manager takes plain per-sample data (``RewardInputs``: data sources, decoded responses, ground
truths, extra infos, response lengths or mask, response width T) and returns a ``RewardOutput``
whose ``token_level_scores`` [B, T] hold each sample's scalar score on its LAST response token
(index length-1), zeros elsewhere: the outcome reward arrives when the response ends, and the
advantage estimators propagate it backwards from there.

Managers, by name (verl's):

- ``naive``: ``compute_score(data_source, solution_str, ground_truth, extra_info)`` per sample,
  in this process (``num_workers=0``) or in ``num_workers`` worker processes, each item under a
  hard ``timeout_s`` (timed-out items score 0 and are counted).
- ``batch``: one call ``fn(data_sources, solution_strs, ground_truths, extra_infos)`` over the
  whole batch returning one result per sample (for scorers that batch work, e.g. an API or a
  model). With ``num_workers > 0`` that call runs in a worker process under ``timeout_s``.
- ``dapo``: ``naive`` plus DAPO's soft overlong penalty (see ``overlong_penalty``).

They live in ``REWARD_MANAGERS`` (``reward_model.reward_manager`` names one; a plugin adds its own
with ``@register_reward_manager("name")``). Each class declares what it needs from the RL config
in ``config_options``: its constructor option -> the dotted config key the trainer reads it from
(dapo: ``max_resp_len`` <- ``data.max_response_length`` ...), so the trainer builds any manager
without knowing it by name.

A scorer result is a number or a dict with ``score`` and extra metrics; extras come back per
sample in ``RewardOutput.extra`` (None where a sample did not report that key).

Notation: B samples, T response width (padded), l a response's length in tokens.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from alignctl.registries import Registry
from alignctl.errors import UserError
from alignctl.rewards.reward_function import Score, check_score, describe_function
from alignctl.rewards.pool import CallResult, ScoringPool, collect_failures
from alignctl.rewards.rule_scorers import default_compute_score

if TYPE_CHECKING:
    import torch

DEFAULT_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------
# Inputs and outputs
# ---------------------------------------------------------------------------------------------


@dataclass
class RewardInputs:
    """One batch of decoded responses. Give ``response_lengths`` ([B] ints, right padding) or
    ``response_mask`` ([B, T] 0/1; the score then goes on the last 1 of each row)."""

    data_sources: Sequence[str]
    responses: Sequence[str]
    ground_truths: Sequence[Any]
    response_width: int
    extra_infos: Sequence[dict[str, Any] | None] | None = None
    response_lengths: Sequence[int] | None = None
    response_mask: Any = None

    def __post_init__(self) -> None:
        batch = len(self.responses)
        if self.extra_infos is None:
            self.extra_infos = [None] * batch
        if (self.response_lengths is None) == (self.response_mask is None):
            raise ValueError("RewardInputs needs exactly one of response_lengths and response_mask")
        if self.response_mask is not None:
            mask = self.response_mask.tolist() if hasattr(self.response_mask, "tolist") else self.response_mask
            self.response_mask = [[int(v) for v in row] for row in mask]
            if any(len(row) != self.response_width for row in self.response_mask):
                raise ValueError(f"response_mask rows must have response_width={self.response_width} entries")
        sizes = {
            "data_sources": len(self.data_sources),
            "ground_truths": len(self.ground_truths),
            "extra_infos": len(self.extra_infos),
            "response_lengths/mask": len(self.response_lengths if self.response_mask is None else self.response_mask),
        }
        wrong = {k: v for k, v in sizes.items() if v != batch}
        if wrong:
            raise ValueError(f"RewardInputs fields disagree with len(responses)={batch}: {wrong}")
        bad = [n for n in self.lengths() if not 0 <= n <= self.response_width]
        if bad:
            raise ValueError(f"response lengths {bad} are outside [0, response_width={self.response_width}]")

    @property
    def batch_size(self) -> int:
        return len(self.responses)

    def lengths(self) -> list[int]:
        """Response length l of each sample, in tokens."""
        if self.response_mask is not None:
            return [sum(1 for v in row if v) for row in self.response_mask]
        return [int(n) for n in self.response_lengths or []]

    def score_positions(self) -> list[int]:
        """Index of each sample's last response token; -1 for an empty response."""
        if self.response_mask is not None:
            return [max((t for t, v in enumerate(row) if v), default=-1) for row in self.response_mask]
        return [n - 1 for n in self.lengths()]


def as_reward_inputs(inputs: RewardInputs | Mapping[str, Any]) -> RewardInputs:
    return inputs if isinstance(inputs, RewardInputs) else RewardInputs(**inputs)


@dataclass
class RewardOutput:
    """``token_level_scores`` [B, T] float32; ``scores`` [B] the scalar per sample (what was
    placed; an empty response's score is reported here but has no token to sit on);
    ``extra`` per-sample metrics; counts of items that timed out or whose worker crashed."""

    token_level_scores: torch.Tensor
    scores: list[float]
    extra: dict[str, list[Any]] = field(default_factory=dict)
    num_timeouts: int = 0
    num_crashes: int = 0


# ---------------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------------


def place_scores(scores: Sequence[float], positions: Sequence[int], width: int) -> torch.Tensor:
    """[B, T] float32 zeros with ``scores[i]`` at ``[i, positions[i]]``; rows with position -1
    (empty responses) stay all zero."""
    import torch

    out = torch.zeros(len(scores), width, dtype=torch.float32)
    for row, (score, pos) in enumerate(zip(scores, positions, strict=True)):
        if pos >= 0:
            out[row, pos] = score
    return out


def overlong_penalty(length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment: 0 while l <= L - b, then a ramp reaching -p at l = L.

        penalty(l) = min(0, -(l - (L - b)) / b * p)

    L = ``max_resp_len``, b = ``buffer_len`` (> 0), p = ``penalty_factor``.
    """
    expected = max_resp_len - buffer_len
    return min(0.0, -(length - expected) / buffer_len * penalty_factor)


def merge_extras(per_sample: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per-sample extra dicts -> one list per key (None where a sample lacks the key)."""
    keys: dict[str, None] = {}
    for extra in per_sample:
        keys.update(dict.fromkeys(extra))
    return {key: [extra.get(key) for extra in per_sample] for key in keys}


@dataclass
class ScoredBatch:
    """A batch's scalar scores, per-sample extra metrics, and counts of unscored items."""

    scores: list[float]
    extras: list[dict[str, Any]]
    num_timeouts: int = 0
    num_crashes: int = 0


def _from_results(results: Sequence[Score | None], num_timeouts: int, num_crashes: int) -> ScoredBatch:
    """None stands for an item that timed out or crashed: it scores 0 with no extras."""
    return ScoredBatch(
        scores=[r.score if r is not None else 0.0 for r in results],
        extras=[dict(r.extra) if r is not None else {} for r in results],
        num_timeouts=num_timeouts,
        num_crashes=num_crashes,
    )


# ---------------------------------------------------------------------------------------------
# Managers
# ---------------------------------------------------------------------------------------------


class RewardManager:
    """Common plumbing: default scorer, the optional worker pool, placement of scores.

    ``compute_score``: the scorer (None: ``default_compute_score`` by data_source; for ``batch``
    the default maps it over the batch). ``num_workers``: 0 scores in this process; N > 0 uses
    N persistent worker processes with a hard ``timeout_s`` per item. In-process, only scorers
    that guard themselves (the math scorer) can time out.
    """

    name: ClassVar[str] = ""
    # constructor option -> the dotted RL config key it is read from (its needs; see the module docstring)
    config_options: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        compute_score: Callable[..., Any] | None = None,
        num_workers: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if num_workers < 0:
            raise UserError(f"reward manager {self.name!r}: num_workers must be >= 0, got {num_workers}")
        if timeout_s <= 0:
            raise UserError(f"reward manager {self.name!r}: timeout_s must be > 0, got {timeout_s}")
        self.compute_score = compute_score if compute_score is not None else self._default_scorer(timeout_s)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._scoring_pool: ScoringPool | None = None

    def _default_scorer(self, timeout_s: float) -> Callable[..., Any]:
        return functools.partial(default_compute_score, math_timeout_s=timeout_s)

    def _pool(self, max_workers: int) -> ScoringPool:
        if self._scoring_pool is None:
            preload = ["alignctl.rewards.rule_scorers", "alignctl.rewards.reward_function"]
            if getattr(self.compute_score, "func", None) in (default_compute_score, default_batch_compute_score):
                preload.append("math_verify")
            self._scoring_pool = ScoringPool(max_workers, preload=preload, warm=(self.compute_score,))
            weakref.finalize(self, self._scoring_pool.close)
        return self._scoring_pool

    def __call__(self, inputs: RewardInputs | Mapping[str, Any]) -> RewardOutput:
        batch = as_reward_inputs(inputs)
        scored = self.shape_scores(batch, self.score_batch(batch))
        return RewardOutput(
            token_level_scores=place_scores(scored.scores, batch.score_positions(), batch.response_width),
            scores=scored.scores,
            extra=merge_extras(scored.extras),
            num_timeouts=scored.num_timeouts,
            num_crashes=scored.num_crashes,
        )

    def score_batch(self, batch: RewardInputs) -> ScoredBatch:
        """Score every sample (naive: one call each; batch: one call for all)."""
        raise NotImplementedError

    def shape_scores(self, batch: RewardInputs, scored: ScoredBatch) -> ScoredBatch:
        """Hook for score shaping after scoring (dapo's overlong penalty; a subclass's own terms)."""
        return scored

    def close(self) -> None:
        """Stop the worker processes (also done when the manager is garbage collected)."""
        if self._scoring_pool is not None:
            self._scoring_pool.close()
            self._scoring_pool = None


class NaiveRewardManager(RewardManager):
    """Per-sample ``compute_score(data_source, solution_str, ground_truth, extra_info)``."""

    name = "naive"

    def score_batch(self, batch: RewardInputs) -> ScoredBatch:
        items = list(zip(batch.data_sources, batch.responses, batch.ground_truths, batch.extra_infos or [], strict=True))
        if self.num_workers == 0:
            with collect_failures() as tally:
                results = [check_score(self.compute_score(*item), self.compute_score) for item in items]
            return _from_results(results, tally.timeouts, tally.crashes)
        calls = self._pool(self.num_workers).map(self.compute_score, items, self.timeout_s)
        return _from_pool(calls, self.compute_score)


def _from_pool(calls: Sequence[CallResult], fn: Callable[..., Any]) -> ScoredBatch:
    results = [check_score(c.value, fn) if c.ok else None for c in calls]
    return _from_results(results, sum(c.timed_out for c in calls), sum(c.crashed for c in calls))


def default_batch_compute_score(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None],
    *,
    math_timeout_s: float | None = None,
) -> list[float]:
    """``default_compute_score`` over a batch (the ``batch`` manager's default)."""
    return [
        default_compute_score(ds, s, gt, info, math_timeout_s=math_timeout_s)
        for ds, s, gt, info in zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True)
    ]


class BatchRewardManager(RewardManager):
    """One call ``fn(data_sources, solution_strs, ground_truths, extra_infos) -> list`` per batch."""

    name = "batch"

    def _default_scorer(self, timeout_s: float) -> Callable[..., Any]:
        return functools.partial(default_batch_compute_score, math_timeout_s=timeout_s)

    def score_batch(self, batch: RewardInputs) -> ScoredBatch:
        args = (list(batch.data_sources), list(batch.responses), list(batch.ground_truths), list(batch.extra_infos or []))
        if self.num_workers == 0:
            with collect_failures() as tally:
                values = self.compute_score(*args)
            timeouts, crashes = tally.timeouts, tally.crashes
        else:
            call = self._pool(1).call(self.compute_score, args, self.timeout_s)
            if not call.ok:  # the whole batch went unscored
                size = batch.batch_size
                return _from_results([None] * size, size * call.timed_out, size * call.crashed)
            values, timeouts, crashes = call.value, 0, 0
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or len(values) != batch.batch_size:
            got = f"{len(values)} results" if isinstance(values, Sequence) else type(values).__name__
            raise UserError(
                f"batch {describe_function(self.compute_score)} returned {got} for a batch of "
                f"{batch.batch_size}; expected a list with one result per sample"
            )
        return _from_results([check_score(v, self.compute_score) for v in values], timeouts, crashes)


class DAPORewardManager(NaiveRewardManager):
    """``naive`` plus the soft overlong penalty of DAPO (Yu et al., 2025, sec. 3.4).

    ``max_resp_len`` L (None: the response width T), ``overlong_buffer_len`` b (0 turns the
    penalty off), ``overlong_penalty_factor`` p. Reports ``overlong_reward`` (the penalty added)
    and ``overlong`` (whether it was < 0) in ``extra``.
    """

    name = "dapo"
    config_options = {"max_resp_len": "data.max_response_length",
                      "overlong_buffer_len": "reward_model.overlong_buffer_len",
                      "overlong_penalty_factor": "reward_model.overlong_penalty_factor"}

    def __init__(
        self,
        compute_score: Callable[..., Any] | None = None,
        num_workers: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_resp_len: int | None = None,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
    ) -> None:
        super().__init__(compute_score, num_workers, timeout_s)
        if max_resp_len is not None and max_resp_len <= 0:
            raise UserError(f"reward manager 'dapo': max_resp_len must be > 0, got {max_resp_len}")
        if overlong_buffer_len < 0 or (max_resp_len is not None and overlong_buffer_len > max_resp_len):
            raise UserError(
                f"reward manager 'dapo': overlong_buffer_len must be in [0, max_resp_len={max_resp_len}], "
                f"got {overlong_buffer_len}"
            )
        if overlong_penalty_factor < 0:
            raise UserError(f"reward manager 'dapo': overlong_penalty_factor must be >= 0, got {overlong_penalty_factor}")
        self.max_resp_len = max_resp_len
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor

    def shape_scores(self, batch: RewardInputs, scored: ScoredBatch) -> ScoredBatch:
        max_len = self.max_resp_len if self.max_resp_len is not None else batch.response_width
        if self.overlong_buffer_len > max_len:
            raise UserError(
                f"reward manager 'dapo': overlong_buffer_len={self.overlong_buffer_len} exceeds the "
                f"response width {max_len}"
            )
        for i, length in enumerate(batch.lengths()):
            penalty = (
                overlong_penalty(length, max_len, self.overlong_buffer_len, self.overlong_penalty_factor)
                if self.overlong_buffer_len > 0
                else 0.0
            )
            scored.scores[i] += penalty
            scored.extras[i] = {**scored.extras[i], "overlong_reward": penalty, "overlong": penalty < 0}
        return scored


REWARD_MANAGERS: Registry[type[RewardManager]] = Registry("reward manager")


def register_reward_manager(name: str) -> Callable[[type[RewardManager]], type[RewardManager]]:
    """Class decorator adding a ``RewardManager`` subclass as ``reward_model.reward_manager=name``."""

    def decorator(cls: type[RewardManager]) -> type[RewardManager]:
        cls.name = name
        return REWARD_MANAGERS.register(name)(cls)

    return decorator


for _builtin in (NaiveRewardManager, BatchRewardManager, DAPORewardManager):
    register_reward_manager(_builtin.name)(_builtin)


def build_reward_manager(
    name: str,
    compute_score: Callable[..., Any] | None = None,
    num_workers: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **options: Any,
) -> RewardManager:
    """The manager registered as ``name``; UserError for an unknown name or option."""
    if name not in REWARD_MANAGERS:
        raise UserError(f"unknown reward manager {name!r} (known: {', '.join(REWARD_MANAGERS)})")
    cls = REWARD_MANAGERS.get(name)
    unknown = sorted(set(options) - set(cls.config_options))
    if unknown:
        raise UserError(
            f"reward manager {name!r} has no option {unknown[0]!r} (options: {', '.join(cls.config_options) or 'none'})"
        )
    return cls(compute_score=compute_score, num_workers=num_workers, timeout_s=timeout_s, **options)
