"""Multi-turn, tool-using rollouts on top of any rollout engine, token in and token out.

A trajectory is the prompt's ids followed by, per turn, the ids the model sampled (loss mask 1,
with their log-probs) and, when that turn called tools, the ids the chat template puts around the
tool messages (loss mask 0): ``[prompt | sampled | inserted | sampled | ... ]``. Nothing is
decoded and re-encoded: the decoded text of a turn is used only to find its tool calls, and the
training pass sees exactly the ids that were sampled.

A turn whose calls cannot all be read (alignctl/tools/parsing.py: unclosed, not JSON, no name, no
object arguments) is flagged: none of its calls runs, the model gets one tool message saying why,
and the rollout counts it as one ``malformed`` call.

Per turn every unfinished trajectory continues from its own ids (``n = 1``; the first turn samples
the ``n`` responses per prompt); tool calls run in a thread pool, each under its tool's timeout. A
trajectory ends when a turn calls no tool (its final answer), after ``max_turns`` sampled turns, or
when the ids reach ``max_response_length`` (what is left is cut; finish reason ``length``).

Many trajectories are in flight at once. The prompts are split into ``lanes`` (whole prompt groups,
fixed by position); the engine decodes one lane's turn while the tool calls of the other lanes run,
and takes the next lane whose tools are all back. With one lane every turn is decoded as one batch
and waits for the slowest call of that turn (the best choice for fast tools such as the
calculator); with slow tools (a subprocess, a remote service) two or more lanes keep the engine
busy. Each lane's batch and sampling seed depend on its index and turn only, never on which tool
finished first, so a seeded rollout is the same whatever the tools' timing.

The output keeps the single-turn contract (:class:`RolloutOutput`, prompt-major rows) with
``response_mask`` = every real response token (what attention sees) and ``loss_mask`` = the
sampled ones (what the losses and the reward position use); see workers/sequences.py.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from alignctl.batch import pad_rows
from alignctl.rollout.engine import RolloutEngine, RolloutOutput, SamplingParams
from alignctl.tools.tool import TOOLS, ToolResult, run_tool
from alignctl.tools.chat import ToolTurns
from alignctl.tools.parsing import parse_tool_calls


@dataclass
class Trajectory:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    turns: int = 0
    finish: str = ""  # "stop" or "length" once done
    calls: Counter = field(default_factory=Counter)  # tool name -> calls
    errors: Counter = field(default_factory=Counter)  # error kind -> count
    valid_calls: int = 0

    def add(self, ids: Sequence[int], sampled: bool, logps: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.loss.extend([int(sampled)] * len(ids))
        self.logps.extend(logps if logps is not None else [0.0] * len(ids))

    def cut(self, budget: int) -> None:
        """Keep the first ``budget`` response ids; a cut trajectory ends with reason ``length``."""
        if len(self.ids) > budget:
            del self.ids[budget:], self.loss[budget:], self.logps[budget:]
            self.finish = "length"


@dataclass
class _Lane:
    """Whole prompt groups decoded together, turn after turn; lanes take turns at the engine."""

    index: int
    prompts: list[list[int]]
    trajs: list[Trajectory]
    turn: int = 0
    calls: list[tuple[Trajectory, list[concurrent.futures.Future[ToolResult]]]] = field(default_factory=list)
    submitted: float = 0.0
    # when each call of the current turn returned: appended by the call's thread before its future
    # completes (list.append is atomic), so complete once tools_done() is true
    done_at: list[float] = field(default_factory=list)

    def futures(self) -> list[concurrent.futures.Future[ToolResult]]:
        return [f for _, futures in self.calls for f in futures]

    def tools_done(self) -> bool:
        return all(f.done() for f in self.futures())


@dataclass
class _Clock:
    decode_s: float = 0.0  # the engine decoding
    tools_s: float = 0.0  # per lane, from its calls' start to the last one back, summed
    wait_s: float = 0.0  # the engine idle, waiting for tools


def _split_lanes(prompt_ids: Sequence[Sequence[int]], trajs: list[Trajectory], n: int, lanes: int) -> list[_Lane]:
    """Contiguous, nearly equal runs of prompts (with their n trajectories each)."""
    count = max(1, min(lanes, len(prompt_ids)))
    bounds = [round(k * len(prompt_ids) / count) for k in range(count + 1)]
    return [_Lane(k, [list(p) for p in prompt_ids[a:b]], trajs[a * n:b * n])
            for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def _turn_seed(seed: int | None, lane: int, turn: int) -> int | None:
    """The sampling seed of a lane's turn: lane 0 keeps the single-batch seeds (seed, then
    seed * 7919 + turn), other lanes get their own."""
    if seed is None:
        return None
    base = seed if turn == 0 else seed * 7919 + turn
    return base if lane == 0 else (base * 104729 + lane) % (2**63 - 1)


class MultiTurnRollout(RolloutEngine):
    """Wraps an engine; ``generate`` runs whole tool-using conversations."""

    name = "multi_turn"

    def __init__(self, engine: RolloutEngine, tokenizer: Any, tools: list[str], *, max_turns: int,
                 max_response_length: int, stop_ids: Sequence[int], timeout_s: float | None = None,
                 max_parallel_tools: int = 8, lanes: int = 1, tool_settings: Mapping[str, Any] | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        # tool_settings: config values a tool declares it takes (the python tool's isolation)
        self.tools = {name: _with_timeout(TOOLS.get(name).configured(tool_settings or {}), timeout_s)
                      for name in tools}
        self.max_turns = max_turns
        self.budget = max_response_length
        self.stop_ids = tuple(stop_ids)
        self.turn_ids = ToolTurns(tokenizer, self.stop_ids)
        self.max_parallel_tools = max_parallel_tools
        self.lanes = lanes

    # the engine's lifecycle, unchanged
    def wake(self) -> None:
        self.engine.wake()

    def sleep(self) -> None:
        self.engine.sleep()

    def sync_weights(self, weights: Any = None) -> None:
        self.engine.sync_weights(weights)

    @property
    def holds_own_weights(self) -> bool:  # type: ignore[override]
        return self.engine.holds_own_weights

    @property
    def compute_dtype(self) -> str:
        return str(getattr(self.engine, "compute_dtype", "float32"))

    def probe_log_probs(self, token_ids: Sequence[int]) -> Any:
        return self.engine.probe_log_probs(token_ids)

    def status_metrics(self) -> dict[str, float]:
        return self.engine.status_metrics()

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        trajs = [Trajectory(list(p)) for p in prompt_ids for _ in range(params.n)]
        lanes = _split_lanes(prompt_ids, trajs, params.n, self.lanes)
        clock = _Clock()
        with concurrent.futures.ThreadPoolExecutor(self.max_parallel_tools) as pool, \
                concurrent.futures.ThreadPoolExecutor(self.max_parallel_tools) as waiters:
            ready, waiting = collections.deque(lanes), []
            while ready or waiting:
                for lane in [lane for lane in waiting if lane.tools_done()]:  # back from its tools
                    waiting.remove(lane)
                    clock.tools_s += self._insert_results(lane)
                    ready.append(lane)
                if not ready:  # the engine would idle: wait for a call to come back
                    start = time.perf_counter()
                    concurrent.futures.wait([f for lane in waiting for f in lane.futures() if not f.done()],
                                            return_when=concurrent.futures.FIRST_COMPLETED)
                    clock.wait_s += time.perf_counter() - start
                    continue
                lane = ready.popleft()
                active = [t for t in lane.trajs if not t.finish]
                if not active:  # every conversation of the lane ended (the last allowed turn ends them all)
                    continue
                start = time.perf_counter()
                self._sample_turn(lane, active, params)
                clock.decode_s += time.perf_counter() - start
                lane.turn += 1
                self._submit_tools(lane, [t for t in active if not t.finish], pool, waiters,
                                   last_turn=lane.turn == self.max_turns)
                (waiting if lane.calls else ready).append(lane)
        for t in trajs:
            t.finish = t.finish or "stop"
        return self._output(trajs, params, clock)

    def _sample_turn(self, lane: _Lane, active: list[Trajectory], params: SamplingParams) -> None:
        """One sampled turn for every active trajectory of a lane (the first turn draws n per prompt)."""
        left = max(self.budget - len(t.ids) for t in active)
        seed = _turn_seed(params.seed, lane.index, lane.turn)
        if lane.turn == 0:
            out = self.engine.generate(lane.prompts, dataclasses.replace(params, max_new_tokens=left, seed=seed))
        else:
            out = self.engine.generate([t.prompt + t.ids for t in active],
                                       dataclasses.replace(params, n=1, max_new_tokens=left, seed=seed))
        responses = out.responses()
        logps = out.log_probs.tolist() if out.log_probs is not None else None
        for i, t in enumerate(active):
            t.add(responses[i], True, logps[i][:len(responses[i])] if logps is not None else None)
            t.turns += 1
            t.cut(self.budget)
            if out.finish_reason[i] == "length":
                t.finish = "length"

    def _submit_tools(self, lane: _Lane, trajs: list[Trajectory], pool: concurrent.futures.Executor,
                      waiters: concurrent.futures.Executor, *, last_turn: bool) -> None:
        """Parse each trajectory's last turn and start its calls; a turn without calls (or the last
        allowed turn) is the final answer. The calls run while the engine decodes other lanes."""
        lane.calls, lane.submitted, lane.done_at = [], time.perf_counter(), []
        for t in trajs:
            calls = parse_tool_calls(self._last_turn_text(t))
            if not calls or last_turn:
                t.finish = "stop"
                continue
            lane.calls.append((t, [waiters.submit(self._call, c.name, c.arguments, c.error, pool, lane.done_at)
                                   for c in calls]))

    def _insert_results(self, lane: _Lane) -> float:
        """Record the finished calls of a lane and append the template's tool-turn ids (on the
        calling thread: the tokenizer is not shared across threads). Returns the lane's tool seconds."""
        for t, futures in lane.calls:
            results = [f.result() for f in futures]
            for r in results:
                t.calls[r.name or "<malformed>"] += 1
                t.valid_calls += int(r.ok)
                if not r.ok:
                    t.errors[r.error] += 1
            t.add(self.turn_ids.ids(results), False)
            t.cut(self.budget)
            if len(t.ids) >= self.budget:  # the tool turn filled the budget: no room left for an answer
                t.finish = "length"
        lane.calls = []
        return max(lane.done_at, default=lane.submitted) - lane.submitted

    def _call(self, name: str, arguments: Any, parse_error: str, pool: concurrent.futures.Executor,
              done_at: list[float]) -> ToolResult:
        if parse_error:
            result = ToolResult(name, f"error: {parse_error}", False, 0.0, "malformed")
        else:
            result = run_tool(self.tools.get(name), name, arguments, pool)
        done_at.append(time.perf_counter())
        return result

    def _last_turn_text(self, t: Trajectory) -> str:
        start = len(t.loss)
        while start > 0 and t.loss[start - 1] == 1:
            start -= 1
        return self.tokenizer.decode(t.ids[start:], skip_special_tokens=True)

    def _output(self, trajs: list[Trajectory], params: SamplingParams, clock: _Clock) -> RolloutOutput:
        pad = getattr(self.engine, "pad_token_id", 0)
        metrics = {"multi_turn/decode_s": clock.decode_s, "multi_turn/tools_s": clock.tools_s,
                   "multi_turn/tool_wait_s": clock.wait_s}
        out = RolloutOutput.from_ragged([t.ids for t in trajs], [t.logps for t in trajs] if params.logprobs else None,
                                        [t.finish for t in trajs], params.n, pad, metrics)
        width = out.response_ids.shape[1]
        out.loss_mask, _ = pad_rows([t.loss for t in trajs], 0, width=width)
        # Per row, so that the controller can total them over every worker (trainers/metrics.py).
        out.extras = {"turns": [t.turns for t in trajs], "tool_valid_calls": [t.valid_calls for t in trajs],
                      "tool_errors": [sum(t.errors.values()) for t in trajs],
                      "tool_calls": [dict(t.calls) for t in trajs], "tool_error_kinds": [dict(t.errors) for t in trajs]}
        return out


def _with_timeout(tool: Any, timeout_s: float | None) -> Any:
    return tool if timeout_s is None else dataclasses.replace(tool, timeout_s=timeout_s)
