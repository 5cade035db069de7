"""Ledger rows: the Triton model repository. Every config.pbtxt field (Triton core's ModelConfig), the C++
`tensorrtllm` backend's parameters, inputs and outputs (engine.backend tensorrt), and the parameters and tensors of
this project's python models (their consumer is our own code; the tensor names follow upstream's templates so
existing clients work). Flags (`when`): perf = the backend writes perf outputs (return_perf_metrics)."""

from __future__ import annotations

from ledger.rows import ENGINE_FLOW, ENSEMBLE, Row, Source, only, rows_of

TRT = "NVIDIA/TensorRT-LLM"
PROTO = Source("triton-inference-server/common", "protobuf/model_config.proto", "ModelConfig")
CORE_OUTPUT = Source("triton-inference-server/core", "src/infer_response.cc",
                     "InferenceResponse::AddOutput -> Model::GetOutput ('unexpected inference output')")
STATE = Source(TRT, "triton_backend/inflight_batcher_llm/src/model_state.cc",
               "ModelState::GetParameter ('Cannot find parameter with name')")
INSTANCE = "triton_backend/inflight_batcher_llm/src/model_instance_state.cc"
EXECUTOR_CFG = Source(TRT, INSTANCE, "ModelInstanceState::getExecutorConfigFromParams")
GUIDED = Source(TRT, INSTANCE, "ModelInstanceState::getGuidedDecodingConfigFromParams (read without try)")
CTOR = Source(TRT, INSTANCE, "ModelInstanceState::ModelInstanceState (gpt_model_path)")
BATCHING = Source(TRT, INSTANCE, "ModelInstanceState::getBatchingTypeFromParams (read without try)")
KV = Source(TRT, INSTANCE, "ModelInstanceState::getKvCacheConfigFromParams")
SCHED = Source(TRT, INSTANCE, "ModelInstanceState::getSchedulerConfigFromParams")
FILL = Source(TRT, INSTANCE, "ModelInstanceState::fillTritonResponse")
NAMES = Source(TRT, "triton_backend/inflight_batcher_llm/src/utils.h", "InputFieldsNames / kStreamingInputTensorName / "
               "kStopInputTensorName")
OUT_NAMES = Source(TRT, "triton_backend/inflight_batcher_llm/src/utils.h", "OutputFieldsNames")
SPLIT = Source(TRT, "triton_backend/inflight_batcher_llm/src/utils.cc", "splitBatchInputsTensors")
OURS = "eagle-deploy"


def _ours(model: str) -> Source:
    return Source(OURS, f"triton_repo/models/{model}.py", "TritonPythonModel.initialize (common.Params)")


_MODEL_CONFIG = (
    rows_of("triton.model_config", ("name", "max_batch_size", "input", "output", "instance_group", "parameters"),
            PROTO, type="ModelConfig fields")
    + rows_of("triton.model_config", ("backend", "platform"), PROTO, type="str ('tensorrtllm' | 'python' / 'ensemble')")
    + rows_of("triton.model_config", ("input.name", "input.data_type", "input.dims",
                                      "output.name", "output.data_type", "output.dims"), PROTO,
              type="ModelInput / ModelOutput fields")
    + rows_of("triton.model_config", ("input.optional",), PROTO, type="bool",
              note="ensemble text_input / max_tokens and preprocessing QUERY / REQUEST_OUTPUT_LEN: true although "
              "upstream's templates say required; Triton 2.51 (core r24.10 src/infer_request.cc "
              "InferenceRequest::Normalize) compares only the number of inputs, so an ensemble request missing one "
              "ended as an empty success; preprocessing now refuses it naming the input")
    + rows_of("triton.model_config", ("input.reshape",), PROTO, type="ModelTensorReshape",
              note="tensorrt_llm: `reshape: { shape: [ ] }` on [1] inputs -> [batch] for splitBatchInputsTensors")
    + rows_of("triton.model_config", ("input.allow_ragged_batch",), PROTO, type="bool")
    + rows_of("triton.model_config", ("instance_group.kind", "instance_group.count"), PROTO, type="KIND_CPU / int")
    + rows_of("triton.model_config", ("dynamic_batching", "dynamic_batching.max_queue_delay_microseconds",
                                      "dynamic_batching.preferred_batch_size", "dynamic_batching.default_queue_policy",
                                      "dynamic_batching.default_queue_policy.max_queue_size"), PROTO,
              type="ModelDynamicBatching / ModelQueuePolicy",
              note="tensorrt_llm also reads default_queue_policy.max_queue_size (getExecutorConfigFromParams)")
    + rows_of("triton.model_config", ("model_transaction_policy", "model_transaction_policy.decoupled"), PROTO,
              type="bool", note="tensorrt_llm reads it in ModelState::LoadParameters")
    + rows_of("triton.model_config", ("ensemble_scheduling", "ensemble_scheduling.step",
                                      "ensemble_scheduling.step.model_name", "ensemble_scheduling.step.model_version",
                                      "ensemble_scheduling.step.input_map", "ensemble_scheduling.step.output_map"),
              PROTO, type="ModelEnsembling")
)

