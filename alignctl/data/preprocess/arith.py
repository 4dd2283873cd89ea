"""``arith``: an offline synthetic word-problem task, generated from a seed.

    Tom has 7 apples. He buys 5 more and gives away 3. How many apples does Tom have now?
    -> 7 + 5 = 12. 12 - 3 = 9. #### 9

The vocabulary is deliberately tiny (four names, four objects, a couple of phrases per
operation) so a character-level model can learn the task on a CPU in minutes; answers use
GSM8K's ``#### N`` format so the same rule reward scores both. Every intermediate value stays
non-negative (a subtraction never takes more than there is).

Files (the test questions never appear in any train file):
- ``train.parquet`` / ``test.parquet``: RL prompts, ground truth = the final number (the train
  questions are the first ones of the SFT file too, unless ``arith.disjoint_rl`` draws them after
  every SFT and preference question);
- ``sft_train.parquet`` / ``sft_test.parquet``: the worked answer as the completion, or, for a
  random ``arith.sft_terse_fraction`` of the rows, only the final ``#### N`` (real demonstration
  data mixes both styles, and an RL stage then shows which style the reward favours; see
  docs/data.md for what GRPO did with it on the tiny-model quickstart's model,
  pipelines/quickstart_tiny.yaml);
- ``pref_train.parquet`` / ``pref_test.parquet``: chosen = the worked answer, rejected = a
  plausible wrong one (an arithmetic slip, an off-by-one, a wrong operation, or right steps with
  a wrong final number).
``arith.num_test`` held-out questions are drawn first, so the test set does not change when the
train sizes do; the three test files share those questions.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from alignctl.config.preprocess import ArithConfig
from alignctl.data.preprocess.common import Context
from alignctl.data.readers import Record
from alignctl.data.schema import assistant, user
from alignctl.errors import UserError

DATA_SOURCE = "arith"
INSTRUCTION = 'Answer after "####".'
OPERATIONS = ("+", "-", "*")
NAMES = (("Tom", "He"), ("Sam", "He"), ("Ann", "She"), ("Mia", "She"))
OBJECTS = (("apple", "apples"), ("pen", "pens"), ("card", "cards"), ("book", "books"))
PHRASES = {"+": ("buys {n} more", "finds {n} more"),
           "-": ("gives away {n}", "loses {n}"),
           "*": ("ends up with {n} times as many",)}
STALL = 2000  # draws in a row without a new question before generate() gives up
WRONG_KINDS = ("slip", "off_by_one", "wrong_operation", "wrong_final")

# One worked step "a op b = c"; a wrong answer may hold steps whose c is not a op b.
Line = tuple[int, str, int, int]


def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


@dataclass(frozen=True)
class Step:
    op: str
    operand: int
    phrase: int  # which wording of the operation


@dataclass(frozen=True)
class Problem:
    name: int
    noun: int
    start: int
    steps: tuple[Step, ...]

    @property
    def question(self) -> str:
        name, pronoun = NAMES[self.name]
        singular, plural = OBJECTS[self.noun]
        actions = [PHRASES[s.op][s.phrase].format(n=s.operand) for s in self.steps]
        said = actions[0] if len(actions) == 1 else ", ".join(actions[:-1]) + " and " + actions[-1]
        has = f"{self.start} {singular if self.start == 1 else plural}"
        return f"{name} has {has}. {pronoun} {said}. How many {plural} does {name} have now?"

    def lines(self) -> list[Line]:
        out, value = [], self.start
        for step in self.steps:
            result = apply(step.op, value, step.operand)
            out.append((value, step.op, step.operand, result))
            value = result
        return out

    @property
    def answer(self) -> int:
        return self.lines()[-1][3]


def render(lines: list[Line], final: int) -> str:
    """``7 + 5 = 12. 12 - 3 = 9. #### 9``."""
    return " ".join(f"{a} {op} {b} = {c}." for a, op, b, c in lines) + f" #### {final}"


