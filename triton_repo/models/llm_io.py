"""The `tensorrt_llm` model's request parsing and responses (contract.LLM_INPUTS / LLM_OUTPUTS), shared by the
reference and LLM-API python models. Parsing raises RequestError (INVALID_ARGUMENT) naming the input and the fix.

Sampling follows TensorRT-LLM's rules: temperature 0, top_k 1, or top_k 0 with top_p 0 (both "off") = greedy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.types import Limits, SamplingParams
from triton_repo import contract as C
from triton_repo.models import bounds
from triton_repo.models.common import RequestError, scalar, tensor

LLM_IN = C.by_name(C.LLM_INPUTS)


@dataclass
class Parsed:
    prompt_ids: list[int]
    max_new_tokens: int
    end_id: int
    stop_strings: list[str]
    sampling: SamplingParams
    streaming: bool
    exclude_input: bool
    perf: bool
    request: Any = None  # the engine's request object (engines.api.GenerationRequest for the reference engine)
    arrival_ns: int | None = None  # set at admission when the perf outputs carry arrival_time_ns (perf_bridge.py)
    capture: bool = False  # recorded in the capture store when it finishes (models/capture.py)


def sampling_from(temperature: float, top_k: int, top_p: float, seed: int) -> SamplingParams:
    """TensorRT-LLM's wire conventions -> the engine's SamplingParams, whose check is the one validation (its
    messages are the ones reported): top_p 0 = off (1.0); temperature 0, top_k 1, or top_k 0 with top_p 0 = greedy
    (temperature 0; top_k and top_p kept for a backend that reads them)."""
    off = top_p == 0.0
    try:
        s = SamplingParams(temperature=temperature, top_k=top_k, top_p=1.0 if off else top_p, seed=seed)
    except ValueError as e:
        raise RequestError(str(e)) from None
    if s.greedy or top_k == 1 or (top_k == 0 and off):
        return SamplingParams(temperature=0.0, top_k=s.top_k, top_p=s.top_p, seed=s.seed)
    return s


def parse_request(pb_utils: Any, request: Any, limits: Limits, vocab_size: int | None, tokenizer: Any,
                  decoupled: bool) -> Parsed:
    """`vocab_size` None: the engine checks token ids itself (the LLM API refuses ids >= its vocabulary)."""
    ids = tensor(pb_utils, request, "input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[0] != 1:
        shape = None if ids is None else list(ids.shape)
        raise RequestError(f"input_ids shape {shape}: send one prompt per request, shape [1, n] (concurrent "
                           "requests are batched by the server)")
    if ids.shape[1] > limits.max_input_len:  # before anything is copied out of it
        raise RequestError(f"input_ids holds {ids.shape[1]} ids > max_input_len={limits.max_input_len}; shorten it")
    n_in = int(scalar(pb_utils, request, LLM_IN["input_lengths"]))
    if not 1 <= n_in <= ids.shape[1]:
        raise RequestError(f"input_lengths={n_in} must be in 1..{ids.shape[1]} (the input_ids given)")
    prompt = [int(x) for x in ids[0, :n_in]]
    vocab = vocab_size if vocab_size is not None else len(tokenizer)
    check_token_ids(prompt, vocab_size)
    n_out = int(scalar(pb_utils, request, LLM_IN["request_output_len"]))
    if problem := limits.length_problem(n_in, n_out, "request_output_len (max_tokens)"):
        raise RequestError(problem)
    beam = int(scalar(pb_utils, request, LLM_IN["beam_width"]))
    if beam != 1:
        raise RequestError(f"beam_width={beam}: only 1 is supported (speculative decoding has no beam search)")
    streaming = bool(scalar(pb_utils, request, LLM_IN["streaming"]))
    if streaming and not decoupled:
        raise RequestError("stream=true but this repository is not decoupled (rendered with triton.streaming="
                           "false); send stream=false or re-render with triton.streaming=true")
    end_id = scalar(pb_utils, request, LLM_IN["end_id"])
    end_id = tokenizer.eos_token_id if end_id is None else bounds.token_id(end_id, "end_id", vocab, allow_none_id=True)
    pad_id = scalar(pb_utils, request, LLM_IN["pad_id"])
    if pad_id is not None:
        bounds.token_id(pad_id, "pad_id", vocab)
    stop = tensor(pb_utils, request, "stop_words_list")
    words = [] if stop is None else bounds.word_ids(stop, "stop_words_list", vocab)
    stop_strings = [tokenizer.decode(w) for w in words]
    sampling = sampling_from(
        float(scalar(pb_utils, request, LLM_IN["temperature"])),
        int(scalar(pb_utils, request, LLM_IN["runtime_top_k"])),
        float(scalar(pb_utils, request, LLM_IN["runtime_top_p"])),
        int(scalar(pb_utils, request, LLM_IN["seed"])),
    )
    parsed = Parsed(
        prompt_ids=prompt, max_new_tokens=n_out, end_id=int(end_id), stop_strings=[s for s in stop_strings if s],
        sampling=sampling, streaming=streaming,
        exclude_input=bool(scalar(pb_utils, request, LLM_IN["exclude_input_in_output"])),
        perf=bool(scalar(pb_utils, request, LLM_IN["return_perf_metrics"])),
    )
    parsed.request = reference_request(parsed)
    return parsed


def check_token_ids(prompt: list[int], vocab_size: int | None) -> None:
    """Refuse ids outside the vocabulary before the request joins a batch (inside a batched forward they would fail
    the whole step)."""
    if vocab_size is None:
        return
    for pos, t in enumerate(prompt):
        if not 0 <= t < vocab_size:
            raise RequestError(f"input_ids[{pos}]={t} is out of range: token ids must be in [0, {vocab_size}) "
                               "(the model's vocabulary)")


def is_stop_request(pb_utils: Any, request: Any) -> bool:
    return bool(scalar(pb_utils, request, LLM_IN["stop"]))


def stop_request_tensors(pb_utils: Any) -> list[Any]:
    """A `stop` request: the required inputs carry placeholders the model never reads (it only looks up the id)."""
    one = np.ones((1, 1), np.int32)
    return [
        pb_utils.Tensor("input_ids", one), pb_utils.Tensor("input_lengths", one),
        pb_utils.Tensor("request_output_len", one), pb_utils.Tensor("stop", np.ones((1, 1), bool)),
    ]


def reference_request(p: Parsed) -> Any:
    from engines.api import GenerationRequest

    return GenerationRequest(
        prompt_ids=p.prompt_ids, max_new_tokens=p.max_new_tokens, sampling=p.sampling, stop_token_ids=[p.end_id],
        stop_strings=p.stop_strings,
    )


def ids_tensors(pb_utils: Any, ids: list[int], handle: str | None = None) -> list[Any]:
    """`output_ids` and `sequence_length`; `sequence_handle` too when given (contract.HANDLE_OUTPUT)."""
    arr = np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)
    out = [pb_utils.Tensor("output_ids", arr), pb_utils.Tensor("sequence_length", np.array([[len(ids)]], np.int32))]
    if handle is not None:
        out.append(pb_utils.Tensor(C.HANDLE_OUTPUT.name, np.array([[handle.encode("ascii")]], dtype=object)))
    return out


def declares_handle(args: dict[str, Any]) -> bool:
    """Whether the model's config declares the per-request handle output (builders/triton/render.py handle_wired)."""
    import json

    return any(o.get("name") == C.HANDLE_OUTPUT.name for o in json.loads(args["model_config"]).get("output", []))


