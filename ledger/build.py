"""Ledger rows: the `trtllm-build` argv, the LLM API options YAML (and the Triton LLM-API model.yaml), the
`trtllm-serve` argv. Flags (`when`): tree = a static non-chain draft tree."""

from __future__ import annotations

from ledger.rows import ENGINE_FLOW, Row, Source, only, rows_of

TRT = "NVIDIA/TensorRT-LLM"
BUILD = Source(TRT, "tensorrt_llm/commands/build.py", "parse_arguments")
PLUGIN = Source(TRT, "tensorrt_llm/plugin/plugin.py", "add_plugin_argument / PluginConfig (cli_plugin_args)")
SERVE = Source(TRT, "tensorrt_llm/commands/serve.py", "serve (click options)")
LLM_ARGS = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "BaseLlmArgs (StrictBaseModel, extra='forbid')")
KV_CONFIG = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "KvCacheConfig (StrictBaseModel)")
DECODING = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "DecodingBaseConfig (StrictBaseModel) / from_dict")
EAGLE_CFG = Source(TRT, "tensorrt_llm/llmapi/llm_args.py", "EagleDecodingConfig")
EAGLE3_WORKERS = Source(TRT, "tensorrt_llm/_torch/speculative/eagle3.py",
                        "Eagle3OneModelSpecMetadata.__post_init__ / Eagle3SpecMetadata.__post_init__")
OURS_LLMAPI_MODEL = Source("eagle-deploy", "triton_repo/models/llmapi_llm.py",
                           "TritonPythonModel.initialize (LLM(**model.yaml minus triton_config))")

_BUILD = (
    rows_of("trtllm-build.flag", ("--checkpoint_dir", "--output_dir"), BUILD, type="path", required=True)
    + rows_of("trtllm-build.flag", ("--speculative_decoding_mode",), BUILD, type="choice: eagle", required=True,
              note="without it the EAGLE engine is built without its speculative inputs")
    + rows_of("trtllm-build.flag", ("--max_draft_len",), BUILD, type="int (0 = checkpoint's)", required=True)
    + rows_of("trtllm-build.flag", ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens"), BUILD,
              type="int (defaults 2048 / 1024 / from the model / 8192)")
    + rows_of("trtllm-build.flag", ("--kv_cache_type",), BUILD, type="choice: continuous | paged | disabled",
              note="EAGLE needs paged (EagleForCausalLM.forward asserts paged_kv_cache)")
    + rows_of("trtllm-build.flag", ("--workers",), BUILD, type="int")
    + rows_of("trtllm-build.flag", ("--gpt_attention_plugin",), PLUGIN, type="auto | float16 | float32 | bfloat16 | "
              "int32 | disable")
    + rows_of("trtllm-build.flag", ("--gemm_plugin",), PLUGIN, type="auto | float16 | float32 | bfloat16 | int32 | "
              "fp8 | nvfp4 | disable")
    + rows_of("trtllm-build.flag", ("--remove_input_padding", "--use_paged_context_fmha", "--use_fp8_context_fmha"),
              PLUGIN, type="enable | disable")
)

_SERVE = (
    rows_of("trtllm-serve.flag", ("--backend",), SERVE, type="pytorch | tensorrt | _autodeploy (default pytorch)",
            versions=ENGINE_FLOW, note="the current line leaves it out (pytorch is the default; tensorrt was removed)")
    + rows_of("trtllm-serve.flag", ("--tokenizer", "--host", "--port"), SERVE, type="str / str / int")
    + rows_of("trtllm-serve.flag", ("--extra_llm_api_options",), SERVE, type="path (YAML merged into the LLM args)",
              required=True, note="also spelled --config in later releases")
)

_LLMAPI = (
    rows_of("llmapi.option", ("tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_num_tokens",
                              "max_seq_len", "max_input_len", "dtype"), LLM_ARGS, type="int / str")
    + rows_of("llmapi.option", ("kv_cache_config",), LLM_ARGS, type="KvCacheConfig")
    + rows_of("llmapi.option", ("speculative_config",), LLM_ARGS, type="SpeculativeConfig", required=True,
              note="without it the target runs without EAGLE")
    + rows_of("llmapi.option", ("kv_cache_config.dtype", "kv_cache_config.free_gpu_memory_fraction",
                                "kv_cache_config.enable_block_reuse"), KV_CONFIG, type="'auto' | 'fp8' / float / bool")
    + rows_of("llmapi.option", ("speculative_config.decoding_type",), DECODING, type="'Eagle'", required=True,
              versions=ENGINE_FLOW, note="from_dict dispatches on it and pops it")
    + rows_of("llmapi.option", ("speculative_config.max_draft_len", "speculative_config.speculative_model_dir"),
              DECODING, type="int (drafting steps) / path", required=True, versions=ENGINE_FLOW,
              note="EagleDecodingConfig asserts max_draft_len; validate() needs the draft model dir")
    + rows_of("llmapi.option", ("speculative_config.eagle3_one_model",), EAGLE_CFG, type="bool (default true)",
              versions=("1.1",), note="true: chains only on 1.1")
    + rows_of("llmapi.option", ("speculative_config.eagle3_one_model",), EAGLE3_WORKERS, type="bool (default true)",
              versions=("1.2",), required=True, when=("tree",),
              note="false with eagle_choices: the one-model Eagle3OneModelSpecMetadata sets is_spec_dec_tree = False "
              "(drafts a chain); the two-model Eagle3SpecMetadata builds the tree from eagle_choices")
    + rows_of("llmapi.option", ("speculative_config.eagle3_layers_to_capture",), EAGLE_CFG, type="set[int]",
              versions=("1.2",), note="1.1: not proven (absent in the mid-2025 file, present after the 1.1 branch); "
              "there we write nothing and only the default layers are possible")
    + rows_of("llmapi.option", ("speculative_config.eagle_choices", "speculative_config.max_total_draft_tokens"),
              EAGLE_CFG, type="list[list[int]] / int", versions=("1.2",), required=True, when=("tree",),
              note="1.1's PyTorch attention backend refuses trees ('only chained/linear tree is supported now')")
    + rows_of("llmapi.model_yaml", ("model", "backend"), LLM_ARGS, type="path / 'pytorch'", required=True,
              versions=ENGINE_FLOW)
    + rows_of("llmapi.model_yaml", ("triton_config", "triton_config.max_batch_size", "triton_config.decoupled"),
              OURS_LLMAPI_MODEL, type="dict / int / bool", versions=ENGINE_FLOW,
              note="popped before LLM(**args), as upstream's all_models/llmapi/tensorrt_llm/1/model.yaml does")
)

ROWS: list[Row] = only(_BUILD, ENGINE_FLOW) + _SERVE + _LLMAPI
