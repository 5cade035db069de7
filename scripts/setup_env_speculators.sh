#!/usr/bin/env bash
# Creates the venv the doctor's export test loads heads with: vLLM's `speculators` package, kept out of the main venv
# (it needs numpy>=2 and transformers<=5.19, the main venv pins numpy<2 for tritonserver's python backend).
# torch is taken from the main venv (a .pth line) instead of PyPI's CUDA build; the test skips when this venv is absent.
#   usage: scripts/setup_env_speculators.sh [VENV_DIR] [MAIN_VENV]   (defaults .venv-speculators, .venv)
set -euo pipefail
VENV=${1:-.venv-speculators}
cd "$(dirname "$0")/.."
MAIN=${2:-.venv}
PY=$("$MAIN/bin/python" -c 'import sys; print(sys.executable)')
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import speculators" 2>/dev/null; then
  echo "speculators venv ready: $VENV"; exit 0
fi
"$PY" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
PIP=("$VENV/bin/pip" --disable-pip-version-check -q)
# pip runs before the main venv is linked in (below): it would otherwise check the main venv's packages too (numpy<2
# pins, the data packages installed without their dependencies) and print every gap as a resolver ERROR.
# The dependencies speculators 0.9.0 uses here first, then speculators itself with --no-deps and last: its
# torchvision / torchaudio requirements are not needed (torch comes from the main venv), and installing it last means
# pip never re-checks it against them.
"${PIP[@]}" install aiohttp click "datasets>=4.0.0,<=5.1.0" httpx huggingface-hub "loguru>=0.7.2,<=0.7.3" \
  "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil "pydantic>=2" pydantic-settings rich safetensors \
  "tqdm>=4.66.3,<=4.70.1" "transformers>=5.0.0,<=5.19.0" "typer>=0.12.0" "hs-connectors==0.9.0"
"${PIP[@]}" install --no-deps "speculators==0.9.0"
"$MAIN/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/zz_main_venv_torch.pth"
"$VENV/bin/python" -c 'from speculators.models import Eagle3DraftModel; print("speculators ready")'
