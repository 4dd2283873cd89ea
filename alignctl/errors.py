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


class RunFailed(Exception):
    """A run that cannot go on (a worker died, a loss became NaN): one line naming the role and
    the step, exit status 1. Not the user's input, but not a bug to show a traceback for either."""

    exit_code = 1
