"""The tool interface: an OpenAI-style function schema, a callable, and a per-call timeout.

A tool is ``fn(**arguments) -> str``. Its ``parameters`` are a JSON schema of an object
(``{"type": "object", "properties": {...}, "required": [...]}``) and are checked before the call,
so a tool sees only arguments of the declared types. Whatever goes wrong (bad arguments, an
exception, a timeout) becomes the text of the tool message, never an exception in the rollout:
the policy reads the error and can try again, and the metrics count it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from alignctl.registries import Registry

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]
    timeout_s: float = 5.0
    # keyword arguments the tool takes from the run's config, never from the model (the schema's
    # properties are all the model may pass), e.g. the python tool's ``isolation``
    settings: tuple[str, ...] = ()

    def configured(self, values: Mapping[str, Any]) -> Tool:
        """This tool with the config ``values`` it declares in ``settings`` bound to its function."""
        bound = {name: values[name] for name in self.settings if name in values}
        return dataclasses.replace(self, fn=functools.partial(self.fn, **bound)) if bound else self

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form that chat templates render (``tools=[...]``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def check_arguments(self, arguments: Any) -> str | None:
        """Why ``arguments`` do not match the schema, or None."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"missing argument(s) {', '.join(missing)}"
        for key, value in arguments.items():
            if key not in props:
                return f"unknown argument {key!r}; expected {', '.join(props) or 'none'}"
            wanted = props[key].get("type")
            types = JSON_TYPES.get(wanted, (object,))
            # JSON has no separate bool: true must not pass as a number, nor 1.5 as an integer.
            if not isinstance(value, types) or (isinstance(value, bool) and wanted != "boolean"):
                return f"argument {key!r} must be a {wanted}, got {type(value).__name__}"
        return None


@dataclass
class ToolResult:
    name: str
    content: str
    ok: bool
    seconds: float
    error: str = ""  # "bad_arguments", "unknown_tool", "timeout", "exception" when not ok
    details: dict[str, Any] = field(default_factory=dict)


TOOLS: Registry[Any] = Registry("tool")


def register_tool(name: str, description: str, parameters: dict[str, Any], *, timeout_s: float = 5.0,
                  settings: tuple[str, ...] = ()) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Decorator: ``@register_tool("calculator", "...", {...schema...})`` on ``fn(**args) -> str``;
    ``settings``: keyword arguments ``fn`` also takes from the config (Tool.settings)."""

    def decorator(fn: Callable[..., str]) -> Callable[..., str]:
        TOOLS.register(name)(Tool(name, description, parameters, fn, timeout_s, settings))
        return fn

    return decorator


def tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    return [TOOLS.get(name).schema() for name in names]


def run_tool(tool: Tool | None, name: str, arguments: Any, pool: concurrent.futures.Executor) -> ToolResult:
    """Call a tool under its timeout in ``pool``; every failure is a ToolResult, not an exception.
    A timed-out thread cannot be killed: tools that may hang run their work in a subprocess (the
    python tool does), so the thread returns when the subprocess is killed."""
    start = time.perf_counter()
    if tool is None:
        return ToolResult(name, f"error: unknown tool {name!r}", False, 0.0, "unknown_tool")
    problem = tool.check_arguments(arguments)
    if problem:
        return ToolResult(name, f"error: {problem}", False, 0.0, "bad_arguments")
    future = pool.submit(tool.fn, **arguments)
    try:
        content = str(future.result(timeout=tool.timeout_s))
    except concurrent.futures.TimeoutError:
        return ToolResult(name, f"error: {name} timed out after {tool.timeout_s:g} s", False,
                          time.perf_counter() - start, "timeout")
    except Exception as exc:  # noqa: BLE001 - a crashing tool is a message to the policy
        return ToolResult(name, f"error: {type(exc).__name__}: {exc}", False, time.perf_counter() - start, "exception")
    return ToolResult(name, content, True, time.perf_counter() - start)