def perf_tensors(pb_utils: Any, accepted: int, drafted: int, arrival_ns: int | None = None) -> list[Any]:
    """The perf outputs, upstream's names and dtypes ([1, 1] each, as model_instance_state.cc fillTritonResponse
    writes them); `arrival_time_ns` too when given."""
    rate = accepted / drafted if drafted else 0.0
    out = [
        pb_utils.Tensor("acceptance_rate", np.array([[rate]], np.float32)),
        pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], np.int32)),
        pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], np.int32)),
    ]
    if arrival_ns is not None:
        out.append(pb_utils.Tensor("arrival_time_ns", np.array([[arrival_ns]], np.int64)))
    return out


def final_response(pb_utils: Any, p: Parsed, output_ids: list[int], accepted: int, drafted: int) -> Any:
    """Streaming: the chunks went out already, so the final response carries no tokens (only the metrics when
    asked; None = send the FINAL flag alone). Not streaming: all ids (prompt first unless exclude_input)."""
    perf = perf_tensors(pb_utils, accepted, drafted, p.arrival_ns) if p.perf else []
    if p.streaming:
        if not perf:
            return None
        return pb_utils.InferenceResponse(output_tensors=ids_tensors(pb_utils, []) + perf)
    ids = list(output_ids) if p.exclude_input else p.prompt_ids + list(output_ids)
    return pb_utils.InferenceResponse(output_tensors=ids_tensors(pb_utils, ids) + perf)
