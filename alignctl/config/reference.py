"""The config reference (docs/config.md), generated from the typed schemas so it cannot drift:
a test regenerates it and compares."""

from __future__ import annotations

from alignctl.config import STAGE_SCHEMAS, iter_keys, stage_schema

# Stages sharing one schema are documented once.
_ALIASES = {"grpo": "ppo"}


def _format_default(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text.replace("|", "\\|")


def render_reference() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the typed schemas by `alignctl config reference` (do not edit by hand).",
             "Every key can be set in a YAML file (`--config FILE`) or on the command line as",
             "`key.sub=value`; an unknown key or a value of the wrong type is an error naming the key.", ""]
    for stage in STAGE_SCHEMAS:
        if stage in _ALIASES:
            continue
        schema = stage_schema(stage)
        also = [a for a, target in _ALIASES.items() if target == stage]
        title = f"`{stage}`" + (f" (also `{'`, `'.join(also)}`)" if also else "")
        lines += [f"## {title}", "", (schema.__doc__ or "").strip().splitlines()[0] if schema.__doc__ else "", "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        for key, type_name, default, help_text in iter_keys(schema):
            type_cell = type_name.replace("|", "\\|")
            lines.append(f"| `{key}` | {type_cell} | `{_format_default(default)}` | {help_text} |")
        lines.append("")
    return "\n".join(lines)
