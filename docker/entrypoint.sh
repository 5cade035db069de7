#!/usr/bin/env bash
# eagle-deploy container entrypoint (also runs outside Docker: tests/test_docker.py does exactly that).
#
#   build CONFIG [build.py options...]     one YAML -> checkpoint -> engine -> Triton model repository
#   serve BUILD_DIR                        start Triton on BUILD_DIR's model repository (mpirun form when the
#                                          TensorRT engine has tp*pp > 1 ranks), stop cleanly on SIGTERM
#   loadtest URL [loadtest.py options...]  gRPC load test against URL (host:port), e.g. --prompts F --out D
#   help                                   this text
#
# Environment (defaults in brackets):
#   EAGLE_DEPLOY_HOME    project root [the directory above this script]
#   EAGLE_DEPLOY_PYTHON  interpreter [python3]
#   TRITON_HOST          address Triton binds [0.0.0.0: reachable from outside the container]
#   TRITON_HTTP_PORT / TRITON_GRPC_PORT / TRITON_METRICS_PORT  [8000 / 8001 / 8002]
#   TRITON_LOG           server log [/dev/stdout, so `docker logs` / `kubectl logs` show it]
#   TRITON_READY_TIMEOUT seconds to wait for every model to load [1800: large engines load slowly]
#   TRITON_ADMIN_KEY     key for Triton's admin endpoints (model repository, logging, trace, shared memory) [unset: closed]
#   TRITON_MODEL_CONTROL none or explicit: load published head versions on request (docs/adaptive.md) [none]
#
# Inputs:  a build config (build), a finished build directory (serve), a served deployment (loadtest)
# Outputs: the build under the config's output_dir (build), a running Triton server (serve), the load-test
#          report and plots in --out (loadtest)
# Guide:   docs/deploy.md
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${EAGLE_DEPLOY_HOME:-$(dirname "$script_dir")}
py=${EAGLE_DEPLOY_PYTHON:-python3}
export PYTHONPATH="$home${PYTHONPATH:+:$PYTHONPATH}"  # the project at $home is the one that runs
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # nothing is downloaded at run time

usage() { awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }  # the header

die() { echo "entrypoint: $*" >&2; exit 2; }

cmd=${1:-help}
if [ $# -gt 0 ]; then shift; fi
case "$cmd" in
  build)
    [ $# -ge 1 ] || die "build needs a config: build CONFIG [--set key=value ...]"
    exec "$py" "$home/builders/build.py" "$@"
    ;;
  serve)
    [ $# -eq 1 ] || die "serve needs exactly one argument, the build directory: serve BUILD_DIR"
    # docker/serve.py checks the build (config, model repository, TensorRT-LLM version) and execs launch.py,
    # so SIGTERM from `docker stop` / Kubernetes reaches the launcher, which stops tritonserver cleanly.
    exec "$py" "$home/docker/serve.py" "$1" \
      --host "${TRITON_HOST:-0.0.0.0}" \
      --http-port "${TRITON_HTTP_PORT:-8000}" \
      --grpc-port "${TRITON_GRPC_PORT:-8001}" \
      --metrics-port "${TRITON_METRICS_PORT:-8002}" \
      --log "${TRITON_LOG:-/dev/stdout}" \
      --timeout "${TRITON_READY_TIMEOUT:-1800}" \
      --model-control "${TRITON_MODEL_CONTROL:-none}"
    ;;
  loadtest)
    [ $# -ge 1 ] || die "loadtest needs the server's gRPC address: loadtest HOST:PORT --prompts FILE --out DIR ..."
    url=$1
    shift
    exec "$py" "$home/clients/loadtest.py" --url "$url" "$@"
    ;;
  help | -h | --help)
    usage
    ;;
  *)
    usage >&2
    die "unknown command '$cmd' (expected build, serve, loadtest or help)"
    ;;
esac
