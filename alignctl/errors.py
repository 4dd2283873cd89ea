"""User-facing errors.

A ``UserError`` is a mistake in the user's input (a file, a row, a config key). The CLI prints its
message as one line and exits with status 2, without a traceback. Everything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: the message must name the culprit (file, row, key) and say what
    was expected, on one line."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # Collapse newlines so the CLI contract "one line" holds even for wrapped messages.
        super().__init__(" ".join(message.split("\n")))
