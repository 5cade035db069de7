"""Requests to the tiny reference build's Triton server over gRPC (shared by the server test modules): inputs in the
ensemble's wire types, one request's whole stream, and the bad requests every model must refuse by name."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as tritonclient_grpc

from testkit.triton_build import MAX_INPUT, MAX_SEQ

PROMPT = "The quick brown fox"


def infer_input(name: str, value: Any, datatype: str) -> Any:
    np_type = {"BYTES": object, "INT32": np.int32, "BOOL": bool, "FP32": np.float32, "UINT64": np.uint64}[datatype]
    arr = np.array([[value]], dtype=np_type)
    i = tritonclient_grpc.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr)
    return i


def inputs(text: str | bytes, max_tokens: int, **extra: tuple[Any, str]) -> list[Any]:
    ins = [infer_input("text_input", text, "BYTES"), infer_input("max_tokens", max_tokens, "INT32")]
    ins += [infer_input(k, v, dt) for k, (v, dt) in extra.items()]
    return ins


def stream_call(
    client: Any, model: str, ins: list[Any], cancel_after: int | None = None, timeout: float = 120,
    headers: dict[str, str] | None = None, request_id: str = "", parameters: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """All responses of one request on a gRPC stream, as {output: array}; raises the first error. `parameters`: the
    request's parameters (e.g. the capture opt-out)."""
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)), headers=headers)
    try:
        client.async_stream_infer(model, ins, enable_empty_final_response=True, request_id=request_id,
                                  parameters=parameters)
        out: list[dict[str, Any]] = []
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                raise error
            resp = result.get_response()
            if resp.outputs:
                out.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
            if cancel_after is not None and len(out) >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return out
            if resp.parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()


def text_of(responses: list[dict[str, Any]]) -> str:
    return "".join(r["text_output"].reshape(-1)[0].decode("utf-8") for r in responses)


BAD_REQUESTS = [
    ("", 4, {}, "text_input is empty"),
    (b"\xff\xfe bad", 4, {}, "not valid UTF-8"),
    (PROMPT, 0, {}, "max_tokens=0 must be >= 1"),
    (PROMPT, -3, {}, "max_tokens=-3 must be >= 1"),
    (PROMPT, MAX_SEQ, {}, f"exceeds engine.max_seq_len={MAX_SEQ}; lower max_tokens to at most"),
    (
        "fox " * 100,
        4,
        {},
        f"exceeds engine.max_input_len={MAX_INPUT}; shorten it",
    ),  # under the byte bound, over the token bound
    (PROMPT, 4, {"beam_width": (2, "INT32")}, "beam_width=2: only 1 is supported"),
    (PROMPT, 4, {"top_p": (1.5, "FP32")}, "top_p=1.5 must be in (0, 1]"),
    (PROMPT, 4, {"lora_task_id": (1, "UINT64")}, "unexpected inference input 'lora_task_id'"),
]
