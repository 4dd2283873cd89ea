"""The parquet row schemas every preprocessor writes (verl-compatible), and their validator.

Three kinds of rows, one per training stage that reads them:

- ``rl``: a prompt to roll out, with what the reward function needs (verl's RLHFDataset):
  ``data_source``, ``prompt`` (chat messages), ``ability``,
  ``reward_model`` = {style: "rule" | "model", ground_truth: str}, ``extra_info``.
- ``preference``: a prompt and two candidate final replies (reward-model training):
  ``prompt``, ``chosen`` and ``rejected`` (each a one-element list [{role: assistant, content}]),
  ``data_source``, ``extra_info``. The two replies must differ (after stripping whitespace): an
  identical pair carries no preference and only dilutes the loss.
- ``sft``: TRL's conversational prompt-completion format:
  ``prompt``, ``completion`` ([{role: assistant, content}]), ``data_source``, ``extra_info``.
  A completion may instead be a tool-use trace: assistant turns that call tools
  (``<tool_call>{...}</tool_call>``), a ``tool`` message answering each call, and a final
  assistant answer (see ``alignctl.tools.traces``).

``extra_info`` is a dict holding at least ``split`` (str) and ``index`` (int). A prompt always
ends with a user message: that is where generation (or the scored reply) starts. Messages carry
exactly the keys ``role`` and ``content`` so the parquet struct type is the same for every row.
Extra top-level columns are allowed (a custom ``map_fn`` may carry more).
"""

from __future__ import annotations

from typing import Any

from alignctl.errors import UserError

ROLES = ("system", "user", "assistant")
REWARD_STYLES = ("rule", "model")
KINDS = ("rl", "preference", "sft")

Message = dict[str, str]


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


class SchemaError(ValueError):
    """One schema violation: ``field`` is the dotted path of the offending value; ``reason`` is
    the key it is counted under when bad rows are skipped."""

    def __init__(self, field: str, expected: str, got: Any, reason: str = "invalid_row") -> None:
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"field {field!r} expected {expected}, got {shown}")
        self.field = field
        self.reason = reason


def _require(row: dict[str, Any], key: str) -> Any:
    if key not in row:
        raise SchemaError(key, "to be present", "nothing")
    return row[key]


def _check_str(value: Any, field: str, *, nonempty: bool = True) -> None:
    if not isinstance(value, str):
        raise SchemaError(field, "a string", value)
    if nonempty and not value.strip():
        raise SchemaError(field, "a non-empty string", value)


def _check_messages(value: Any, field: str, roles: tuple[str, ...] = ROLES) -> None:
    if not isinstance(value, list) or not value:
        raise SchemaError(field, "a non-empty list of {role, content} messages", value)
    for i, msg in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(msg, dict):
            raise SchemaError(where, "a {role, content} dict", msg)
        extra = sorted(set(msg) - {"role", "content"})
        if extra:
            raise SchemaError(f"{where}.{extra[0]}", "no such key (messages hold only role, content)",
                              msg[extra[0]])
        role = _require_msg(msg, "role", where)
        if role not in roles:
            raise SchemaError(f"{where}.role", "one of " + "/".join(roles), role)
        _check_str(_require_msg(msg, "content", where), f"{where}.content")


def _require_msg(msg: dict[str, Any], key: str, where: str) -> Any:
    if key not in msg:
        raise SchemaError(f"{where}.{key}", "to be present", "nothing")
    return msg[key]


def _check_prompt(row: dict[str, Any]) -> None:
    prompt = _require(row, "prompt")
    _check_messages(prompt, "prompt")
    if prompt[-1]["role"] != "user":
        raise SchemaError(f"prompt[{len(prompt) - 1}].role", "'user' (a prompt ends with a user turn)",
                          prompt[-1]["role"])


