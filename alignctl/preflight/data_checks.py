"""Data files: they exist, are parquet of the right kind, and hold what the chosen reward needs.

An RL run whose rows lack a ground truth, whose prompts are empty, or that was handed a
preference file scores every response the same and trains on nothing; these checks say so
before any worker starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alignctl.data.readers import parquet_columns, read_parquet
from alignctl.errors import UserError
from alignctl.preflight.context import Context

PREFERENCE_COLUMNS = ("chosen", "rejected")


def check_file(name: str, key: str, ctx: Context) -> Path | None:
    """The path is an existing file (None when an upstream stage will write it)."""
    if ctx.later(name):
        return None
    path = Path(name).expanduser()
    if not path.exists():
        raise UserError(f"{key} {name}: file not found")
    if not path.is_file():
        raise UserError(f"{key} {name}: is a folder; expected a file")
    return path


def refuse_preference_file(name: str, key: str, ctx: Context) -> None:
    """A preference file (chosen/rejected, no reward_model) where RL prompts are expected."""
    path = check_file(name, key, ctx)
    if path is None:
        return
    columns = parquet_columns(name, "RL prompt rows", key=key)
    if set(PREFERENCE_COLUMNS) <= set(columns) and "reward_model" not in columns:
        raise UserError(f"{key} {name}: a preference file (chosen/rejected columns) given as RL prompts; "
                        f"expected RL prompt rows (prompt, data_source, reward_model) from 'alignctl preprocess'")


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def _prompt_text(value: Any) -> str:
    """The text a prompt cell carries: a string, or the contents of its messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return str(value.get("content") or "")
    if isinstance(value, list):
        return "".join(_prompt_text(item) for item in value)
    return "" if value is None else str(value)


def _ground_truth(cell: Any) -> Any:
    return cell.get("ground_truth") if isinstance(cell, dict) else None


def check_rl_prompts(files: list[str], key: str, ctx: Context, *, prompt_key: str, default_scorer: bool) -> None:
    """RL prompt parquet (preprocess output): prompts present and non-empty; when the default rule
    scorer is used, every row has a ground truth and a data_source it knows."""
    for name in files:
        path = check_file(name, key, ctx)
        if path is None:
            continue
        refuse_preference_file(name, key, ctx)
        columns = parquet_columns(name, "RL prompt rows", key=key)
        wanted = [prompt_key, "data_source"] + (["reward_model"] if "reward_model" in columns else [])
        rows = read_parquet(name, "RL prompt rows from 'alignctl preprocess'", key=key, columns=wanted,
                            allow_empty=False).to_pylist()
        _check_rows(rows, name, prompt_key, default_scorer, "reward_model" in columns)


def _check_rows(rows: list[dict[str, Any]], name: str, prompt_key: str, default_scorer: bool,
                has_reward_column: bool) -> None:
    if default_scorer and not has_reward_column:
        raise UserError(f"{name}: no 'reward_model' column, so no ground truth: the rule reward would be 0 for "
                        f"every response; add reward_model.ground_truth, or set custom_reward_function.path or "
                        f"a reward model")
    sources: set[str] = set()
    for i, row in enumerate(rows):
        if not _is_messages(row.get(prompt_key)):
            raise UserError(f"{name} row {i}: column {prompt_key!r} holds {type(row.get(prompt_key)).__name__}; "
                            f"expected chat messages [{{role, content}}, ...] (as 'alignctl preprocess' writes)")
        if not _prompt_text(row.get(prompt_key)).strip():
            raise UserError(f"{name} row {i}: empty prompt in column {prompt_key!r}; expected prompt text")
        if default_scorer:
            truth = _ground_truth(row.get("reward_model"))
            if truth is None or not str(truth).strip():
                raise UserError(f"{name} row {i}: reward_model.ground_truth is missing, so the rule reward is 0 "
                                f"for every response; expected the reference answer (or set "
                                f"custom_reward_function.path)")
        sources.add(str(row.get("data_source")))
    if default_scorer:
        from alignctl.rewards.rule_scorers import scorer_name

        for source in sorted(sources):
            try:
                scorer_name(source)
            except UserError as exc:
                raise UserError(f"{name}: {exc}") from None


def check_columns(files: list[str], key: str, ctx: Context, needed: list[str], what: str) -> None:
    """Each parquet file has the ``needed`` top-level columns (``a.b`` needs column ``a``)."""
    for name in files:
        path = check_file(name, key, ctx)
        if path is None:
            continue
        # No column is read: the footer has the names and the row count.
        read_parquet(name, what, key=key, columns=[], required=needed, allow_empty=False)
