"""Multi-turn, tool-using rollouts on top of any rollout engine, token in and token out.

A trajectory is the prompt's ids followed by, per turn, the ids the model sampled (loss mask 1,
with their log-probs) and, when that turn called tools, the ids the chat template puts around the
tool messages (loss mask 0): ``[prompt | sampled | inserted | sampled | ... ]``. Nothing is
decoded and re-encoded: the decoded text of a turn is used only to find its tool calls, and the
training pass sees exactly the ids that were sampled.

Per turn every unfinished trajectory continues from its own ids (``n = 1``; the first turn samples
the ``n`` responses per prompt); the tool calls of all trajectories of a turn run at once in a
thread pool, each under its tool's timeout. A trajectory ends when a turn calls no tool (its
final answer), after ``max_turns`` sampled turns, or when the ids reach ``max_response_length``
(what is left is cut; finish reason ``length``).

The output keeps the single-turn contract (:class:`RolloutOutput`, prompt-major rows) with
``response_mask`` = every real response token (what attention sees) and ``loss_mask`` = the
sampled ones (what the losses and the reward position use); see workers/sequences.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from alignctl.batch import pad_rows
from alignctl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from alignctl.tools.base import TOOLS, ToolResult, run_tool
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


class MultiTurnRollout(RolloutEngine):
    """Wraps an engine; ``generate`` runs whole tool-using conversations."""

    name = "multi_turn"

    def __init__(self, engine: RolloutEngine, tokenizer: Any, tools: list[str], *, max_turns: int,
                 max_response_length: int, stop_ids: Sequence[int], timeout_s: float | None = None,
                 max_parallel_tools: int = 8) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = {name: _with_timeout(TOOLS.get(name), timeout_s) for name in tools}
        self.max_turns = max_turns
        self.budget = max_response_length
        self.stop_ids = tuple(stop_ids)
        self.turn_ids = ToolTurns(tokenizer, self.stop_ids)
        self.max_parallel_tools = max_parallel_tools

    # the engine's lifecycle, unchanged
    def wake(self) -> None:
        self.engine.wake()

    def sleep(self) -> None:
        self.engine.sleep()

    def sync_weights(self, weights: Any = None) -> None:
        self.engine.sync_weights(weights)

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        trajs = [Trajectory(list(p)) for p in prompt_ids for _ in range(params.n)]
        timing = {"decode_s": 0.0, "tools_s": 0.0}
        with concurrent.futures.ThreadPoolExecutor(self.max_parallel_tools) as pool:
            for turn in range(self.max_turns):
                active = [t for t in trajs if not t.finish]
                if not active:
                    break
                start = time.perf_counter()
                self._sample_turn(active, prompt_ids, params, turn)
                timing["decode_s"] += time.perf_counter() - start
                start = time.perf_counter()
                self._run_tools([t for t in active if not t.finish], pool, last_turn=turn == self.max_turns - 1)
                timing["tools_s"] += time.perf_counter() - start
        for t in trajs:
            t.finish = t.finish or "stop"
        return self._output(trajs, params, timing)

    def _sample_turn(self, active: list[Trajectory], prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     turn: int) -> None:
        """One sampled turn for every active trajectory (the first turn draws n per prompt)."""
        left = max(self.budget - len(t.ids) for t in active)
        if turn == 0:
            out = self.engine.generate(prompt_ids, dataclasses.replace(params, max_new_tokens=left))
        else:
            seed = None if params.seed is None else params.seed * 7919 + turn
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

    def _run_tools(self, trajs: list[Trajectory], pool: concurrent.futures.Executor, *, last_turn: bool) -> None:
        """Parse each trajectory's last turn; run its calls (all trajectories at once); insert the
        tool messages. A turn without calls is the final answer."""
        jobs: dict[int, list[concurrent.futures.Future[ToolResult]]] = {}
        with concurrent.futures.ThreadPoolExecutor(max(1, self.max_parallel_tools)) as waiters:
            for k, t in enumerate(trajs):
                calls = parse_tool_calls(self._last_turn_text(t))
                if not calls or last_turn:
                    t.finish = "stop"
                    continue
                jobs[k] = [waiters.submit(self._call, c.name, c.arguments, c.error, pool) for c in calls]
            for k, futures in jobs.items():
                t, results = trajs[k], [f.result() for f in futures]
                for r in results:
                    t.calls[r.name or "<malformed>"] += 1
                    t.valid_calls += int(r.ok)
                    if not r.ok:
                        t.errors[r.error] += 1
                t.add(self.turn_ids.ids(results), False)
                t.cut(self.budget)

    def _call(self, name: str, arguments: Any, parse_error: str, pool: concurrent.futures.Executor) -> ToolResult:
        if parse_error:
            return ToolResult(name, f"error: {parse_error}", False, 0.0, "malformed")
        return run_tool(self.tools.get(name), name, arguments, pool)

    def _last_turn_text(self, t: Trajectory) -> str:
        start = len(t.loss)
        while start > 0 and t.loss[start - 1] == 1:
            start -= 1
        return self.tokenizer.decode(t.ids[start:], skip_special_tokens=True)

    def _output(self, trajs: list[Trajectory], params: SamplingParams, timing: dict[str, float]) -> RolloutOutput:
        pad = getattr(self.engine, "pad_token_id", 0)
        metrics = {"multi_turn/decode_s": timing["decode_s"], "multi_turn/tools_s": timing["tools_s"]}
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
