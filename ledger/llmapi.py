"""Ledger rows: the current TensorRT-LLM line (versions whose Triton layout is upstream's `llmapi` model).

What we write there: the LLM API options (`speculative_config` of `Eagle3DecodingConfig`) in the engine stage's YAML
and in the Triton model's `model.yaml`, the `model.yaml` keys the llmapi model reads itself (`triton_config`), and
the `tensorrt_llm` model's config.pbtxt inputs/outputs. Upstream's model files live in TensorRT-LLM's
`triton_backend/all_models/llmapi/tensorrt_llm/` (in the NGC/backend image under /app/all_models/llmapi). The
reference engine's mirror of that model (triton_repo/models/llmapi_reference.py) takes the same inputs and outputs
plus two parameters of its own. Flags (`when`): dynamic = a dynamic draft tree.
"""

from __future__ import annotations

from ledger.rows import LLMAPI_LAYOUT, Row, Source, rows_of

TRT = "NVIDIA/TensorRT-LLM"
LLMAPI_DIR = "triton_backend/all_models/llmapi/tensorrt_llm"
EAGLE3_CFG = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "Eagle3DecodingConfig (StrictBaseModel, extra='forbid')")
SPEC_UNION = Source(TRT, "tensorrt_llm/llmapi/llm_args.py",
                    "SpeculativeConfig (Field(discriminator='decoding_type')) / BaseLlmArgs.speculative_config")
LLM_ARGS = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "BaseLlmArgs.model")
MODEL_INIT = Source(TRT, f"{LLMAPI_DIR}/1/model.py",
                    "TritonPythonModel.initialize (get_model_config(model.yaml, include_keys=['triton_config']))")
AUTO_COMPLETE = Source(TRT, f"{LLMAPI_DIR}/1/model.py", "TritonPythonModel.auto_complete_config")
CONVERT = Source(TRT, f"{LLMAPI_DIR}/1/model.py", "TritonPythonModel._convert_request (text_input, 1-D, one prompt)")
SAMPLING = Source(TRT, f"{LLMAPI_DIR}/1/helpers.py",
                  "get_sampling_params_from_request / get_streaming_from_request / get_output_config_from_request")
STOP = Source(
    TRT, f"{LLMAPI_DIR}/1/model.py", "TritonPythonModel._execute_single_request ('stop' -> handle_stop_request)"
)
RESPONSE = Source(TRT, f"{LLMAPI_DIR}/1/model.py", "TritonPythonModel._create_response")
PBTXT = Source(TRT, f"{LLMAPI_DIR}/config.pbtxt", "input / output")
DECODING_BASE = Source(TRT, "tensorrt_llm/llmapi/llm_args.py",
                       "DecodingBaseConfig (PR #10860): draft_len_schedule validate_draft_len_schedule_and_sort / "
                       "max_concurrency validator; the Eagle3DecodingConfig API reference of the release")
DYNAMIC_DRAFT_LEN = Source(TRT, "tensorrt_llm/_torch/speculative/interface.py",
                           "SpeculativeDecodingMode.support_dynamic_draft_len (EAGLE-3 one-model)")
MIRROR = Source("eagle-deploy", "triton_repo/models/llmapi_reference.py", "TritonPythonModel.initialize")
PENALTY_SWITCH = Source(TRT, "tensorrt_llm/llmapi/llm_args.py",
                        "DecodingBaseConfig.enable_penalty (PR #17701); the Eagle3DecodingConfig API reference of the "
                        "release")
ONE_MODEL_SAMPLER = Source(TRT, "tensorrt_llm/_torch/speculative/spec_sampler_base.py",
                           "SpecSampler.validate_request (penalties need enable_penalty, none with trees; logprobs, "
                           "logits and min_p refused)")
LORA = Source(TRT, f"{LLMAPI_DIR}/1/helpers.py",
              "get_lora_request_from_request (lora_id + lora_name + lora_path together; lora_ckpt_source 'hf')")
LOGITS = Source(TRT, f"{LLMAPI_DIR}/1/helpers.py",
                "get_logits_post_processor_from_request (names from model.yaml logits_post_processors; PR #18507)")
TUTORIAL_VL = Source("triton-inference-server/tutorials", "Popular_Models_Guide/Qwen2.5-VL/qwen2_5_vl_trtllm_guide.md",
                     "image_url / triton_config.multimodal (NVIDIA/TensorRT-LLM PR #18381)")

V = LLMAPI_LAYOUT