_CPP_PARAMS = (
    rows_of("triton.tensorrt_llm.parameter", ("gpt_model_type",), BATCHING, type="inflight_fused_batching",
            required=True)
    + rows_of("triton.tensorrt_llm.parameter", ("gpt_model_path",), CTOR, type="engine dir", required=True,
              note="read in a try, but the instance fails when neither gpt_model_path nor encoder_model_path is set")
    + rows_of("triton.tensorrt_llm.parameter", ("tokenizer_dir", "guided_decoding_backend",
                                                "xgrammar_tokenizer_info_path"), GUIDED,
              type="str ('' = no guided decoding)", required=True,
              note="a missing one throws at model load, so the ensemble never loads")
    + rows_of("triton.tensorrt_llm.parameter", ("max_beam_width", "enable_chunked_context", "decoding_mode",
                                                "eagle_choices"), EXECUTOR_CFG,
              type="1 / false / 'eagle' / '{0}, {0,0}, ...' (braces)",
              note="eagle_choices missing or unparsable: warning and mc_sim_7b_63 (TensorRT-LLM's default tree)")
    + rows_of("triton.tensorrt_llm.parameter", ("kv_cache_free_gpu_mem_fraction", "enable_kv_cache_reuse"), KV,
              type="float / bool")
    + rows_of("triton.tensorrt_llm.parameter", ("batch_scheduler_policy",), SCHED, type="guaranteed_no_evict")
)

_CPP_INPUTS = (
    rows_of("triton.tensorrt_llm.input", ("input_ids", "request_output_len"), NAMES, type="INT32 [-1] / [1]",
            required=True)
    + rows_of("triton.tensorrt_llm.input", ("input_lengths",), SPLIT, type="INT32 [1] (reshaped to [])",
              required=True, note="needed to split a batch of more than one row")
    + rows_of("triton.tensorrt_llm.input", ("end_id", "pad_id", "stop_words_list", "beam_width", "temperature",
                                            "runtime_top_k", "runtime_top_p", "seed", "return_perf_metrics",
                                            "exclude_input_in_output", "streaming", "stop"), NAMES,
              type="optional inputs")
)
_PERF = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
         "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
         "total_accepted_draft_tokens", "total_draft_tokens")
_CPP_OUTPUTS = (
    rows_of("triton.tensorrt_llm.output", ("output_ids", "sequence_length"), FILL, type="INT32", required=True,
            note="'tensor must be present in list of output tensors'")
    + rows_of("triton.tensorrt_llm.output", _PERF, OUT_NAMES, type="INT32 / INT64 / FP32 [1]", required=True,
              when=("perf",), note="with return_perf_metrics the backend writes all ten; Triton core refuses an "
              "undeclared output (" + CORE_OUTPUT.path + "), failing the response")
)

_PYTHON = (
    rows_of("triton.preprocessing.parameter", ("tokenizer_dir", "add_special_tokens", "max_input_len",
                                               "max_seq_len", "greedy_only", "perf_bridge"), _ours("preprocessing"),
            type="str", required=True)
    + rows_of("triton.postprocessing.parameter", ("tokenizer_dir", "skip_special_tokens",
                                                  "draft_tokens_per_step", "llm_model", "decoupled"),
              _ours("postprocessing"), type="str", required=True)
    + rows_of("triton.bls.parameter", ("tokenizer_dir", "preprocessing_model", "llm_model", "decoupled",
                                       "draft_tokens_per_step"),
              _ours("bls"), type="str", required=True)
    + rows_of("triton.python_llm.parameter", ("tokenizer_dir", "llm_kind", "build_dir",
                                              "max_queue_size", "decoupled"), _ours("reference_llm"), type="str",
              required=True, note="the same parameters for llmapi_llm.py (engine.backend pytorch)")
    + rows_of("triton.python_llm.parameter", ("max_batch_size", "max_input_len", "max_seq_len"), _ours("llmapi_llm"),
              type="str", required=True, when=("pytorch",),
              note="engine.backend pytorch only (the reference model reads them from the engine's reference.json)")
    + rows_of("triton.python_llm.parameter", ("request_deadline_s",), _ours("reference_llm"), type="str (seconds)",
              required=True, when=("reference",),
              note="engine.backend reference only (triton.request_deadline_s, or max_seq_len x "
              "triton.deadline_per_token_s)")
    + rows_of("triton.python_llm.parameter", ("perf_every_response",), _ours("reference_llm"),
              type="str (true / false)", required=True, when=("reference",),
              note="engine.backend reference only: true = perf outputs with arrival_time_ns on every response, as the "
              "C++ backend writes them (the perf bridge's CPU twin, triton_repo/models/perf_bridge.py)")
    + rows_of("triton.python_llm.parameter", ("speculative",), _ours("reference_llm"), type="str (true / false)",
              required=True, when=("reference",),
              note="engine.backend reference only: false = the same build decoded without speculation (a baseline)")
)

