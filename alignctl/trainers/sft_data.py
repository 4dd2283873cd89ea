"""Rows of user data -> TRL's prompt-completion format (conversational or plain text).

Accepted inputs, per row: the prompt is chat messages or a string; the response is
``[{role: assistant, content}]``, a single message dict, a string, or a tool-use trace (assistant
calls, tool messages, final answer). A split holding any trace is tokenized here, each row exactly
as a multi-turn rollout holds it (``alignctl.tools.traces``), and reaches TRL as ``input_ids`` +
``completion_mask``. A key ``col.field`` reads a
field of a dict column (verl's GSM8K RL parquet keeps the worked solution in
``extra_info.answer``). Strings become chat messages when the chat template is to be applied, so
the tokenizer's template renders every row the same way it will render prompts at RL time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alignctl.errors import UserError

if TYPE_CHECKING:
    import datasets


def lookup_field(row: dict[str, Any], key: str) -> Any:
    """``row[key]`` where ``key`` is a column or ``column.key`` (a key of a dict column, such as
    ``extra_info.answer``); ``KeyError(key)`` when absent. Shared with the reward-model data."""
    column, _, sub = key.partition(".")
    value = row[column]
    if sub:
        if not isinstance(value, dict) or sub not in value:
            raise KeyError(key)
        value = value[sub]
    return value


def group_label(row: dict[str, Any], key: str, where: str, option: str) -> str:
    """``row``'s value of a group key (``column`` or ``column.key``) as text, for per-group accuracy
    tables (train-rm's ``data.group_key``, audit's ``--group-key``). A dict column without the key,
    or a null, is an error naming ``where`` (the file and row) and ``option``."""
    column, _, sub = key.partition(".")
    try:
        value = lookup_field(row, key)
    except KeyError:
        raise UserError(f"{where}: {option} {key!r}: expected a dict in column {column!r} "
                        f"with key {sub!r}, got {row[column]!r}"[:300]) from None
    if value is None:
        raise UserError(f"{where}: {option} {key!r}: expected a value, got null")
    return str(value)


def as_messages(value: Any, role: str, chat: bool, where: str) -> list[dict[str, str]] | str:
    """One prompt/response value -> a list of {role, content} (chat) or a plain string."""
    if isinstance(value, dict) and "content" in value:
        value = [value]
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: empty text; expected a non-empty string or chat messages")
        return [{"role": role, "content": value}] if chat else value
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        try:
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
        except KeyError as exc:
            raise UserError(f"{where}: message without {exc.args[0]!r}; expected {{role, content}}") from None
    raise UserError(f"{where}: expected a string or a non-empty list of {{role, content}} messages, "
                    f"got {type(value).__name__}")


def to_prompt_completion(ds: datasets.Dataset, prompt_key: str, response_key: str, *, chat: bool,
                         where: str) -> datasets.Dataset:
    """A Dataset with exactly ``prompt`` and ``completion`` columns, in one format for all rows.

    ``where`` names the source (file names) in errors, with the row index appended."""
    import datasets

    for key in (prompt_key, response_key):
        column = key.partition(".")[0]
        if column not in ds.column_names:
            raise UserError(f"{where}: missing column {column!r} (data.{'prompt' if key == prompt_key else 'response'}"
                            f"_key={key!r}); found: {', '.join(ds.column_names)}")
    prompts, completions = [], []
    for i, row in enumerate(ds.select_columns(sorted({k.partition('.')[0] for k in (prompt_key, response_key)}))):
        try:
            prompt, response = lookup_field(row, prompt_key), lookup_field(row, response_key)
        except KeyError as exc:
            raise UserError(f"{where} row {i}: no field {exc.args[0]!r}") from None
        prompt = as_messages(prompt, "user", chat, f"{where} row {i} {prompt_key!r}")
        response = as_messages(response, "assistant", chat, f"{where} row {i} {response_key!r}")
        if isinstance(prompt, str) != isinstance(response, str):
            raise UserError(f"{where} row {i}: prompt and response must both be chat messages or both strings "
                            f"(set data.apply_chat_template=true to convert strings)")
        prompts.append(prompt)
        completions.append(response)
    return datasets.Dataset.from_dict({"prompt": prompts, "completion": completions})


def has_tool_traces(ds: datasets.Dataset, response_key: str) -> bool:
    from alignctl.tools.traces import is_tool_trace

    column = response_key.partition(".")[0]
    if column not in ds.column_names:
        return False
    return any(is_tool_trace(lookup_field(row, response_key)) for row in ds.select_columns([column]))


def to_trace_ids(ds: datasets.Dataset, prompt_key: str, response_key: str, tokenizer: Any,
                 schemas: list[dict[str, Any]], *, where: str) -> datasets.Dataset:
    """Rows -> ``input_ids`` and ``completion_mask`` (1 on the tokens the model writes: its turns and
    their stop tokens; 0 on the prompt and on inserted tool turns)."""
    import datasets

    from alignctl.tools.chat import ToolTurns
    from alignctl.tools.traces import TraceError, trace_ids

    stop = tokenizer.eos_token_id
    if stop is None:
        raise UserError(f"{where}: tool-use traces need a tokenizer with an EOS token (it ends each model turn)")
    try:
        turns = ToolTurns(tokenizer, (int(stop),))
    except ValueError as exc:
        raise UserError(f"{where}: tool-use traces: {exc}") from None
    ids, masks = [], []
    columns = sorted({k.partition(".")[0] for k in (prompt_key, response_key)})
    for i, row in enumerate(ds.select_columns(columns)):
        try:
            prompt, response = lookup_field(row, prompt_key), lookup_field(row, response_key)
        except KeyError as exc:
            raise UserError(f"{where} row {i}: no field {exc.args[0]!r}") from None
        prompt = as_messages(prompt, "user", True, f"{where} row {i} {prompt_key!r}")
        if isinstance(response, (dict, str)):
            response = as_messages(response, "assistant", True, f"{where} row {i} {response_key!r}")
        try:
            trace = trace_ids(tokenizer, list(prompt), [dict(m) for m in response], schemas, int(stop), turns)
        except (TraceError, KeyError, TypeError) as exc:
            raise UserError(f"{where} row {i} {response_key!r}: not a tool-use trace: {exc}") from None
        ids.append(trace.prompt + trace.response)
        masks.append([0] * len(trace.prompt) + trace.loss_mask)
    return datasets.Dataset.from_dict({"input_ids": ids, "completion_mask": masks})
