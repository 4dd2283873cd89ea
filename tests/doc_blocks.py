"""Code blocks of the user docs, so that tests run the examples exactly as a page shows them."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_file_block(page: str, file_name: str) -> str:
    """The ```python block of ``docs/<page>`` whose first line is ``# <file_name>``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    start = f"```python\n# {file_name}\n"
    assert text.count(start) == 1, f"docs/{page} shows {file_name} {text.count(start)} times"
    return text.split(start, 1)[1].split("```", 1)[0]
