"""Tools a policy can call during a multi-turn rollout (OpenAI function schema), and the parser
of the calls it writes. ``TOOLS`` is the registry the config names them from; built-ins:
``calculator`` (an AST allow-list evaluator) and ``python`` (a subprocess in a bubblewrap sandbox,
off unless enabled). Import is light: no torch, no subprocesses until a tool runs."""

from __future__ import annotations

from alignctl.tools import calculator as _calculator  # noqa: F401  (registers "calculator")
from alignctl.tools import python_sandbox as _python_sandbox  # noqa: F401  (registers "python")
from alignctl.tools.tool import TOOLS, Tool, ToolResult, register_tool, run_tool, tool_schemas
from alignctl.tools.parsing import ToolCall, parse_tool_calls

__all__ = ["TOOLS", "Tool", "ToolCall", "ToolResult", "parse_tool_calls", "register_tool", "run_tool",
           "tool_schemas"]
