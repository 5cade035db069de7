#!/usr/bin/env bash
# genai-perf against the llmapi repository on the CPU Triton server, end to end:
#   1. a separate venv (.venv-genai) with genai-perf and perf_analyzer (never the project venv: genai-perf pulls
#      numpy 2, which corrupts Triton tensors there);
#   2. builds configs/smollm2-eagle3-current.yaml into OUT (default build/genai-perf);
#   3. starts the server (triton_repo/launch.py) on free loopback ports;
#   4. runs the exact command `python -m clients.genai_perf` prints, then checks the output tokens genai-perf
#      counted against the tokens the server generated (scripts/genai_perf_check.py).
# Usage: scripts/genai_perf_run.sh [OUT]
#   env: REQUESTS (8) CONCURRENCY (1) MAX_TOKENS (16) PY (python3) GENAI_VENV (.venv-genai)
#
# perf_analyzer comes from the tritonclient wheel (its manylinux wheels ship bin/perf_analyzer up to 2.60; 2.61+ and
# the PyPI `perf-analyzer` placeholder ship none). 2.52+ binaries need glibc 2.38; 2.51.0 runs on glibc 2.36 but links
# libb64.so.0d and libcudart.so.12, which we take from wheels: the nvidia-pytriton wheel's bundled libb64 (project
# venv) and nvidia-cuda-runtime-cu12 (loaded only, no GPU used).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-build/genai-perf}")
REQUESTS=${REQUESTS:-8}
CONCURRENCY=${CONCURRENCY:-1}
MAX_TOKENS=${MAX_TOKENS:-16}
PY=${PY:-python3}
GVENV=$(realpath -m "${GENAI_VENV:-.venv-genai}")
PA_LIBS=$GVENV/perf-analyzer-libs
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

[ -x .venv/bin/python ] || { echo "error: no project venv (.venv): run 'make setup' first" >&2; exit 2; }
if [ ! -f "$GVENV/.ready" ]; then
  echo "== preparing $GVENV (genai-perf 0.0.16, tritonclient 2.51.0's perf_analyzer)"
  [ -x "$GVENV/bin/python" ] || "$PY" -m venv "$GVENV"
  "$GVENV/bin/python" -m pip --disable-pip-version-check -q install genai-perf==0.0.16 nvidia-cuda-runtime-cu12==12.9.79
  # only for its bin/perf_analyzer: its own pins (numpy<2) would break genai-perf's pandas
  "$GVENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps tritonclient==2.51.0
  mkdir -p "$PA_LIBS"
  cp -L "$(ls .venv/lib/python3*/site-packages/nvidia_pytriton.libs/libb64-*.so.0d | head -1)" "$PA_LIBS/libb64.so.0d"
  cp -L "$GVENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 "$PA_LIBS/"
  touch "$GVENV/.ready"
fi
GENAI_ENV=(env "PATH=$GVENV/bin:$PATH" "LD_LIBRARY_PATH=$PA_LIBS")
"${GENAI_ENV[@]}" perf_analyzer --version

echo "== building configs/smollm2-eagle3-current.yaml into $OUT/build"
.venv/bin/python builders/build.py configs/smollm2-eagle3-current.yaml --set "output_dir=$OUT/build" \
  --set engine.device=cpu --set engine.max_seq_len=256 --set engine.max_input_len=128
REPO_DIR=$OUT/build/triton_repo

read -r GRPC HTTP METRICS < <(.venv/bin/python -c \
  "from triton_repo.launch import free_port as f; print(f(), f(), f())")
echo "== starting tritonserver (http 127.0.0.1:$HTTP)"
.venv/bin/python triton_repo/launch.py --repo "$REPO_DIR" --grpc-port "$GRPC" --http-port "$HTTP" \
  --metrics-port "$METRICS" --log "$OUT/tritonserver.log" > "$OUT/launch.out" 2>&1 &
LAUNCH=$!
trap 'kill -TERM $LAUNCH 2>/dev/null; wait $LAUNCH 2>/dev/null || true' EXIT
until grep -q "tritonserver ready" "$OUT/launch.out"; do
  kill -0 $LAUNCH 2>/dev/null || { cat "$OUT/launch.out" >&2; exit 1; }
  sleep 1
done

read -r -a ARGV < <(.venv/bin/python -m clients.genai_perf --repo "$REPO_DIR" --http-url "127.0.0.1:$HTTP" \
  --max-tokens "$MAX_TOKENS" --concurrency "$CONCURRENCY" --requests "$REQUESTS")
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ${ARGV[*]} --artifact-dir $OUT/artifacts"
rm -rf "$OUT/artifacts"
"${GENAI_ENV[@]}" "${ARGV[@]}" --artifact-dir "$OUT/artifacts"
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python scripts/genai_perf_check.py "$OUT/artifacts" --repo "$REPO_DIR" \
  --max-tokens "$MAX_TOKENS"
