"""What every client module shares: request ids, gRPC channel settings and the error type with a countable status
(used by the clients, clients/aio.py, and by the stopping of ensemble requests, clients/cancel.py)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import secrets
import uuid

import grpc
from tritonclient.utils import InferenceServerException

DEFAULT_TIMEOUT_S = 120.0
# Reconnect quickly after a server restart: gRPC's default reconnect backoff grows to 120 s, which would make a
# load test report "UNAVAILABLE" for minutes after the server is back.
RECONNECT_MS = 250
MAX_MESSAGE_BYTES = 2**31 - 1
_ids = itertools.count()


def new_request_id() -> str:
    """A request id unique across processes and clients: `r<n>-<32 hex>` (n counts this process's requests, for
    reading logs; the random part is uuid4's hex). Unique, because the C++ backend's stop request stops every running
    request with its id; our python LLM models also ask for the request's stop key (new_stop_key)."""
    return f"r{next(_ids)}-{uuid.uuid4().hex}"


STOP_KEY = "stop_key"  # request parameter (triton_repo/models/ownership.py STOP_KEY)


def new_stop_key() -> str:
    """The secret a request is sent with and its stop presents (request parameter STOP_KEY): our python LLM models
    stop a request only for a stop with its id and this key, so no other client can stop it, whatever the ids."""
    return secrets.token_hex(16)


def channel_args() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.max_reconnect_backoff_ms", 4 * RECONNECT_MS),
    ]


class GenerationError(RuntimeError):
    """A request that failed; `status` is a gRPC status code name (UNAVAILABLE: refused / server gone,
    DEADLINE_EXCEEDED: the client deadline passed, CANCELLED, ...) or SERVER_ERROR (the model reported an error)."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"[{status}] {message}")


def status_of(err: BaseException) -> GenerationError:
    """Normalise any failure into a GenerationError with a countable status."""
    if isinstance(err, GenerationError):
        return err
    if isinstance(err, grpc.aio.AioRpcError | grpc.RpcError) and hasattr(err, "code"):
        return GenerationError(err.code().name, str(err.details() if hasattr(err, "details") else err))
    if isinstance(err, InferenceServerException):
        status = err.status()
        if status:  # transport errors carry "StatusCode.X"; errors inside a stream response carry none
            return GenerationError(str(status).removeprefix("StatusCode."), err.message())
        return GenerationError("SERVER_ERROR", err.message())
    if isinstance(err, TimeoutError | asyncio.TimeoutError | queue.Empty):  # the sync client's deadline
        return GenerationError("DEADLINE_EXCEEDED", "no response before the client deadline")
    return GenerationError(type(err).__name__.upper(), str(err))
