"""What the current line's llmapi model (models/llmapi_bridge.py, engine.backend pytorch) hands to the capture store:
the prompt's and the output's token ids of a finished request, from TensorRT-LLM's `RequestOutput`
(`prompt_token_ids`, `outputs[0].token_ids`, `outputs[0].finish_reason`: tensorrt_llm/executor/result.py) and the
sampling parameters upstream's helpers.py read from the request (`get_sampling_params_from_request`: temperature,
top_k, top_p, seed, max_tokens; absent = not given). The store, the opt-out, the sample rate and the bounds are
models/capture.py's, as for the reference engine's models. Upstream reports no per-request acceptance for this
backend, so the record's `acceptance` is null: the refresh recomputes the target's features from the tokens
(adaptive/dataset.py) and needs neither.

Pure functions of plain objects: tested without a server (tests/test_capture_llmapi.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from triton_repo.models import capture

DEFAULT_MAX_TOKENS = 32  # tensorrt_llm SamplingParams.max_tokens default (llmapi_reference.py DEFAULT_MAX_TOKENS)
_ZERO = SimpleNamespace(target_forwards=0, accepted_draft_tokens=0, draft_tokens=0, acceptance_by_depth=[])


def sampling_of(params: dict[str, Any]) -> SimpleNamespace:
    """The request's sampling parameters as the store records them; none given = greedy (as the mirror serves)."""
    def num(key: str, default: float) -> float:
        v = params.get(key)
        return default if v is None else float(v)

    seed = params.get("seed")
    return SimpleNamespace(temperature=num("temperature", 0.0), top_k=int(num("top_k", 0)), top_p=num("top_p", 1.0),
                           seed=None if seed is None else int(seed))


def record_of(request_output: Any, params: dict[str, Any], version: str) -> dict[str, Any] | None:
    """The store's record of one finished request, or None when it ended otherwise (cancelled, an error, no
    output tokens: the refresh learns only from what the target finished)."""
    if not getattr(request_output, "finished", False) or not request_output.outputs:
        return None
    out = request_output.outputs[0]
    reason = str(getattr(out, "finish_reason", None) or "")
    if reason not in ("stop", "length") or not out.token_ids:
        return None
    rec = capture.record(list(request_output.prompt_token_ids), list(out.token_ids), sampling_of(params),
                         int(params.get("max_tokens") or DEFAULT_MAX_TOKENS), reason, _ZERO, version)
    rec["acceptance"] = None  # not reported per request by this backend (module doc)
    return rec
