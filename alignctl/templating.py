"""The jinja2 environment every report renders with (eval, audit), and its number filters.

Templates are files shipped inside the package, in ``alignctl/resources/templates/``, loaded
through the import system so an installed wheel finds them wherever it lives. An HTML environment
autoescapes everything: model responses and dataset text (which may hold ``<script>`` or any
markup) show as text. A leaf module: reports in any layer may import it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

TEMPLATE_PACKAGE = "alignctl"
TEMPLATE_FOLDER = "resources/templates"  # inside the package; pyproject.toml ships it as package data


def _template_loader() -> Any:
    import jinja2

    try:
        return jinja2.PackageLoader(TEMPLATE_PACKAGE, TEMPLATE_FOLDER)
    except ValueError as exc:  # the folder is missing: a broken install, not a user mistake
        raise FileNotFoundError(f"report templates not found in the installed alignctl package "
                                f"({TEMPLATE_PACKAGE}/{TEMPLATE_FOLDER}): {exc}; reinstall alignctl") from None


def fmt(value: Any, digits: int = 3) -> str:
    """Numbers for people: None -> an em dash, floats rounded, ints as ints."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer() and abs(value) > 100):
        return f"{int(value):,}"
    return f"{float(value):.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}%"


def md_fence(text: str) -> str:
    """A fenced block that no run of backticks inside ``text`` can close early."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def template_environment(html: bool) -> Any:
    """A strict environment (an undefined name is an error) with the ``fmt``, ``pct`` and
    ``md_fence`` filters; ``html`` turns autoescaping on."""
    import jinja2

    env = jinja2.Environment(loader=_template_loader(), autoescape=html,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, pct=pct, md_fence=md_fence)
    return env
