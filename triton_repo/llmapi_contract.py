"""The `llmapi` layout's one model, `tensorrt_llm`: the inputs and outputs of TensorRT-LLM's
triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt (cited row by row in ledger/llmapi.py).

Text in, text out; the model tokenizes itself. No `max_batch_size` (0: one prompt per request, shapes without a
batch dimension). Served by upstream's model.py on a GPU (engine.backend pytorch) and by the reference engine's
mirror (triton_repo/models/llmapi_reference.py) on CPU; both read the same config.pbtxt and model.yaml.

Upstream's behaviour that clients must know (model.py `_create_response`): a streamed response carries the text
generated SO FAR (RequestOutput.outputs[0].text, cumulative), and the perf outputs are sent as strings (the
text_output dtype) although the config declares numbers.
"""

from __future__ import annotations

from triton_repo.contract import Tensor

MODEL_NAME = "tensorrt_llm"  # upstream's directory and model name (clients call /v2/models/tensorrt_llm)
MODEL_YAML = "model.yaml"  # read by model.py from the version directory (env LLM_CONFIG_PATH overrides)
SAMPLING_PREFIX = "sampling_param_"

INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,), description="The prompt (element 0; no chat template is applied)."),
    Tensor("streaming", "TYPE_BOOL", (1,), True, False, "Stream the text (needs a decoupled repository)."),
    Tensor("sampling_param_best_of", "TYPE_INT32", (1,), True, 1, "Only 1."),
    Tensor("sampling_param_temperature", "TYPE_FP32", (1,), True, None, "Temperature; 0 = greedy."),
    Tensor("sampling_param_top_k", "TYPE_INT32", (1,), True, None, "Top-k; 1 = greedy."),
    Tensor("sampling_param_top_p", "TYPE_FP32", (1,), True, None, "Top-p."),
    Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,), True, None, "Frequency penalty."),
    Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,), True, None, "Presence penalty."),
    Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,), True, None, "Tokens to generate."),
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,), True, None, "Stop strings."),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,), True, None, "Sampling seed."),
    Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), True, False,
           "Drop the prompt from text_output."),
    Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), True, False,
           "Also return the perf outputs (acceptance_rate, total_accepted_draft_tokens, total_draft_tokens, ...)."),
    Tensor("return_finish_reason", "TYPE_BOOL", (1,), True, False, "Also return finish_reason."),
    Tensor("return_stop_reason", "TYPE_BOOL", (1,), True, False, "Also return stop_reason."),
    Tensor("return_cumulative_logprob", "TYPE_BOOL", (1,), True, False, "Also return cumulative_logprob."),
    Tensor("stop", "TYPE_BOOL", (1,), True, False, "Cancel the requests with this request's id."),
)

# Upstream's config.pbtxt also declares LoRA adapter selection (lora_id, lora_name, lora_path: all three together;
# lora_ckpt_source optional, default "hf"; helpers.py get_lora_request_from_request). The reference engine cannot
# honour them, so its repository declares them only to refuse them by name with INVALID_ARGUMENT
# (models/llmapi_refusals.py) instead of Triton's "unexpected inference input". engine.backend pytorch does not
# declare them: our model.yaml writes no `lora_config`, so TensorRT-LLM's LLM has no LoRA; Triton refuses the input.
# `image_url` is declared nowhere (ledger/llmapi.py NOT_DECLARED says why).
LORA_INPUTS: tuple[Tensor, ...] = (
    Tensor("lora_id", "TYPE_UINT64", (1,), True, None, "Refused: no LoRA adapters here."),
    Tensor("lora_name", "TYPE_STRING", (1,), True, None, "Refused: no LoRA adapters here."),
    Tensor("lora_path", "TYPE_STRING", (1,), True, None, "Refused: no LoRA adapters here."),
    Tensor("lora_ckpt_source", "TYPE_STRING", (1,), True, None, "Refused: no LoRA adapters here."),
)

PERF_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)
OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,), description="The text generated so far (cumulative when streaming)."),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("stop_reason", "TYPE_STRING", (-1,)),
    Tensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    *PERF_OUTPUTS,
)
SPEC_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