def _check_reply(row: dict[str, Any], key: str) -> None:
    """``chosen`` / ``rejected`` / ``completion``: the one final assistant reply."""
    value = _require(row, key)
    _check_messages(value, key)
    if len(value) != 1:
        raise SchemaError(key, "a one-element list [{role: assistant, content}]", value)
    if value[0]["role"] != "assistant":
        raise SchemaError(f"{key}[0].role", "'assistant'", value[0]["role"])


def _check_completion(row: dict[str, Any]) -> None:
    """An SFT completion: the one final reply, or a tool-use trace."""
    from alignctl.tools.traces import TraceError, check_trace, is_tool_trace

    value = _require(row, "completion")
    if not is_tool_trace(value):
        _check_reply(row, "completion")
        return
    _check_messages(value, "completion", ("assistant", "tool"))
    try:
        check_trace(value)
    except TraceError as exc:
        raise SchemaError("completion", f"a tool-use trace ({exc})", value) from None


def reply_text(value: Any) -> str | None:
    """The text of a final reply, whitespace stripped: a string, one ``{role, content}`` message,
    or the last message of a list (the turn being preferred); None for any other shape."""
    if isinstance(value, dict):
        value = value.get("content")
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        last = value[-1] if len(value) else None
        value = last.get("content") if isinstance(last, dict) else None
    return value.strip() if isinstance(value, str) else None


def identical_pair(chosen: Any, rejected: Any) -> bool:
    """True when both replies have the same final text (after stripping whitespace): such a pair
    has no preference in it, the Bradley-Terry loss is a constant log 2 with zero gradient."""
    text = reply_text(chosen)
    return text is not None and text == reply_text(rejected)


IDENTICAL_PAIR = "identical_pair"  # the reason identical pairs are counted under


def _check_distinct_replies(row: dict[str, Any]) -> None:
    if identical_pair(row["chosen"], row["rejected"]):
        raise SchemaError("rejected", "a reply different from 'chosen' (identical after stripping whitespace)",
                          reply_text(row["rejected"]), reason=IDENTICAL_PAIR)


def _check_extra_info(row: dict[str, Any]) -> None:
    info = _require(row, "extra_info")
    if not isinstance(info, dict):
        raise SchemaError("extra_info", "a dict", info)
    _check_str(_require_msg(info, "split", "extra_info"), "extra_info.split")
    index = _require_msg(info, "index", "extra_info")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise SchemaError("extra_info.index", "a non-negative integer", index)


def _check_reward_model(row: dict[str, Any]) -> None:
    reward = _require(row, "reward_model")
    if not isinstance(reward, dict):
        raise SchemaError("reward_model", "a dict {style, ground_truth}", reward)
    style = _require_msg(reward, "style", "reward_model")
    if style not in REWARD_STYLES:
        raise SchemaError("reward_model.style", "one of " + "/".join(REWARD_STYLES), style)
    # A model-scored prompt may have no reference answer, but the column stays a string.
    _check_str(_require_msg(reward, "ground_truth", "reward_model"), "reward_model.ground_truth",
               nonempty=style == "rule")


def check_row(kind: str, row: Any) -> None:
    """Raise :class:`SchemaError` on the first violation of schema ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown row kind {kind!r}; expected one of {KINDS}")
    if not isinstance(row, dict):
        raise SchemaError("row", "a dict of columns", row)
    _check_str(_require(row, "data_source"), "data_source")
    _check_prompt(row)
    if kind == "rl":
        _check_str(_require(row, "ability"), "ability")
        _check_reward_model(row)
    elif kind == "preference":
        _check_reply(row, "chosen")
        _check_reply(row, "rejected")
        _check_distinct_replies(row)
    else:
        _check_completion(row)
    _check_extra_info(row)


def validate_row(kind: str, row: Any, where: str) -> None:
    """Check ``row`` against schema ``kind``; a violation raises UserError naming ``where``
    (e.g. the input file and line the row came from) and the field."""
    try:
        check_row(kind, row)
    except SchemaError as exc:
        raise UserError(f"{where}: invalid {kind} row: {exc}") from None
