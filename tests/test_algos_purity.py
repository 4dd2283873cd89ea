"""alignctl.algos stays pure math: light imports, torch + stdlib only, no device syncs, no dist."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import alignctl.algos

ALGOS_DIR = Path(alignctl.algos.__file__).parent
HEAVY = ("ray", "vllm", "deepspeed", "transformers")


def test_importing_algos_loads_no_heavy_framework() -> None:
    # A fresh interpreter: this test process may already have imported them for other tests.
    code = (
        "import sys, json, alignctl.algos; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: use absolute imports"
            modules.add(node.module or "")
    return modules


def test_algos_imports_only_torch_stdlib_and_itself() -> None:
    """Besides itself, algos may import alignctl.registries: the Registry class, a stdlib-only leaf
    (checked here too) that the torch-free packages (rewards, tools) share."""
    files = sorted(ALGOS_DIR.glob("*.py"))
    assert len(files) >= 9
    for path in files:
        for module in _imported_modules(path):
            root = module.split(".")[0]
            allowed = (root in sys.stdlib_module_names or root == "torch" or module.startswith("alignctl.algos")
                       or module == "alignctl.registries")
            assert allowed, f"{path.name} imports {module}"
    leaf = ALGOS_DIR.parent / "registries.py"
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in _imported_modules(leaf))


def test_algos_source_has_no_item_calls_or_distributed() -> None:
    for path in sorted(ALGOS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                where = f"{path.name}:{node.lineno}"
                assert node.attr not in ("item", "tolist", "distributed"), f"{where} uses .{node.attr}"
