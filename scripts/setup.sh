#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh machine that has only Python >= 3.11:
# a virtual environment in .venv with torch first, then alignctl and its dev extra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch goes first and pinned: this machine carries a local CPU wheel of 2.13.0, while an open range
# would pull the newest CUDA build (several GB). On a GPU machine, install the torch you need first.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "alignctl set up in .venv ($(.venv/bin/alignctl --version))"
