"""Cancelling a request to an ENSEMBLE: Triton <= r26.02 does not forward a gRPC cancel into an ensemble and leaks
the ensemble request (docs/triton.md, "Cancellation"), so the asyncio client (clients/aio.py, which the sync
client wraps) sends tensorrtllm_backend's stop request to the ensemble's LLM model instead and reads the stream to its
final response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clients import schema as sch
from clients.schema import Schema
from clients.transport import GenerationError, channel_args, status_of

# Cancelling an ensemble request: the stop request's own deadline; how long to wait for the stream's final response
# before sending the stop again (a stop that arrives while the request is still in preprocessing, before the LLM
# model has it, finds nothing to stop); how long in all before giving up with CANCEL_TIMEOUT.
STOP_REQUEST_TIMEOUT_S = 10.0
STOP_RESEND_S = 0.5
DRAIN_TIMEOUT_S = 15.0
CANCEL_TIMEOUT = "CANCEL_TIMEOUT"

# tensorrtllm_backend's stop request: a request to the LLM model with input `stop`=true and the id of the request
# to stop (upstream inflight_batcher_llm/client/inflight_batcher_llm_client.py prepare_stop_signals; our BLS model
# sends the same, triton_repo/models/llm_io.py stop_request_tensors). Triton still checks the LLM model's required
# inputs (triton_repo/contract.py LLM_INPUTS: input_ids, input_lengths, request_output_len), so they are sent as
# placeholders the model never reads. Shapes carry the batch dimension: every LLM model batches (max_batch_size > 0).
STOP_INPUT = "stop"
STOP_REQUEST_TENSORS: tuple[tuple[str, str, bool | int], ...] = (
    ("input_ids", "INT32", 1), ("input_lengths", "INT32", 1), ("request_output_len", "INT32", 1),
    (STOP_INPUT, "BOOL", True),
)


def stop_request_inputs() -> list[grpcclient.InferInput]:
    out = []
    for name, datatype, value in STOP_REQUEST_TENSORS:
        t = grpcclient.InferInput(name, [1, 1], datatype)
        t.set_data_from_numpy(np.array([[value]], dtype=np.bool_ if datatype == "BOOL" else np.int32))
        out.append(t)
    return out


def _input_names(cfg: Mapping[str, Any]) -> set[str]:
    return {e["name"] for e in cfg.get("input", [])}  # proto3 JSON omits an empty list


def resolve_stop_model(schema: Schema, get_config: sch.ConfigGetter) -> str | None:
    """The LLM model that a cancelled request to `schema.model` is stopped through, or None when `schema.model` is
    no ensemble (a plain gRPC cancel reaches it). A rendered repository's client.json names it (`llm_model`, next to
    the ensemble's `model` and the BLS's `bls_model`); otherwise the served configs tell: the ensemble step whose
    model takes a `stop` input. An ensemble without one cannot be stopped: SchemaError, not a cancel that leaks."""
    extra = schema.extra
    if "llm_model" in extra:
        if schema.model == extra.get("model"):
            return str(extra["llm_model"])
        if schema.model == extra.get("bls_model"):
            return None
    cfg = get_config(schema.model)
    if cfg is None:
        raise sch.SchemaError(f"cannot read the config of model {schema.model!r} to tell how to cancel its requests")
    if cfg.get("platform") != "ensemble":
        return None
    steps = [str(st["model_name"]) for st in cfg.get("ensemble_scheduling", {}).get("step", [])]
    configs = {name: get_config(name) for name in steps}
    stoppable = [name for name, c in configs.items() if c is not None and STOP_INPUT in _input_names(c)]
    if len(stoppable) != 1:
        raise sch.SchemaError(
            f"ensemble {schema.model!r}: {len(stoppable)} of its steps {steps} take a {STOP_INPUT!r} input "
            f"({stoppable}), need exactly one (the LLM model) to stop a cancelled request; Triton does not forward a "
            "plain cancellation into an ensemble (docs/triton.md): call the BLS model to cancel by closing"
        )
    return stoppable[0]


def server_stop_model(url: str, schema: Schema) -> str | None:
    """resolve_stop_model with the configs the server at `url` serves."""
    client = grpcclient.InferenceServerClient(url, channel_args=channel_args())

    def get(name: str) -> Mapping[str, Any] | None:
        try:
            return client.get_model_config(name, as_json=True, client_timeout=STOP_REQUEST_TIMEOUT_S)["config"]
        except InferenceServerException as e:
            err = status_of(e)
            msg = f"reading the config of {name!r} to cancel a request: {err.message}"
            raise GenerationError(err.status, msg) from e

    try:
        return resolve_stop_model(schema, get)
    finally:
        client.close()


def cancel_timeout_error(
    model: str, llm_model: str, request_id: str, stop_error: GenerationError | None
) -> GenerationError:
    why = "" if stop_error is None else f"; last stop request failed: {stop_error}"
    return GenerationError(
        CANCEL_TIMEOUT,
        f"cancelled request {request_id} to {model!r}: its stream did not end within {DRAIN_TIMEOUT_S:g} s of "
        f"sending {llm_model!r} stop requests{why}. The stream was closed; the server may still run the sequence "
        "and hold the ensemble request",
    )