def check_config(cfg: ArithConfig) -> None:
    for key in ("num_train", "num_test"):
        if getattr(cfg, key) < 1:
            raise UserError(f"key 'arith.{key}' expected a positive integer, got {getattr(cfg, key)}")
    for key in ("num_sft", "num_pref"):
        if getattr(cfg, key) < 0:
            raise UserError(f"key 'arith.{key}' expected 0 (no such files) or more, got {getattr(cfg, key)}")
    if not 0 <= cfg.min_value <= cfg.max_value:
        raise UserError(f"keys 'arith.min_value'/'arith.max_value' expected 0 <= min_value <= max_value, "
                        f"got {cfg.min_value}/{cfg.max_value}")
    if not 1 <= cfg.min_steps <= cfg.max_steps:
        raise UserError(f"keys 'arith.min_steps'/'arith.max_steps' expected 1 <= min_steps <= max_steps, "
                        f"got {cfg.min_steps}/{cfg.max_steps}")
    bad = [op for op in cfg.operations if op not in OPERATIONS]
    if not cfg.operations or bad:
        raise UserError(f"key 'arith.operations' expected a non-empty list of +, -, *, got {cfg.operations}")
    if not 0.0 <= cfg.sft_terse_fraction <= 1.0:
        raise UserError(f"key 'arith.sft_terse_fraction' expected a number in [0, 1], got {cfg.sft_terse_fraction}")
    if "*" in cfg.operations and cfg.max_value < 2:
        raise UserError("key 'arith.operations': '*' needs arith.max_value >= 2 (a multiplier of 2 or more)")


def sample_problem(rng: random.Random, cfg: ArithConfig) -> Problem | None:
    """One random problem, or None when a subtraction would go below zero (the caller redraws)."""
    value = start = rng.randint(cfg.min_value, cfg.max_value)
    steps = []
    for _ in range(rng.randint(cfg.min_steps, cfg.max_steps)):
        op = rng.choice(cfg.operations)
        if op == "-":
            if min(cfg.max_value, value) < cfg.min_value:
                return None
            operand = rng.randint(cfg.min_value, min(cfg.max_value, value))
        elif op == "*":
            operand = rng.randint(max(2, cfg.min_value), cfg.max_value)
        else:
            operand = rng.randint(cfg.min_value, cfg.max_value)
        steps.append(Step(op, operand, rng.randrange(len(PHRASES[op]))))
        value = apply(op, value, operand)
    return Problem(rng.randrange(len(NAMES)), rng.randrange(len(OBJECTS)), start, tuple(steps))


def generate(rng: random.Random, cfg: ArithConfig, count: int, exclude: set[str]) -> list[Problem]:
    """``count`` problems with distinct questions, none of them in ``exclude``. Gives up (UserError)
    after ``STALL`` draws in a row without a new question: the space is (nearly) exhausted."""
    out: list[Problem] = []
    seen = set(exclude)
    stalled = 0
    while len(out) < count:
        problem = sample_problem(rng, cfg)
        if problem is None or problem.question in seen:
            stalled += 1
            if stalled >= STALL:
                raise UserError(f"arith: found only {len(out)} distinct problems of the {count} asked "
                                f"for; widen arith.min_value..max_value or arith.max_steps, or ask for fewer")
            continue
        stalled = 0
        seen.add(problem.question)
        out.append(problem)
    return out


# ---------------------------------------------------------------------------- wrong answers


def _replay(problem: Problem, at: int, op: str | None, delta: int) -> list[Line] | None:
    """The worked steps with step ``at`` done with ``op`` instead (if given) and its result off by
    ``delta``; later steps are computed correctly from the wrong value. None if a value goes < 0."""
    out, value = [], problem.start
    for i, step in enumerate(problem.steps):
        use = op if (i == at and op is not None) else step.op
        result = apply(use, value, step.operand) + (delta if i == at else 0)
        if result < 0:
            return None
        out.append((value, use, step.operand, result))
        value = result
    return out


