"""The serving contract, defined once: every tensor the Triton models exchange (name, dtype, dims, optional,
default), for all three LLM backends.

The client-facing side is tensorrtllm_backend's `all_models/inflight_batcher_llm/ensemble/config.pbtxt` (and the
identical `tensorrt_llm_bls/config.pbtxt`): same names, data types and dims, so existing Triton clients,
genai-perf and the upstream benchmark scripts work unchanged. We expose the subset our three backends implement;
any other upstream input (lora_*, prompt tables, guided decoding, penalties...) is not declared, so Triton itself
refuses it with INVALID_ARGUMENT ("unexpected inference input") instead of silently ignoring it.

The internal side mirrors the upstream `preprocessing`, `tensorrt_llm` and `postprocessing` models, so the
`tensorrt_llm` step can be the C++ `tensorrtllm` backend, the LLM-API python model or our reference python model
without touching the other models. Python models read their I/O names from here (`models/*.py` import this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DType = Literal["TYPE_STRING", "TYPE_INT32", "TYPE_INT64", "TYPE_UINT64", "TYPE_FP32", "TYPE_BOOL"]
Default = str | int | float | bool | None

# numpy dtypes used on the wire for each Triton type (tritonclient's InferInput datatype names in comments)
NUMPY_DTYPE: dict[str, str] = {
    "TYPE_STRING": "object",  # BYTES
    "TYPE_INT32": "int32",  # INT32
    "TYPE_INT64": "int64",  # INT64
    "TYPE_UINT64": "uint64",  # UINT64
    "TYPE_FP32": "float32",  # FP32
    "TYPE_BOOL": "bool",  # BOOL
}
WIRE_DTYPE: dict[str, str] = {
    "TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64", "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32",
    "TYPE_BOOL": "BOOL",
}


@dataclass(frozen=True)
class Tensor:
    """One model input or output. `dims` exclude the batch dimension (all models batch: max_batch_size > 0).
    `default` is the value used when an optional input is absent (None = "derived", e.g. end_id from the
    tokenizer); it is documented in client.json."""

    name: str
    dtype: DType
    dims: tuple[int, ...]
    optional: bool = False
    default: Default = None
    description: str = ""


# ---- the client-facing contract (ensemble and tensorrt_llm_bls) ---------------------------------------------------

ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,), description="Prompt text (UTF-8; no chat template is applied)."),
    Tensor(
        "max_tokens",
        "TYPE_INT32",
        (1,),
        description="Tokens to generate; 1 <= max_tokens and prompt tokens + max_tokens <= max_seq_len.",
    ),
    Tensor(
        "stop_words",
        "TYPE_STRING",
        (-1,),
        True,
        None,
        "Strings that end generation (the output ends with the tokens that completed one).",
    ),
    Tensor(
        "exclude_input_in_output",
        "TYPE_BOOL",
        (1,),
        True,
        False,
        "Non-streaming only: drop the prompt from text_output (streaming never repeats it).",
    ),
    Tensor("end_id", "TYPE_INT32", (1,), True, None, "End-of-sequence token id; default: the tokenizer's eos."),
    Tensor("pad_id", "TYPE_INT32", (1,), True, None, "Padding token id; default: the tokenizer's pad (or eos)."),
    Tensor(
        "top_k",
        "TYPE_INT32",
        (1,),
        True,
        0,
        "Top-k sampling; 0 = off. top_k=0 and top_p=0 = greedy (TensorRT-LLM's rule).",
    ),
    Tensor("top_p", "TYPE_FP32", (1,), True, 0.0, "Top-p (nucleus) sampling; 0 = off."),
    Tensor("temperature", "TYPE_FP32", (1,), True, 1.0, "Sampling temperature; 0 = greedy."),
    Tensor("seed", "TYPE_UINT64", (1,), True, 0, "Sampling seed."),
    Tensor("beam_width", "TYPE_INT32", (1,), True, 1, "Only 1 (speculative decoding has no beam search)."),
    Tensor(
        "return_perf_metrics",
        "TYPE_BOOL",
        (1,),
        True,
        False,
        "Also return acceptance_rate, total_accepted_draft_tokens, total_draft_tokens.",
    ),
    Tensor("stream", "TYPE_BOOL", (1,), True, False, "Stream partial text (needs a decoupled repository)."),
)

# The client-facing inputs every request must carry, with what to send. The ensemble and preprocessing configs
# declare them optional and preprocessing refuses a request without one (builders/triton/render.py
# `ensemble_config` says why); client.json and the BLS config keep them required.
REQUIRED_HELP: dict[str, str] = {
    "text_input": "send the prompt text, shape [1, 1] BYTES",
    "max_tokens": "send the number of tokens to generate, shape [1, 1] INT32",
}

PERF_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("acceptance_rate", "TYPE_FP32", (1,), description="total_accepted_draft_tokens / total_draft_tokens."),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,), description="Draft tokens the target accepted."),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,), description="Draft tokens counted per step; what a step counts "
           "depends on the backend (client.json `perf_semantics`)."),
)
# What the perf outputs count, per engine.backend (written to client.json; docs/deploy.md explains the difference).
PERF_SEMANTICS: dict[str, str] = {
    "tensorrt": "TensorRT-LLM's C++ runtime (batch_manager/llmRequest.h updateNumTokensPerIteration): per generation "
    "step, accepted += new tokens - 1 and drafted += min(draft tokens of the request, max path length = "
    "num_eagle_layers); acceptance_rate = accepted / drafted. A tree of N > depth nodes counts depth per step, so "
    "total_draft_tokens is steps x depth, not tree nodes.",
    "pytorch": "TensorRT-LLM's LLM API (RequestOutput request_perf_metrics.speculative_decoding), as the PyTorch "
    "backend fills it.",
    "reference": "this project's reference engine: drafted = draft tree nodes proposed per step (root excluded), "
    "accepted = draft tokens kept; acceptance_rate = accepted / drafted.",
}
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,), description="Generated text (the new chunk when streaming)."),
    *PERF_OUTPUTS,
)

# ---- internal models (upstream preprocessing / tensorrt_llm / postprocessing I/O) ---------------------------------

PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("QUERY", "TYPE_STRING", (1,)),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), True),
    Tensor("END_ID", "TYPE_INT32", (1,), True),
    Tensor("PAD_ID", "TYPE_INT32", (1,), True),
    # The sampling inputs are seen by preprocessing too, so a backend that decodes greedily only (engine-flow
    # EAGLE) refuses a sampling request with INVALID_ARGUMENT and the reason instead of ignoring it.
    Tensor("TEMPERATURE", "TYPE_FP32", (1,), True, 1.0),
    Tensor("RUNTIME_TOP_K", "TYPE_INT32", (1,), True, 0),
    Tensor("RUNTIME_TOP_P", "TYPE_FP32", (1,), True, 0.0),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)),
    Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("OUT_END_ID", "TYPE_INT32", (1,)),
    Tensor("OUT_PAD_ID", "TYPE_INT32", (1,)),
)

LLM_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_lengths", "TYPE_INT32", (1,)),
    Tensor("request_output_len", "TYPE_INT32", (1,)),
    Tensor("end_id", "TYPE_INT32", (1,), True),
    Tensor("pad_id", "TYPE_INT32", (1,), True),
    Tensor("stop_words_list", "TYPE_INT32", (2, -1), True),
    Tensor("beam_width", "TYPE_INT32", (1,), True, 1),
    Tensor("temperature", "TYPE_FP32", (1,), True, 1.0),
    Tensor("runtime_top_k", "TYPE_INT32", (1,), True, 0),
    Tensor("runtime_top_p", "TYPE_FP32", (1,), True, 0.0),
    Tensor("seed", "TYPE_UINT64", (1,), True, 0),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), True, False),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True, False),
    Tensor("streaming", "TYPE_BOOL", (1,), True, False),
    # upstream `stop`: a request with stop=true cancels the in-flight request with the same request id (the BLS
    # model sends it when its client cancels; tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py)
    Tensor("stop", "TYPE_BOOL", (1,), True, False),
)
LLM_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),  # [beam, tokens]
    Tensor("sequence_length", "TYPE_INT32", (-1,)),  # [beam]
    *PERF_OUTPUTS,
)

# The C++ `tensorrtllm` backend (engine.backend tensorrt) only. Its request splitter
# (triton_backend/inflight_batcher_llm/src/utils.cc splitBatchInputsTensors) needs scalar inputs as [batch] and
# ragged inputs allowed, as in upstream's all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt: the renderer
# adds `reshape: { shape: [ ] }` to every dims [1] input and `allow_ragged_batch` to these.
CPP_RAGGED_INPUTS = ("input_ids", "stop_words_list")
# With return_perf_metrics the backend writes all of these (model_instance_state.cc fillTritonResponse); Triton
# refuses an output the config does not declare (core src/infer_response.cc AddOutput -> Model::GetOutput), which
# fails the whole response, so they are declared even though the ensemble passes on only PERF_OUTPUTS.
CPP_EXTRA_PERF_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
)

POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
    Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (Tensor("OUTPUT", "TYPE_STRING", (-1,)),)

# The python LLM model's per-request handle (engine.backend reference / pytorch, streaming): a secret it makes for
# each request and writes on every response; the ensemble hands it to postprocessing only (never an ensemble
# output), which presents it as the stop_key of the `stop` it sends for a streaming client that went away
# (models/stop_relay.py), so a request sent without a stop_key is stopped too, and only that request.
HANDLE_OUTPUT = Tensor("sequence_handle", "TYPE_STRING", (1,))
HANDLE_INPUT = Tensor("SEQUENCE_HANDLE", "TYPE_STRING", (1,), True)
LLM_HANDLE_OUTPUT_MAP = {"sequence_handle": "_SEQUENCE_HANDLE"}
POSTPROCESSING_HANDLE_INPUT_MAP = {"SEQUENCE_HANDLE": "_SEQUENCE_HANDLE"}

# ---- the ensemble wiring: (step model role, {step tensor: ensemble tensor}) ---------------------------------------
# Internal tensors start with "_" as upstream. Roles are resolved to model names from TritonConfig by the renderer.

PREPROCESSING_INPUT_MAP = {
    "QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "STOP_WORDS_DICT": "stop_words",
    "END_ID": "end_id", "PAD_ID": "pad_id", "TEMPERATURE": "temperature", "RUNTIME_TOP_K": "top_k",
    "RUNTIME_TOP_P": "top_p",
}
PREPROCESSING_OUTPUT_MAP = {
    "INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
    "STOP_WORDS_IDS": "_STOP_WORDS_IDS", "OUT_END_ID": "_PREPROCESSOR_END_ID", "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
}
LLM_INPUT_MAP = {
    "input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN", "request_output_len": "_REQUEST_OUTPUT_LEN",
    "end_id": "_PREPROCESSOR_END_ID", "pad_id": "_PREPROCESSOR_PAD_ID", "stop_words_list": "_STOP_WORDS_IDS",
    "beam_width": "beam_width", "temperature": "temperature", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
    "seed": "seed", "return_perf_metrics": "return_perf_metrics",
    "exclude_input_in_output": "exclude_input_in_output", "streaming": "stream",
}
LLM_OUTPUT_MAP = {
    "output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
    **{t.name: t.name for t in PERF_OUTPUTS},
}
POSTPROCESSING_INPUT_MAP = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
POSTPROCESSING_OUTPUT_MAP = {"OUTPUT": "text_output"}

# The perf bridge (engine.backend tensorrt, models/perf_bridge.py): the C++ backend exports no speculative metric,
# so preprocessing asks the LLM model for its perf outputs on every request and the ensemble hands the running
# totals to postprocessing, which counts them. The reference model, rendered wired the same way, writes them on
# every response as the C++ backend does (its `perf_every_response` parameter).
ARRIVAL_TIME_OUTPUT = Tensor("arrival_time_ns", "TYPE_INT64", (1,))
PREPROCESSING_PERF_OUTPUT = Tensor("OUT_RETURN_PERF_METRICS", "TYPE_BOOL", (1,))
PREPROCESSING_PERF_OUTPUT_MAP = {"OUT_RETURN_PERF_METRICS": "_RETURN_PERF_METRICS"}
# The client's flag still goes somewhere: Triton refuses an ensemble input no step takes ("ensemble input ... is not
# used", core r24.10 ensemble_utils.cc). Preprocessing takes it and answers true regardless.
PREPROCESSING_PERF_INPUT = Tensor("RETURN_PERF_METRICS", "TYPE_BOOL", (1,), True, False)
PREPROCESSING_PERF_INPUT_MAP = {"RETURN_PERF_METRICS": "return_perf_metrics"}
LLM_PERF_INPUT_MAP = {"return_perf_metrics": "_RETURN_PERF_METRICS"}  # replaces the client's flag
LLM_PERF_OUTPUT_MAP = {"arrival_time_ns": "_ARRIVAL_TIME_NS"}
POSTPROCESSING_PERF_INPUTS: tuple[Tensor, ...] = (
    Tensor("TOTAL_ACCEPTED_DRAFT_TOKENS", "TYPE_INT32", (1,), True),
    Tensor("TOTAL_DRAFT_TOKENS", "TYPE_INT32", (1,), True),
    Tensor("ARRIVAL_TIME_NS", "TYPE_INT64", (1,), True),
)
POSTPROCESSING_PERF_INPUT_MAP = {"TOTAL_ACCEPTED_DRAFT_TOKENS": "total_accepted_draft_tokens",
                                 "TOTAL_DRAFT_TOKENS": "total_draft_tokens", "ARRIVAL_TIME_NS": "_ARRIVAL_TIME_NS"}

# Tokenizer behaviour shared by preprocessing, the BLS model and the tests (upstream preprocessing default).
ADD_SPECIAL_TOKENS = True
SKIP_SPECIAL_TOKENS = True

# Request ids the BLS model gives its LLM requests; the LLM model answers these differently when it ends one with an
# error (models/reference_llm.py `_finish`).
BLS_REQUEST_ID_PREFIX = "bls-"

# Error-code names of the python backend's pb_utils.TritonError (what clients see as gRPC status).
INVALID_ARGUMENT = "INVALID_ARG"
UNAVAILABLE = "UNAVAILABLE"


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {t.name: t for t in tensors}


def check_wiring() -> list[str]:
    """Every map key/value names a declared tensor (the contract is self-consistent); returns problems."""
    problems: list[str] = []
    ens_in, ens_out = by_name(ENSEMBLE_INPUTS), by_name(ENSEMBLE_OUTPUTS)
    internal = set(PREPROCESSING_OUTPUT_MAP.values()) | {"_TOKENS_BATCH", "_SEQUENCE_LENGTH",
                                                        "_RETURN_PERF_METRICS", "_ARRIVAL_TIME_NS", "_SEQUENCE_HANDLE"}
    for step, ins, outs, imap, omap in (
        (
            "preprocessing",
            PREPROCESSING_INPUTS,
            PREPROCESSING_OUTPUTS,
            PREPROCESSING_INPUT_MAP,
            PREPROCESSING_OUTPUT_MAP,
        ),
        ("llm", LLM_INPUTS, LLM_OUTPUTS, LLM_INPUT_MAP, LLM_OUTPUT_MAP),
        ("postprocessing", POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS, POSTPROCESSING_INPUT_MAP,
         POSTPROCESSING_OUTPUT_MAP),
        # the perf bridge's additions (builders/triton/render.py ensemble_config, bridged)
        ("bridged preprocessing", PREPROCESSING_INPUTS + (PREPROCESSING_PERF_INPUT,),
         PREPROCESSING_OUTPUTS + (PREPROCESSING_PERF_OUTPUT,), PREPROCESSING_PERF_INPUT_MAP,
         PREPROCESSING_PERF_OUTPUT_MAP),
        ("bridged llm", LLM_INPUTS, LLM_OUTPUTS + CPP_EXTRA_PERF_OUTPUTS, LLM_PERF_INPUT_MAP, LLM_PERF_OUTPUT_MAP),
        ("bridged postprocessing", POSTPROCESSING_INPUTS + POSTPROCESSING_PERF_INPUTS, POSTPROCESSING_OUTPUTS,
         POSTPROCESSING_PERF_INPUT_MAP, {}),
        # the per-request handle (builders/triton/render.py handle_wired)
        ("handled llm", LLM_INPUTS, LLM_OUTPUTS + (HANDLE_OUTPUT,), {}, LLM_HANDLE_OUTPUT_MAP),
        ("handled postprocessing", POSTPROCESSING_INPUTS + (HANDLE_INPUT,), POSTPROCESSING_OUTPUTS,
         POSTPROCESSING_HANDLE_INPUT_MAP, {}),
    ):
        for k, v in imap.items():
            if k not in by_name(ins):
                problems.append(f"{step}: input map key {k} is not an input of the step")
            if v not in ens_in and v not in internal and v not in ens_out:  # an output an earlier step produced
                problems.append(f"{step}: input map value {v} is neither an ensemble input nor internal")
        for k, v in omap.items():
            if k not in by_name(outs):
                problems.append(f"{step}: output map key {k} is not an output of the step")
            if not v.startswith("_") and v not in ens_out:
                problems.append(f"{step}: output map value {v} is not an ensemble output")
    return problems
