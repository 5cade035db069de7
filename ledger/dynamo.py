"""Ledger rows: the NVIDIA Dynamo deployment of the current line (`<build>/dynamo/`, builders/dynamo/files.py), for
ai-dynamo 1.6.1 (dynamo_serve/layout.py DYNAMO_VERSION; cited at tag v1.6.1, read in the installed 1.6.1 wheel,
whose `dynamo` package is the repository's components/src/dynamo/).

Surfaces: `dynamo.engine_yaml` (the keys the worker YAMLs add to the build's LLM API options, read by TensorRT-LLM's
LLM through dynamo.trtllm's --extra-engine-args; the options themselves are the `llmapi.option` rows),
`dynamo.trtllm.flag` / `dynamo.frontend.flag` (launch.sh, the DynamoGraphDeployments, `eagle-dynamo serve`),
`dynamo.graph` (the DynamoGraphDeployment's keys, read by the operator) and `dynamo.register` (what the reference
worker passes to `register_model` and answers; dynamo_serve/worker.py, bridge.py).
"""

from __future__ import annotations

from ledger.rows import LLMAPI_LAYOUT, Row, Source, rows_of

DYN = "ai-dynamo/dynamo"
TRT = "NVIDIA/TensorRT-LLM"
SRC = "components/src/dynamo"
V = LLMAPI_LAYOUT

TRANSCEIVER = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "CacheTransceiverConfig (backend, max_tokens_in_buffer)")
OVERLAP = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "TorchLlmArgs.disable_overlap_scheduler")
TRTLLM_ARGS = Source(DYN, f"{SRC}/trtllm/backend_args.py", "DynamoTrtllmArgGroup.add_arguments")
FRONTEND_ARGS = Source(DYN, f"{SRC}/frontend/frontend_args.py", "FrontendArgGroup (--http-host, --http-port, "
                       "--discovery-backend, --request-plane, --event-plane)")
ROUTER_ARGS = Source(DYN, f"{SRC}/common/configuration/groups/router_args.py", "--router-mode")
KV_ROUTER_ARGS = Source(DYN, f"{SRC}/common/configuration/groups/kv_router_args.py", "--router-kv-events")
GRAPH_TYPES = Source(DYN, "deploy/operator/api/v1alpha1/dynamographdeployment_types.go",
                     "DynamoGraphDeploymentSpec.Services")
COMPONENT_TYPES = Source(DYN, "deploy/operator/api/v1alpha1/dynamocomponentdeployment_types.go",
                         "DynamoComponentDeploymentSharedSpec (componentType, subComponentType, replicas, resources, "
                         "extraPodSpec.mainContainer)")
REGISTER = Source(DYN, "lib/bindings/python/src/dynamo/_core.pyi", "register_model / ModelRuntimeConfig")
HANDLER = Source(DYN, f"{SRC}/trtllm/request_handlers/handler_base.py",
                 "HandlerBase.generate_locally (request token_ids / stop_conditions / sampling_options; response "
                 "token_ids, finish_reason, completion_usage, disaggregated_params)")

_YAML = (
    rows_of("dynamo.engine_yaml", ("cache_transceiver_config", "cache_transceiver_config.backend",
                                   "cache_transceiver_config.max_tokens_in_buffer"), TRANSCEIVER,
            type="dict / 'UCX' / int >= the longest input", required=True, versions=V, when=("disaggregated",),
            note="prefill.yaml and decode.yaml, as examples/backends/trtllm/engine_configs/llama4/eagle/"
            "eagle_{prefill,decode}.yaml; a buffer below the longest input fails the transfer (ai-dynamo/dynamo "
            "#4327). Only a GPU reads these: the reference worker hands over no KV cache")
    + rows_of("dynamo.engine_yaml", ("disable_overlap_scheduler",), OVERLAP, type="bool", versions=V,
              when=("disaggregated",), note="true in upstream's EAGLE prefill/decode examples")
)

_TRTLLM_FLAGS = rows_of(
    "dynamo.trtllm.flag", ("--model", "--served-model-name", "--extra-engine-args"), TRTLLM_ARGS,
    type="path / str / path (the LLM API YAML)", required=True, versions=V,
    note="--model (was --model-path, still accepted as obsolete_flag); the YAML's keys are passed to "
    "TensorRT-LLM's LLM",
) + rows_of("dynamo.trtllm.flag", ("--disaggregation-mode",), TRTLLM_ARGS, type="prefill | decode", versions=V,
            note="absent: prefill_and_decode (aggregated)")

_FRONTEND_FLAGS = (
    rows_of("dynamo.frontend.flag", ("--http-port", "--http-host"), FRONTEND_ARGS, type="u16 / str", versions=V,
            note="eagle-dynamo serve binds 127.0.0.1; the default host is 0.0.0.0")
    + rows_of("dynamo.frontend.flag", ("--router-mode",), ROUTER_ARGS, type="kv | round-robin | random ...",
              versions=V)
    + rows_of("dynamo.frontend.flag", ("--no-router-kv-events",), KV_ROUTER_ARGS, type="switch", versions=V,
              note="the reference worker publishes no KV events (no prefix cache): the router predicts from its "
              "own routing decisions")
    + rows_of("dynamo.frontend.flag", ("--discovery-backend", "--request-plane", "--event-plane"), FRONTEND_ARGS,
              type="file / tcp / zmq", versions=V, note="no etcd or NATS (DYN_FILE_KV names the directory)")
)

_GRAPH = (
    rows_of("dynamo.graph", ("apiVersion", "kind", "metadata", "metadata.name", "spec", "spec.services"),
            GRAPH_TYPES, type="nvidia.com/v1alpha1 / DynamoGraphDeployment / ... / {name: component}",
            required=True, versions=V, note="the operator's Go types read at the repository's main branch; the "
            "v1alpha1 schema at tag v1.6.1 was not read separately")
    + rows_of("dynamo.graph", ("componentType", "replicas", "extraPodSpec", "extraPodSpec.mainContainer",
                               "extraPodSpec.mainContainer.image"), COMPONENT_TYPES, type="per service",
              required=True, versions=V)
    + rows_of("dynamo.graph", ("subComponentType", "resources", "resources.limits", "resources.limits.gpu",
                               "extraPodSpec.mainContainer.workingDir", "extraPodSpec.mainContainer.command",
                               "extraPodSpec.mainContainer.args"), COMPONENT_TYPES, type="per service", versions=V)
)

_REGISTER = (
    rows_of("dynamo.register", ("model_input", "model_type", "endpoint", "model_path", "model_name", "worker_type"),
            REGISTER, type="Tokens / Chat|Completions or Prefill / ... / WorkerType", required=True, versions=V,
            note="model_path is dynamo/model/: register_model reads its config.json and tokenizer")
    + rows_of("dynamo.register", ("needs", "kv_cache_block_size", "runtime_config.context_length",
                                  "runtime_config.max_num_seqs", "runtime_config.max_num_batched_tokens",
                                  "runtime_config.enable_eagle"), REGISTER, type="optional", versions=V)
    + rows_of("dynamo.response", ("token_ids", "finish_reason", "completion_usage", "disaggregated_params"), HANDLER,
              type="list[int] / str or {error} / dict / dict (prefill only)", versions=V,
              note="a prefill worker answers once; the frontend passes disaggregated_params to the decode worker as "
              "prefill_result")
)

ROWS: list[Row] = _YAML + _TRTLLM_FLAGS + _FRONTEND_FLAGS + _GRAPH + _REGISTER