_OPTIONS = (
    rows_of("llmapi.option", ("speculative_config.decoding_type",), SPEC_UNION, type="'Eagle3'", required=True,
            versions=V, note="the discriminator: 'Eagle3' validates into Eagle3DecodingConfig")
    + rows_of("llmapi.option", ("speculative_config.max_draft_len",), EAGLE3_CFG, type="int > 0 (drafting steps)",
              required=True, versions=V, note="validate_eagle_config: 'max_draft_len must be > 0 for Eagle'")
    + rows_of("llmapi.option", ("speculative_config.speculative_model",), EAGLE3_CFG, type="path (the head dir)",
              required=True, versions=V,
              note="AliasChoices('speculative_model', 'speculative_model_dir'); 'Draft model must be provided'")
    + rows_of("llmapi.option", ("speculative_config.eagle3_layers_to_capture",), EAGLE3_CFG,
              type="set[int] (layer outputs)", versions=V, note="default {1, L//2 - 1, L - 4}")
    + rows_of("llmapi.option", ("speculative_config.use_dynamic_tree", "speculative_config.dynamic_tree_max_topK",
                                "speculative_config.max_total_draft_tokens"), EAGLE3_CFG, type="true / int > 0 / int",
              required=True, versions=V, when=("dynamic",),
              note="max_draft_len <= max_total_draft_tokens <= dynamic_tree_max_topK * max_draft_len; no "
              "eagle_choices on this line (PR #18210)")
)

# Occurrence penalties on the one-model speculative path (flag penalty = tree.enable_penalty).
_PENALTY = rows_of("llmapi.option", ("speculative_config.enable_penalty",), PENALTY_SWITCH, type="bool (default false)",
                   required=True, versions=V, when=("penalty",),
                   note="written only when true (chains): without it " + ONE_MODEL_SAMPLER.path + " refuses "
                   "repetition / presence / frequency penalties; with a tree it refuses them anyway (get_spec_decoder "
                   "penalty_supported), so the build refuses the switch there")

# Load-aware speculation (builders/speculation.py; the reference engine's semantics: engines/schedule.py). Flags:
# schedule / max_concurrency / acceptance = the config sets tree.draft_len_schedule / max_concurrency / the switch.
_LOAD_AWARE = (
    rows_of("llmapi.option", ("speculative_config.draft_len_schedule",), DECODING_BASE,
            type="dict[int, int]: batch threshold -> draft length (0 = off)", required=True, versions=V,
            when=("schedule",), note="thresholds >= 1, lengths >= 0 and <= max_draft_len, the smallest threshold's "
            "length = max_draft_len; above the largest threshold: no speculation; exclusive with max_concurrency; "
            "honoured on the EAGLE-3 one-model path (" + DYNAMIC_DRAFT_LEN.path + " support_dynamic_draft_len)")
    + rows_of("llmapi.option", ("speculative_config.max_concurrency",), DECODING_BASE, type="int > 0",
              required=True, versions=V, when=("max_concurrency",),
              note="translated upstream into draft_len_schedule {max_concurrency: max_draft_len}")
    + rows_of("llmapi.option", ("speculative_config.acceptance_rate_window_size",
                                "speculative_config.acceptance_rate_threshold"), DECODING_BASE,
              type="int >= 0 / float in [0, 1]", required=True, versions=V, when=("acceptance",),
              note="speculation off for good once the mean accepted/drafted rate of the last N speculating "
              "iterations drops below the threshold; names at 1.3.0rc27..1.4.0rc4 (later main: acceptance_window)")
)

_MODEL_YAML = (
    rows_of("llmapi.model_yaml", ("model",), LLM_ARGS, type="path (HF target dir)", required=True, versions=V,
            note="every key but triton_config goes to LLM(**update_llm_args_with_extra_dict({}, yaml))")
    + rows_of("llmapi.model_yaml", ("triton_config", "triton_config.decoupled"), MODEL_INIT, type="dict / bool",
              required=True, versions=V, note="read without a default; the mirror reads it the same way")
    + rows_of("llmapi.model_yaml", ("triton_config.max_batch_size",), AUTO_COMPLETE, type="int (0: no Triton "
              "batching)", required=True, versions=V)
)

