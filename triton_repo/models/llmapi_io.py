"""Request parsing and responses of the llmapi-layout mirror (models/llmapi_reference.py): the inputs of
triton_repo/llmapi_contract.py in, upstream's response shapes out. Imported inside the python-backend stub (`pb_utils`
is passed in), so it also imports in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.types import Limits, SamplingParams
from triton_repo import contract as C
from triton_repo.models import bounds
from triton_repo.models.common import RequestError, max_text_bytes
from triton_repo.models.llm_io import sampling_from

__all__ = ["RequestError", "Parsed", "parse", "flag", "error", "text_response", "final_response", "check_tree"]


@dataclass
class Parsed:
    request: Any  # engines.api.GenerationRequest
    streaming: bool
    perf: bool
    finish_reason: bool
    stop_reason: bool
    generated: list[int] = field(default_factory=list)  # ids accepted so far (streaming)
    sender: Any = None
    capture: bool = False  # recorded in the capture store when it finishes (models/capture.py)


def _value(pb_utils: Any, request: Any, name: str) -> Any:
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return None
    arr = t.as_numpy()
    if arr.size != 1:
        raise RequestError(f"input {name} has {arr.size} values; send one, shape [1]")
    return arr.reshape(-1)[0].item()


def _array(pb_utils: Any, request: Any, name: str) -> Any:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def flag(pb_utils: Any, request: Any, name: str) -> bool:
    return bool(_value(pb_utils, request, name))


_TEXT_BOUNDS: dict[tuple[int, int], tuple[int, int]] = {}


def text_bound(tokenizer: Any, max_input_len: int) -> tuple[int, int]:
    """common.max_text_bytes, computed once per tokenizer (it walks the vocabulary)."""
    key = (id(tokenizer), max_input_len)
    if key not in _TEXT_BOUNDS:
        _TEXT_BOUNDS[key] = max_text_bytes(tokenizer, max_input_len)
    return _TEXT_BOUNDS[key]


def _prompt(pb_utils: Any, request: Any, tokenizer: Any, max_input_len: int) -> str:
    """Element 0 of text_input, as upstream, but only when it is the only one (upstream answers the first of 64
    prompts and drops the rest silently), its bytes bounded before it is decoded or tokenized."""
    t = pb_utils.get_input_tensor_by_name(request, "text_input")
    if t is None:
        raise RequestError("text_input is missing from the request")
    arr = t.as_numpy()
    if arr.ndim > 1:
        raise RequestError("The current implementation only supports text_input being a 1D tensor.")
    if arr.size != 1:
        raise RequestError(f"text_input holds {arr.size} prompts; this model answers one prompt per request: send "
                           "shape [1] (concurrent requests are batched by the server)")
    limit, per_token = text_bound(tokenizer, max_input_len)
    return bounds.text(arr[0], "text_input", limit, f"max_input_len {max_input_len} x {per_token} bytes (the "
                                                    "longest token)")


def _refuse_unsupported(pb_utils: Any, request: Any) -> None:
    best_of = _value(pb_utils, request, "sampling_param_best_of")
    if best_of not in (None, 1):
        raise RequestError(f"sampling_param_best_of={best_of}: the reference engine returns one sequence; send 1")
    # Penalties and cumulative logprobs: refused before parsing, by the rule upstream's model is held to as well
    # (models/llmapi_refusals.py refuse_speculative_sampling).


def _sampling(pb_utils: Any, request: Any) -> SamplingParams:
    """No sampling input = greedy (TensorRT-LLM's default); else TensorRT-LLM's greedy rule (llm_io.sampling_from)."""
    t, k, p = (_value(pb_utils, request, f"sampling_param_{n}") for n in ("temperature", "top_k", "top_p"))
    if t is None and k is None and p is None:
        return SamplingParams(temperature=0.0)
    return sampling_from(1.0 if t is None else float(t), int(k or 0), float(p or 0.0),
                         int(_value(pb_utils, request, "sampling_param_seed") or 0))


def parse(pb_utils: Any, request: Any, tokenizer: Any, limits: Limits, default_max_tokens: int) -> Parsed:
    from engines.api import GenerationRequest
    from core.stops import stop_token_ids

    _refuse_unsupported(pb_utils, request)
    stops = bounds.stop_strings(_array(pb_utils, request, "sampling_param_stop"), "sampling_param_stop")
    ids = [int(i) for i in tokenizer.encode(_prompt(pb_utils, request, tokenizer, limits.max_input_len))]
    n_out = _value(pb_utils, request, "sampling_param_max_tokens")
    n_out = default_max_tokens if n_out is None else int(n_out)
    if problem := limits.length_problem(len(ids), n_out, "sampling_param_max_tokens"):
        raise RequestError(problem)
    req = GenerationRequest(prompt_ids=ids, max_new_tokens=n_out, sampling=_sampling(pb_utils, request),
                            stop_token_ids=stop_token_ids(tokenizer), stop_strings=[s for s in stops if s])
    return Parsed(
        req,
        flag(pb_utils, request, "streaming"),
        flag(pb_utils, request, "sampling_param_return_perf_metrics"),
        flag(pb_utils, request, "return_finish_reason"),
        flag(pb_utils, request, "return_stop_reason"),
    )


def error(pb_utils: Any, message: str, code: str = C.INVALID_ARGUMENT) -> Any:
    """As upstream: the error plus text_output ["N/A"] (CANCELLED: the error alone)."""
    err = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    if code == "CANCELLED":
        return pb_utils.InferenceResponse(output_tensors=[], error=err)
    return pb_utils.InferenceResponse(output_tensors=[_strings(pb_utils, "text_output", ["N/A"])], error=err)


def _strings(pb_utils: Any, name: str, values: list[Any]) -> Any:
    return pb_utils.Tensor(name, np.asarray([str(v).encode("utf-8") for v in values], dtype=np.object_))


def text_response(pb_utils: Any, tokenizer: Any, ids: list[int], extra: list[Any] | None = None) -> Any:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return pb_utils.InferenceResponse(output_tensors=[_strings(pb_utils, "text_output", [text])] + (extra or []))


def final_response(pb_utils: Any, tokenizer: Any, p: Parsed, result: Any) -> Any:
    extra = []
    if p.finish_reason:
        extra.append(
            _strings(pb_utils, "finish_reason", [{"eos": "stop"}.get(result.finish_reason, result.finish_reason)])
        )
    if p.stop_reason:
        extra.append(
            _strings(pb_utils, "stop_reason", [result.stop_reason if hasattr(result, "stop_reason") else None])
        )
    if p.perf:
        st = result.stats
        rate = st.accepted_draft_tokens / st.draft_tokens if st.draft_tokens else 0.0
        # upstream sends these in the dtype of text_output (strings), whatever the config declares
        extra += [_strings(pb_utils, "acceptance_rate", [rate]),
                  _strings(pb_utils, "total_accepted_draft_tokens", [st.accepted_draft_tokens]),
                  _strings(pb_utils, "total_draft_tokens", [st.draft_tokens])]
    return text_response(pb_utils, tokenizer, list(result.output_ids), extra)


def check_tree(spec: dict[str, Any], tree: Any) -> None:
    """model.yaml's speculative_config and the reference engine's tree come from the same config: refuse to serve a
    repository where they disagree (rendered from another build)."""
    if tree is None:
        raise ValueError("the reference build has no draft tree; rebuild it with a draft head")
    want = {"max_draft_len": tree.depth}
    if getattr(tree, "top_k", 1) > 1:  # a top_k 1 dynamic tree is written as a chain
        want.update(use_dynamic_tree=True, dynamic_tree_max_topK=tree.top_k, max_total_draft_tokens=tree.size)
    got = {k: spec.get(k) for k in want}
    if got != want:
        raise ValueError(f"model.yaml speculative_config {got} does not describe the reference engine's tree {want}; "
                         "re-render the repository from the build's config")


LOAD_AWARE_KEYS = ("draft_len_schedule", "max_concurrency", "acceptance_rate_window_size", "acceptance_rate_threshold")


def check_policy(spec: dict[str, Any], policy: Any) -> None:
    """model.yaml's load-aware speculation keys and the reference engine's policy (reference.json) come from the same
    config: refuse a repository where they disagree, so the mirror drafts what TensorRT-LLM would."""
    want: dict[str, Any] = dict.fromkeys(LOAD_AWARE_KEYS)
    if policy is not None:
        window = policy.acceptance_rate_window_size or None
        want.update(draft_len_schedule=policy.draft_len_schedule, max_concurrency=policy.max_concurrency,
                    acceptance_rate_window_size=window,
                    acceptance_rate_threshold=policy.acceptance_rate_threshold if window else None)
    got = {k: spec.get(k) for k in LOAD_AWARE_KEYS}
    if isinstance(got["draft_len_schedule"], dict):
        got["draft_len_schedule"] = {int(k): int(v) for k, v in got["draft_len_schedule"].items()}
    if got != want:
        raise ValueError(f"model.yaml speculative_config {got} does not match the reference engine's load-aware "
                         f"speculation {want}; re-render the repository from the build's config")

