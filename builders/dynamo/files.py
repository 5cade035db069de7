"""The files of a build's NVIDIA Dynamo deployment (pure functions; builders/dynamo/stage.py writes them).

- The TensorRT-LLM worker's LLM API YAMLs (`python -m dynamo.trtllm --extra-engine-args FILE`): the build's own LLM
  API options (the engine stage's file, or the llmapi model's options computed the same way: one source), and for a
  disaggregated pair the cache transceiver upstream's EAGLE examples configure
  (examples/backends/trtllm/engine_configs/llama4/eagle/eagle_{prefill,decode}.yaml): `cache_transceiver_config`
  with `max_tokens_in_buffer` at least the longest input (a smaller buffer fails the KV transfer: ai-dynamo/dynamo
  #4327) and the overlap scheduler off.
- The launch commands for `dynamo.frontend` and `dynamo.trtllm` on a GPU machine, aggregated and disaggregated.
- A DynamoGraphDeployment (the Dynamo Kubernetes operator's resource, nvidia.com/v1alpha1) for the same.
Every key and flag is a row of the contract ledger (ledger/dynamo.py).
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from dynamo_serve.layout import DYNAMO_VERSION

# TensorRT-LLM's disaggregated KV transfer backends (tensorrt_llm/llmapi/llm_args.py CacheTransceiverConfig.backend).
TRANSCEIVER_BACKEND = "UCX"  # upstream's EAGLE examples
KV_BLOCK_SIZE = 32  # TensorRT-LLM's KvCacheConfig tokens_per_block default; dynamo.trtllm's --kv-block-size default
IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}"
FRONTEND_PORT = 8000
ROLES = ("agg", "prefill", "decode")


class DynamoRefusal(ValueError):
    """A build Dynamo does not serve as configured; the message says what to change."""


def refusals(options: dict[str, Any]) -> list[str]:
    """Combinations Dynamo's TensorRT-LLM worker does not serve."""
    out = []
    spec = options.get("speculative_config") or {}
    if spec and spec.get("decoding_type") not in ("Eagle3", "Eagle"):
        out.append(f"speculative_config.decoding_type={spec.get('decoding_type')!r}: the Dynamo deployment is "
                   "written for EAGLE heads only")
    return out


def engine_yamls(options: dict[str, Any], max_input_len: int) -> dict[str, dict[str, Any]]:
    """{role: LLM API options} for agg, prefill and decode."""
    if problems := refusals(options):
        raise DynamoRefusal("; ".join(problems))
    agg = copy.deepcopy(options)
    pair = copy.deepcopy(options)
    pair["disable_overlap_scheduler"] = True
    pair["cache_transceiver_config"] = {"backend": TRANSCEIVER_BACKEND,
                                        "max_tokens_in_buffer": transceiver_buffer(max_input_len)}
    return {"agg": agg, "prefill": copy.deepcopy(pair), "decode": pair}


def transceiver_buffer(max_input_len: int) -> int:
    """At least the longest input (#4327), rounded up to whole KV blocks."""
    return -(-max_input_len // KV_BLOCK_SIZE) * KV_BLOCK_SIZE


def frontend_argv(port: int = FRONTEND_PORT, router_mode: str = "kv") -> list[str]:
    """The OpenAI frontend with the KV-aware router."""
    return ["python3", "-m", "dynamo.frontend", "--http-port", str(port), "--router-mode", router_mode]


def worker_argv(role: str, model_path: str, served_model_name: str, engine_yaml: str) -> list[str]:
    """A TensorRT-LLM worker: `role` agg (prefill and decode), prefill or decode."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {ROLES}")
    argv = ["python3", "-m", "dynamo.trtllm", "--model", model_path, "--served-model-name", served_model_name,
            "--extra-engine-args", engine_yaml]
    if role != "agg":
        argv += ["--disaggregation-mode", role]
    return argv


def launch_script(model_path: str, served_model_name: str, engine_dir: str) -> str:
    """launch.sh: the commands for one GPU machine with etcd and NATS running (Dynamo's default planes)."""
    def line(argv: list[str]) -> str:
        return " ".join(shlex.quote(a) for a in argv)

    agg = worker_argv("agg", model_path, served_model_name, f"{engine_dir}/agg.yaml")
    pre = worker_argv("prefill", model_path, served_model_name, f"{engine_dir}/prefill.yaml")
    dec = worker_argv("decode", model_path, served_model_name, f"{engine_dir}/decode.yaml")
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# NVIDIA Dynamo {DYNAMO_VERSION} + TensorRT-LLM on one GPU machine (image {IMAGE}).",
        "# Needs etcd and NATS reachable (ETCD_ENDPOINTS, NATS_SERVER), as Dynamo's own examples do.",
        "#   bash launch.sh agg      frontend + one aggregated worker",
        "#   bash launch.sh disagg   frontend + a prefill worker (GPU 0) and a decode worker (GPU 1)",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "$0")" && pwd)"',
        'cd "$HERE"',
        "trap 'kill 0' EXIT",
        f"{line(frontend_argv())} &",
        'case "${1:-agg}" in',
        f"  agg) CUDA_VISIBLE_DEVICES=0 {line(agg)} & ;;",
        f"  disagg) CUDA_VISIBLE_DEVICES=0 {line(pre)} &",
        f"          CUDA_VISIBLE_DEVICES=1 {line(dec)} & ;;",
        '  *) echo "usage: launch.sh [agg|disagg]" >&2; exit 2 ;;',
        "esac",
        "wait -n",
        "",
    ])


def graph(name: str, model_path: str, served_model_name: str, engine_dir: str, *, disaggregated: bool,
          gpus_per_worker: int) -> dict[str, Any]:
    """A DynamoGraphDeployment: the frontend and TensorRT-LLM workers (aggregated, or prefill + decode)."""
    def worker(role: str, component: str, sub: str | None) -> dict[str, Any]:
        args = worker_argv(role, model_path, served_model_name, f"{engine_dir}/{role}.yaml")[3:]
        spec: dict[str, Any] = {
            "componentType": "worker", "replicas": 1,
            "resources": {"limits": {"gpu": str(gpus_per_worker)}},
            "extraPodSpec": {"mainContainer": {"image": IMAGE, "workingDir": "/workspace",
                                               "command": ["python3", "-m", "dynamo.trtllm"], "args": args}},
        }
        if sub is not None:
            spec["subComponentType"] = sub
        return {component: spec}

    services: dict[str, Any] = {"Frontend": {"componentType": "frontend", "replicas": 1,
                                             "extraPodSpec": {"mainContainer": {"image": IMAGE}}}}
    if disaggregated:
        services |= worker("prefill", "TRTLLMPrefillWorker", "prefill")
        services |= worker("decode", "TRTLLMDecodeWorker", "decode")
    else:
        services |= worker("agg", "TRTLLMWorker", None)
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name}, "spec": {"services": services}}
