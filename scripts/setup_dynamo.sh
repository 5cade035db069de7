#!/usr/bin/env bash
# Creates the venv NVIDIA Dynamo runs from (frontend, router, and the reference-engine worker): ai-dynamo 1.6.1.
# Kept out of the main venv: Dynamo's runtime pins pydantic<=2.13.5, the main venv has a newer one.
# `pip install ai-dynamo==1.6.1` does not install from PyPI alone: its dependency aisimulate==0.13.0 is a placeholder
# package (and the [trtllm] extra's tensorrt-llm pin too). So the runtime and ai-dynamo's other dependencies are
# installed first, then ai-dynamo itself with --no-deps. torch, numpy, transformers and our own packages come from the
# main venv through a .pth line appended after this venv's own site-packages (this venv's pins win).
#   usage: scripts/setup_dynamo.sh [VENV_DIR] [MAIN_VENV]   (defaults .venv-dynamo, .venv)
set -euo pipefail
VENV=${1:-.venv-dynamo}
cd "$(dirname "$0")/.."
MAIN=${2:-.venv}
DYNAMO_VERSION=1.6.1
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import dynamo.frontend, dynamo.runtime, engines" 2>/dev/null; then
  echo "dynamo venv ready: $VENV"; exit 0
fi
PY=$("$MAIN/bin/python" -c 'import sys; print(sys.executable)')
"$PY" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip runs before the main venv is linked in (below), so it resolves this venv's packages alone.
"${PIP[@]}" install "ai-dynamo-runtime==$DYNAMO_VERSION" "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" \
  "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" \
  "zstandard>=0.23.0,<1.0" "typing-extensions>=4.10.0"
"${PIP[@]}" install --no-deps "ai-dynamo==$DYNAMO_VERSION"
"$MAIN/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/zz_main_venv.pth"
"$VENV/bin/python" -c "import dynamo.frontend, dynamo.runtime, engines, torch; print('dynamo venv ready: ai-dynamo $DYNAMO_VERSION, torch', torch.__version__)"
