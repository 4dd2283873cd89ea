"""A YAML mapping whose key is a list or a mapping (``? [a]``) is a one-line config error naming
the file and line, like every other bad YAML, not a TypeError traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from alignctl.config.core import read_yaml_mapping
from alignctl.errors import UserError


@pytest.mark.parametrize(("text", "where", "kind"), [
    ("? [a]\n: 1\n", "line 1, column 3", "list"),
    ("trainer:\n  ? {a: 1}\n  : 1\n", "line 2, column 5", "dict"),
])
def test_an_unhashable_key_is_a_one_line_error(tmp_path, text, where, kind):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        read_yaml_mapping(path)
    assert str(info.value) == f"{path}: {where} invalid YAML: a mapping key must be a name, got a {kind}"


def test_the_cli_exits_2_without_a_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("? [a]\n: 1\n")
    done = subprocess.run([sys.executable, "-m", "alignctl", "sft", "--config", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert "a mapping key must be a name, got a list" in done.stderr + done.stdout