_CONTRACT = Source(OURS, "triton_repo/contract.py", "the tensors every python model reads and writes")
_TENSORS = rows_of(
    "triton.python.tensor",
    (  # ensemble / BLS (client-facing: upstream's ensemble template names), then preprocessing, postprocessing
        "text_input", "max_tokens", "stop_words", "exclude_input_in_output", "end_id", "pad_id", "top_k", "top_p",
        "temperature", "seed", "beam_width", "return_perf_metrics", "stream", "text_output", "acceptance_rate",
        "total_accepted_draft_tokens", "total_draft_tokens",
        "QUERY", "REQUEST_OUTPUT_LEN", "STOP_WORDS_DICT", "END_ID", "PAD_ID", "TEMPERATURE", "RUNTIME_TOP_K",
        "RUNTIME_TOP_P", "INPUT_ID", "REQUEST_INPUT_LEN", "STOP_WORDS_IDS", "OUT_END_ID", "OUT_PAD_ID",
        "TOKENS_BATCH", "SEQUENCE_LENGTH", "OUTPUT",
        # the python LLM models (reference / LLM API) take the tensorrt_llm model's I/O
        "input_ids", "input_lengths", "request_output_len", "stop_words_list", "runtime_top_k", "runtime_top_p",
        "streaming", "stop", "output_ids", "sequence_length",
    ),
    _CONTRACT, type="see triton_repo/contract.py",
    note="names as upstream's all_models/inflight_batcher_llm templates (tensorrt_llm, preprocessing, postprocessing, "
    "ensemble); TEMPERATURE / RUNTIME_TOP_K / RUNTIME_TOP_P are this project's (greedy-only refusal)",
)

# The perf bridge (triton_repo/models/perf_bridge.py): postprocessing counts the C++ backend's perf outputs.
_BRIDGE = Source(OURS, "triton_repo/models/perf_bridge.py", "PerfBridge.observe / INPUTS")
_BRIDGE_TENSORS = (
    rows_of("triton.python.tensor", ("RETURN_PERF_METRICS", "OUT_RETURN_PERF_METRICS", "TOTAL_ACCEPTED_DRAFT_TOKENS",
                                     "TOTAL_DRAFT_TOKENS", "ARRIVAL_TIME_NS"), _BRIDGE,
            type="BOOL / BOOL / INT32 / INT32 / INT64 [1]",
            note="this project's names (preprocessing output, postprocessing inputs) in the engine-flow ensemble")
    + rows_of("triton.python.tensor", ("arrival_time_ns",), OUT_NAMES, type="INT64 [1]",
              note="the reference model's twin of the C++ backend's perf output (perf_every_response true); "
              "fillTritonResponse writes it with every perf output")
)

_HANDLE = Source(OURS, "triton_repo/models/stop_relay.py", "StopRelay.observe / handle_of")
_HANDLE_ROWS = rows_of("triton.python.tensor", ("sequence_handle", "SEQUENCE_HANDLE"), _HANDLE, type="BYTES [1]",
                       note="the python LLM model's per-request handle (output) and postprocessing's optional input, "
                       "wired when the LLM model is a python model that streams; never an ensemble output")

_GUARD = Source(OURS, "triton_repo/models/guard.py", "load_key / token_tensor / allowed")
_GUARD_ROWS = (
    rows_of("triton.preprocessing.parameter", ("internal_guard",), _ours("preprocessing"), type="str (true / false)",
            required=True, note="true: emit INTERNAL_TOKEN for the LLM model (triton.expose_internal_models false)")
    + rows_of("triton.bls.parameter", ("internal_guard",), _ours("bls"), type="str (true / false)", required=True,
              note="true: send the per-start secret as a request parameter to the LLM model")
    + rows_of("triton.python_llm.parameter", ("internal_guard", "entry_models"), _ours("reference_llm"),
              type="str", required=True,
              note="true: refuse requests without the secret or the preprocessing token, naming the entry models "
              "(the same parameters for llmapi_llm.py)")
    + rows_of("triton.python.tensor", ("INTERNAL_TOKEN",), _GUARD, type="BYTES [1]",
              note="preprocessing output wired to the python LLM model only, never an ensemble output; present when "
              "the internal models are guarded")
)

ROWS: list[Row] = (_MODEL_CONFIG + only(_CPP_PARAMS + _CPP_INPUTS + _CPP_OUTPUTS, ENGINE_FLOW)
                   + only(_PYTHON + _TENSORS + _BRIDGE_TENSORS + _GUARD_ROWS + _HANDLE_ROWS, ENSEMBLE))