_INPUTS = (
    rows_of("triton.llmapi.input", ("text_input",), CONVERT, type="TYPE_STRING [-1]", required=True, versions=V)
    + rows_of("triton.llmapi.input", ("streaming",), SAMPLING, type="TYPE_BOOL [1]", versions=V)
    + rows_of("triton.llmapi.input", tuple(f"sampling_param_{n}" for n in (
        "best_of", "temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty", "max_tokens", "stop",
        "seed", "exclude_input_from_output", "return_perf_metrics")), SAMPLING,
        type="INT32 / FP32 / UINT64 / BOOL [1]; stop STRING [-1]", versions=V,
        note="SamplingParams(**{name minus 'sampling_param_': value}); a non-zero frequency / presence penalty is "
        "refused with INVALID_ARGUMENT at our request boundary (triton_repo/models/llmapi_refusals.py) unless "
        "tree.enable_penalty, as " + ONE_MODEL_SAMPLER.path + " would refuse it at admission")
    + rows_of("triton.llmapi.input", ("return_finish_reason", "return_stop_reason"), SAMPLING, type="TYPE_BOOL [1]",
              versions=V)
    + rows_of("triton.llmapi.input", ("return_cumulative_logprob",), SAMPLING, type="TYPE_BOOL [1]", versions=V,
              note="refused with INVALID_ARGUMENT at our request boundary: speculative decoding computes no log "
              "probabilities (" + ONE_MODEL_SAMPLER.symbol.split(" (")[0] + " refuses logprobs), so upstream would "
              "answer cumulative_logprob 'None'")
    + rows_of("triton.llmapi.input", ("stop",), STOP, type="TYPE_BOOL [1]", versions=V,
              note="cancels the requests of the same Triton request id")
    + rows_of("triton.llmapi.input", ("lora_id", "lora_name", "lora_path", "lora_ckpt_source"), LORA,
              type="UINT64 / STRING / STRING / STRING [1], optional", versions=V,
              note="engine.backend reference only, declared to be refused by name with INVALID_ARGUMENT "
              "(triton_repo/models/llmapi_refusals.py); engine.backend pytorch leaves them out: model.yaml has no "
              "lora_config, so the LLM runs without LoRA and Triton refuses the input")
)

_OUTPUTS = (
    rows_of("triton.llmapi.output", ("text_output",), RESPONSE, type="TYPE_STRING [-1]", required=True, versions=V,
            note="streaming: each response carries RequestOutput.outputs[i].text, the text generated so far")
    + rows_of("triton.llmapi.output", ("finish_reason", "stop_reason", "cumulative_logprob"), RESPONSE,
              type="STRING / STRING / FP32 [-1] (sent as strings)", versions=V)
    + rows_of("triton.llmapi.output", (
        "kv_cache_reused_block", "kv_cache_hit_rate", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
        "kv_cache_missed_block", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
        "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"), RESPONSE,
        type="declared INT32 / FP32 / INT64, sent as strings (dtype of text_output)", versions=V,
        note="sent when request_perf_metrics is present (sampling_param_return_perf_metrics)")
)

_BRIDGE = rows_of("llmapi.option", ("enable_iter_perf_stats",),
                  Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "TorchLlmArgs.enable_iter_perf_stats (LLM.get_stats)"),
                  type="bool", versions=V, note="engine.backend pytorch: the metrics bridge (triton_repo/models/"
                  "llmapi_bridge.py) reads the iteration statistics it turns on")

_MIRROR = rows_of("triton.llmapi.parameter", ("build_dir", "max_queue_size"), MIRROR, type="str", required=True,
                  versions=V, when=("reference",),
                  note="reference engine only (engine.backend reference); upstream's model reads no parameter")

