"""Reading a preference parquet for the audit: the pairs as text (for the checks) and as chat
messages (for tokenizers and reward models). Lenient by design: broken rows are read, not refused,
because reporting them is the audit's job. Its own module so that train-rm's quick audit
(:mod:`alignctl.audit.quick`) reads pairs without importing the full audit runner.
"""

from __future__ import annotations

from typing import Any

from alignctl.audit import checks

Messages = list[dict[str, str]]
PAIR_COLUMNS = ("prompt", "chosen", "rejected")


def _messages(value: Any, role: str) -> Messages:
    """Lenient: empty values become [] (the empty check reports them; nothing here refuses)."""
    from alignctl.data.rl_dataset import plain_python

    value = plain_python(value)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, str):
        return [{"role": role, "content": value}] if value.strip() else []
    if isinstance(value, list):
        return [{"role": str(m.get("role", role)), "content": str(m.get("content") or "")}
                for m in value if isinstance(m, dict)]
    return []


def _text(messages: Messages, *, last_only: bool) -> str:
    """The prompt as one text (every message, role-tagged) or a reply's final message."""
    if not any(m["content"].strip() for m in messages):
        return ""  # so that a prompt of blank messages counts as empty, not as "user:"
    if last_only:
        return messages[-1]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def read_frame(path: str, what: str, columns: tuple[str, ...], key: str | None = None) -> Any:
    """The parquet file as a DataFrame, refusing (one line) a missing file or a wrong kind of file."""
    from alignctl.data.readers import read_parquet, require_columns

    table = read_parquet(path, what, key=key, allow_empty=False)
    kind = " (it holds RL prompt rows; audit expects preference pairs, e.g. 'alignctl preprocess hh-rlhf' output)" \
        if "reward_model" in table.column_names else ""
    require_columns(f"{key} {path}" if key else path, table.column_names, columns,
                    f"{' / '.join(columns)}{kind}")
    return table.to_pandas()


def read_pairs(path: str) -> tuple[list[checks.PairText], list[tuple[Messages, Messages, Messages]]]:
    frame = read_frame(path, "preference pairs", PAIR_COLUMNS)
    texts, convs = [], []
    for record in frame[list(PAIR_COLUMNS)].to_dict(orient="records"):
        prompt = _messages(record["prompt"], "user")
        chosen, rejected = _messages(record["chosen"], "assistant"), _messages(record["rejected"], "assistant")
        texts.append(checks.PairText(_text(prompt, last_only=False), _text(chosen, last_only=True),
                                     _text(rejected, last_only=True)))
        convs.append((prompt, chosen[-1:], rejected[-1:]))
    return texts, convs


def read_test_prompts(path: str) -> list[str]:
    frame = read_frame(path, "test prompts", ("prompt",), key="--test")
    return [_text(_messages(v, "user"), last_only=False) for v in frame["prompt"]]


def read_group_labels(path: str, key: str) -> list[str]:
    """The ``--group-key`` value of every row as text: a column, or ``column.key`` inside a dict
    column (train-rm's ``data.group_key`` rule). A missing column or key is refused naming the row."""
    from alignctl.data.rl_dataset import plain_python
    from alignctl.errors import UserError
    from alignctl.trainers.sft_data import group_label

    column = key.partition(".")[0]
    frame = read_frame(path, "preference pairs", PAIR_COLUMNS)
    if column not in frame.columns:
        raise UserError(f"{path}: --group-key {key!r}: no column {column!r} (found: {', '.join(frame.columns)})")
    return [group_label({column: plain_python(value)}, key, f"{path} row {i}", "--group-key")
            for i, value in enumerate(frame[column])]