def _wrong(problem: Problem, kind: str, rng: random.Random, ops: list[str]) -> tuple[list[Line], int] | None:
    at = rng.randrange(len(problem.steps))
    if kind == "wrong_final":
        final = problem.answer + rng.choice((-3, -2, -1, 1, 2, 3))
        return (problem.lines(), final) if final >= 0 else None
    if kind == "wrong_operation":
        # Only operations the task uses: an unseen symbol would give the rejected side away.
        others = [op for op in ops if op != problem.steps[at].op]
        lines = _replay(problem, at, rng.choice(others), 0) if others else None
    else:
        deltas = (-1, 1) if kind == "off_by_one" else (-3, -2, 2, 3)
        lines = _replay(problem, at, None, rng.choice(deltas))
    return (lines, lines[-1][3]) if lines else None


def wrong_answer(problem: Problem, rng: random.Random, ops: list[str]) -> tuple[str, str]:
    """(kind, text) of a plausible wrong worked answer whose final number is not the right one."""
    for _ in range(20):
        kind = rng.choice(WRONG_KINDS)
        wrong = _wrong(problem, kind, rng, ops)
        if wrong is not None and wrong[1] != problem.answer:
            return kind, render(*wrong)
    return "wrong_final", render(problem.lines(), problem.answer + 1)


# ---------------------------------------------------------------------------- rows


def _prompt(problem: Problem) -> list[dict[str, str]]:
    return [user(problem.question + " " + INSTRUCTION)]


def _info(problem: Problem) -> dict[str, Any]:
    return {"question": problem.question, "answer": render(problem.lines(), problem.answer)}


def rl_row(problem: Problem, rng: random.Random, cfg: ArithConfig) -> dict[str, Any]:
    return {"data_source": DATA_SOURCE, "prompt": _prompt(problem), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
            "extra_info": _info(problem)}


def sft_row(problem: Problem, rng: random.Random, cfg: ArithConfig) -> dict[str, Any]:
    info = _info(problem)
    # Draw only when asked for, so files made without terse rows stay byte-identical.
    terse = cfg.sft_terse_fraction > 0 and rng.random() < cfg.sft_terse_fraction
    answer = f"#### {problem.answer}" if terse else info["answer"]
    return {"data_source": DATA_SOURCE, "prompt": _prompt(problem),
            "completion": [assistant(answer)], "extra_info": info}


def pref_row(problem: Problem, rng: random.Random, cfg: ArithConfig) -> dict[str, Any]:
    kind, rejected = wrong_answer(problem, rng, cfg.operations)
    info = _info(problem)
    return {"data_source": DATA_SOURCE, "prompt": _prompt(problem),
            "chosen": [assistant(info["answer"])], "rejected": [assistant(rejected)],
            "extra_info": {**info, "rejected_kind": kind}}


RowFn = Callable[[Problem, random.Random, ArithConfig], dict[str, Any]]


def build(ctx: Context) -> None:
    cfg, arith = ctx.cfg, ctx.cfg.arith
    check_config(arith)
    ctx.refuse_source_keys("arith.num_test")
    rng = random.Random(f"arith-questions:{cfg.seed}")
    test = generate(rng, arith, arith.num_test, set())
    # With disjoint_rl the RL prompts follow the SFT/preference questions in the same stream, so
    # the SFT and preference files are the same either way.
    rl_start = max(arith.num_sft, arith.num_pref) if arith.disjoint_rl else 0
    train = generate(rng, arith, max(rl_start + arith.num_train, arith.num_sft, arith.num_pref),
                     {p.question for p in test})
    outputs: list[tuple[str, str, RowFn, list[Problem]]] = [
        ("", "rl", rl_row, train[rl_start:rl_start + arith.num_train]),
        ("sft_", "sft", sft_row, train[:arith.num_sft]),
        ("pref_", "preference", pref_row, train[:arith.num_pref])]
    for prefix, kind, make, train_problems in outputs:
        if not train_problems:
            continue
        for split, problems in (("train", train_problems), ("test", test)):
            # One wrong-answer stream per file, so test rows do not shift when num_pref changes.
            wrong_rng = random.Random(f"arith-wrong:{cfg.seed}:{split}")
            rows: list[Record] = []
            for i, problem in enumerate(ctx.track(problems, f"arith {prefix}{split}")):
                ctx.emit(kind, f"arith {prefix}{split} #{i}", make(problem, wrong_rng, arith),
                         rows, split)
            ctx.write(f"{prefix}{split}.parquet", kind, split, rows)