# Serving fields for large models (builders/serving_config.py) and the names its pass-through may carry. Flags:
# attention_dp / ep / moe_backend / cuda_graph = the serving field is set.
# Fields read in tensorrt_llm/llmapi/llm_args.py at commit fcd3f31682808ae56118ae43c1d7864a3a945e6f (main), not at the
# release tag: enable_attention_dp, enable_lm_head_tp_in_adp, moe_expert_parallel_size, num_postprocess_workers,
# MoeConfig.use_low_precision_moe_combine, CudaGraphConfig {batch_sizes, max_batch_size, enable_padding}; the others
# as upstream's DeepSeek recipes set them (docs/contracts.md, "Not verified").
TORCH_ARGS = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "TorchLlmArgs / BaseLlmArgs (StrictBaseModel)")
MOE_CFG = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "MoeConfig.backend (TorchLlmArgs.moe_config)")
GRAPH_CFG = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "CudaGraphConfig (TorchLlmArgs.cuda_graph_config)")
_SERVING = (
    rows_of("llmapi.option", ("enable_attention_dp",), TORCH_ARGS, type="bool (default false)", required=True,
            versions=V, when=("attention_dp",), note="attention per rank on its own requests (DeepSeek-V3 recipe "
            "examples/models/core/deepseek_v3/README.md); KV per rank: KVCacheManager.get_cache_size_per_token "
            "divides GQA heads by tp only without it")
    + rows_of("llmapi.option", ("moe_expert_parallel_size",), TORCH_ARGS, type="int (trtllm-serve --ep_size)",
              required=True, versions=V, when=("ep",), note="divides tensor_parallel_size")
    + rows_of("llmapi.option", ("moe_config", "moe_config.backend"), MOE_CFG,
              type="MoeConfig / 'CUTLASS' | 'TRTLLM' | 'DEEPGEMM' | 'WIDEEP' | ...", required=True, versions=V,
              when=("moe_backend",), note="the DeepSeek-R1 deployment guide's MoE backend support matrix")
    + rows_of("llmapi.option", ("cuda_graph_config", "cuda_graph_config.enable_padding",
                                "cuda_graph_config.max_batch_size"), GRAPH_CFG, type="CudaGraphConfig / bool / int",
              required=True, versions=V, when=("cuda_graph",))
    # pass-through only (serving.extra_llm_api_options): names upstream's DeepSeek / Kimi recipes set
    + rows_of("llmapi.option", ("print_iter_log", "stream_interval", "trust_remote_code", "enable_chunked_prefill",
                                "disable_overlap_scheduler", "moe_tensor_parallel_size", "enable_lm_head_tp_in_adp",
                                "num_postprocess_workers"), TORCH_ARGS,
              type="bool / int / bool / bool / bool / int / bool / int", versions=V,
              note="serving.extra_llm_api_options only")
    + rows_of("llmapi.option", ("cuda_graph_config.batch_sizes",), GRAPH_CFG, type="list[int]", versions=V,
              note="serving.extra_llm_api_options only")
    + rows_of("llmapi.option", ("moe_config.use_low_precision_moe_combine",), MOE_CFG, type="bool", versions=V,
              note="serving.extra_llm_api_options only")
    + rows_of("llmapi.option", ("kv_cache_config.max_tokens",), Source(TRT, "tensorrt_llm/llmapi/llm_args.py",
              "KvCacheConfig.max_tokens"), type="int", versions=V, note="serving.extra_llm_api_options only")
)

ROWS: list[Row] = (_OPTIONS + _PENALTY + _LOAD_AWARE + _MODEL_YAML + _INPUTS + _OUTPUTS + _BRIDGE + _MIRROR
                   + _SERVING)

# Inputs of upstream's config.pbtxt (as read: docs/contracts.md, "Sources") that our repository does not declare, with
# the reason; every upstream input is a row above or here (tests/test_ledger.py).
UPSTREAM_INPUTS = (
    "text_input", "image_url", "streaming", "sampling_param_best_of", "sampling_param_temperature",
    "sampling_param_top_k", "sampling_param_top_p", "sampling_param_frequency_penalty",
    "sampling_param_presence_penalty", "sampling_param_max_tokens", "sampling_param_stop", "sampling_param_seed",
    "sampling_param_exclude_input_from_output", "sampling_param_return_perf_metrics", "return_finish_reason",
    "return_stop_reason", "return_cumulative_logprob", "stop", "lora_id", "lora_name", "lora_path", "lora_ckpt_source",
)
NOT_DECLARED: tuple[tuple[str, Source, str], ...] = (
    ("image_url", TUTORIAL_VL,
     "not declared on any backend: our targets are text-only Llama-family models; upstream reads it only with "
     "triton_config.multimodal (which we never write) and otherwise drops the images silently; it comes from PR "
     "#18381, in no released TensorRT-LLM. Triton refuses a request carrying it (INVALID_ARGUMENT, 'unexpected "
     "inference input')"),
    ("lora_id / lora_name / lora_path / lora_ckpt_source (engine.backend pytorch)", LORA,
     "not declared: model.yaml writes no lora_config, so TensorRT-LLM's LLM has no LoRA; the model.py read "
     "(b35ac1b6) does not read them, so a declared input could be dropped silently. Triton refuses them"),
    ("sampling_param_logits_post_processor_name (engine.backend pytorch)", LOGITS,
     "not declared: model.yaml writes no logits_post_processors, and upstream's helper (0df60f9a) refuses every "
     "name not configured there; the model.py read (b35ac1b6) does not read it, so a declared input could be "
     "dropped silently. Triton refuses it"),
)
