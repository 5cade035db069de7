"""LLM clients over Triton's gRPC API that speak the ensemble contract: sync (`tritonclient.grpc`) and asyncio
(`tritonclient.grpc.aio`).

    from clients.client import LLMClient
    with LLMClient("localhost:8001") as c:
        g = c.generate("Hello", max_tokens=32, temperature=0.0)       # -> Generation(text, stats)
        for chunk in c.stream("Hello", max_tokens=32):                # chunks as they arrive
            print(chunk.text, end="", flush=True)

Requests always travel over the bidirectional stream API (start_stream/async_stream_infer, aio stream_infer), as
tensorrtllm_backend's own clients do (inflight_batcher_llm/client/end_to_end_grpc_client.py): a repository whose
LLM model is decoupled (streaming) refuses the unary ModelInfer call, and the stream works for both kinds.
Every request has a deadline; failures raise `GenerationError` carrying a status (gRPC status code name,
DEADLINE_EXCEEDED for the client deadline, or SERVER_ERROR) so callers (the load tester) can count them.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from clients import schema as sch
from clients.schema import Schema

DEFAULT_TIMEOUT_S = 120.0
# Reconnect quickly after a server restart: gRPC's default reconnect backoff grows to 120 s, which would make a
# load test report "UNAVAILABLE" for minutes after the server is back.
RECONNECT_MS = 250
MAX_MESSAGE_BYTES = 2**31 - 1
_ids = itertools.count()


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


@dataclass
class Chunk:
    """One response: its text (the new text when streaming), arrival time (time.perf_counter()) and index."""

    text: str
    time: float
    index: int


@dataclass
class GenerationStats:
    """Timing and speculative-decoding statistics of one request (times are time.perf_counter() seconds)."""

    start: float
    streamed: bool
    first_response: float | None = None
    end: float | None = None
    responses: int = 0
    last_response: float | None = None  # O(1) bookkeeping per response: the reports need first and last only
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_response is None else self.first_response - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class Generation:
    text: str
    stats: GenerationStats


@dataclass(frozen=True)
class Request:
    """A ready-to-send request: tritonclient inputs and requested outputs for one prompt. It only reads its
    inputs when sent, so one Request can be sent any number of times, also concurrently (the load tester does)."""

    model: str
    inputs: list[grpcclient.InferInput]
    outputs: list[grpcclient.InferRequestedOutput]  # empty: all of the model's outputs
    stream: bool
    perf: bool
    request_id: str


def build_request(
    schema: Schema, prompt: str, max_tokens: int, *, stream: bool, perf: bool | None = None, **sampling: Any
) -> Request:
    """Inputs for `prompt` (validated against the schema). `sampling` keys are input names of the model
    (temperature, top_p, top_k, seed, stop_words, end_id, pad_id, ...). `perf=None` asks for speculative stats when
    the model offers them. Non-streamed requests exclude the prompt from the output when the model lets us."""
    if max_tokens < 1:
        raise sch.SchemaError(f"max_tokens={max_tokens}: must be >= 1")
    values: dict[str, Any] = {sch.PROMPT: prompt, sch.MAX_TOKENS: max_tokens}
    schema.require(sch.PROMPT, "the prompt")
    schema.require(sch.MAX_TOKENS, "max_tokens")
    if stream or sch.STREAM in schema.inputs:
        schema.require(sch.STREAM, "streaming")
        values[sch.STREAM] = stream
    if perf is None:
        perf = schema.has_perf_metrics
    if perf:
        schema.require(sch.PERF_FLAG, "speculative-decoding statistics")
        values[sch.PERF_FLAG] = True
    if not stream and "exclude_input_in_output" in schema.inputs:
        values["exclude_input_in_output"] = True
    values.update(sampling)
    arrays = schema.encode(values)
    inputs = []
    for name, arr in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), schema.inputs[name].datatype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    wanted = [sch.TEXT_OUTPUT, *(sch.PERF_OUTPUTS if perf else ())]
    # No requested outputs means every output of the model (triton-inference-server/common
    # protobuf/grpc_service.proto, ModelInferRequest.outputs: "if not specified all outputs produced by the model
    # will be returned"). Naming them costs a protobuf message each on every request, so name them only to ask
    # for fewer than all (the ensemble contract's outputs are exactly text_output + the perf outputs).
    all_outputs = set(wanted) == set(schema.outputs)
    outputs = [] if all_outputs else [grpcclient.InferRequestedOutput(n) for n in wanted]
    return Request(schema.model, inputs, outputs, stream, perf, f"r{next(_ids)}")


def _raw_outputs(result: grpcclient.InferResult) -> dict[str, bytes]:
    """Output name -> raw little-endian bytes of one response (Triton's gRPC server fills raw_output_contents)."""
    resp = result.get_response()
    return {o.name: resp.raw_output_contents[i] for i, o in enumerate(resp.outputs)}


def _bytes_elements(raw: bytes) -> list[bytes]:
    """Elements of a serialized BYTES tensor: each is a 4-byte little-endian length, then that many bytes."""
    out, i = [], 0
    while i + 4 <= len(raw):
        n = int.from_bytes(raw[i : i + 4], "little")
        out.append(raw[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def _text_bytes(result: grpcclient.InferResult) -> bytes:
    """UTF-8 bytes of one response's text_output, undecoded. Reads the raw bytes directly: tritonclient's as_numpy
    builds numpy object arrays and was the largest per-response client cost (scripts/bench_client.py)."""
    resp = result.get_response()
    if resp.raw_output_contents:
        for i, out in enumerate(resp.outputs):  # absent in an empty final response
            if out.name == sch.TEXT_OUTPUT:
                return b"".join(_bytes_elements(resp.raw_output_contents[i]))
        return b""
    arr = result.as_numpy(sch.TEXT_OUTPUT)  # a server that sends typed contents instead of raw bytes
    return b"" if arr is None else b"".join(v for v in arr.reshape(-1))


def decode_text(pieces: list[bytes]) -> str:
    """The text of a request's responses, decoded once: cheaper than decoding every response, and a character
    whose UTF-8 bytes are split across two responses decodes whole instead of as two U+FFFD."""
    return b"".join(pieces).decode("utf-8", errors="replace")


def _note_response(stats: GenerationStats, now: float) -> None:
    if stats.first_response is None:
        stats.first_response = now
    stats.responses += 1
    stats.last_response = now


def _read_response(result: grpcclient.InferResult, stats: GenerationStats, now: float) -> str:
    """Text of one response (for callers that show every chunk); records its arrival in the stats."""
    _note_response(stats, now)
    return _text_bytes(result).decode("utf-8", errors="replace")


def _read_perf(result: grpcclient.InferResult, stats: GenerationStats) -> None:
    """Speculative counters of the request's last response (they are cumulative, so the last one is the total);
    read once per request, not per response. FP32 / INT32 scalars, little-endian (Triton's raw wire format)."""
    if result.get_response().raw_output_contents:
        raw = _raw_outputs(result)
        rate_b, acc_b, drafted_b = (raw.get(n) for n in sch.PERF_OUTPUTS)
        if acc_b is not None and drafted_b is not None:
            stats.accepted_draft_tokens = int.from_bytes(acc_b[:4], "little", signed=True)
            stats.draft_tokens = int.from_bytes(drafted_b[:4], "little", signed=True)
            stats.acceptance_rate = None if rate_b is None else struct.unpack("<f", rate_b[:4])[0]
        return
    rate, acc, drafted = (result.as_numpy(n) for n in sch.PERF_OUTPUTS)
    if acc is not None and drafted is not None:
        stats.accepted_draft_tokens = int(acc.reshape(-1)[0])
        stats.draft_tokens = int(drafted.reshape(-1)[0])
        stats.acceptance_rate = None if rate is None else float(rate.reshape(-1)[0])


# ---- sync ---------------------------------------------------------------------------------------------------------


class LLMClient:
    """Synchronous client (one request at a time over one gRPC stream, reopened after a failure)."""

    def __init__(
        self, url: str, model: str = "ensemble", schema: Schema | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.schema = schema if schema is not None else sch.fetch_schema(url, model)
        self._client = grpcclient.InferenceServerClient(url, channel_args=channel_args())
        self._queue: queue.Queue[tuple[grpcclient.InferResult | None, InferenceServerException | None]] = queue.Queue()
        self._lock = threading.Lock()
        self._stream_open = False

    def _callback(self, result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        self._queue.put((result, error))

    def _ensure_stream(self) -> None:
        if not self._stream_open:
            self._client.start_stream(callback=self._callback, stream_timeout=None)
            self._stream_open = True

    def _reset_stream(self) -> None:
        if self._stream_open:
            try:
                self._client.stop_stream(cancel_requests=True)
            except InferenceServerException:
                pass
            self._stream_open = False
        self._queue = queue.Queue()

    def stream(self, prompt: str, max_tokens: int, *, stream: bool = True, **sampling: Any) -> Iterator[Chunk]:
        """Yield each response as it arrives; the stats of the finished request are in `self.last_stats`."""
        req = build_request(self.schema, prompt, max_tokens, stream=stream, **sampling)
        with self._lock:
            yield from self._run(req)

    def _run(self, req: Request) -> Iterator[Chunk]:
        stats = GenerationStats(start=time.perf_counter(), streamed=req.stream)
        self.last_stats = stats
        deadline = stats.start + self.timeout_s
        try:
            self._ensure_stream()
            self._client.async_stream_infer(
                req.model, req.inputs, outputs=req.outputs, request_id=req.request_id,
                enable_empty_final_response=True,
            )  # fmt: skip
            last: grpcclient.InferResult | None = None
            while True:
                result, error = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                now = time.perf_counter()
                if error is not None:
                    raise error
                assert result is not None
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                if response.outputs:  # the empty final response carries no outputs
                    last = result
                    yield Chunk(_read_response(result, stats, now), now, stats.responses - 1)
                if final:
                    stats.end = now
                    if last is not None and req.perf:
                        _read_perf(last, stats)
                    return
        except (InferenceServerException, grpc.RpcError, queue.Empty) as e:
            self._reset_stream()
            raise status_of(e) from e
        except GeneratorExit:  # the caller stopped iterating mid-request: cancel it, so no stale response remains
            self._reset_stream()
            raise

    def generate(self, prompt: str, max_tokens: int, *, stream: bool = False, **sampling: Any) -> Generation:
        """The whole text and the request's stats."""
        text = "".join(c.text for c in self.stream(prompt, max_tokens, stream=stream, **sampling))
        return Generation(text, self.last_stats)

    def close(self) -> None:
        self._reset_stream()
        self._client.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# ---- asyncio ------------------------------------------------------------------------------------------------------


def stream_headers(grpc_status: bool) -> dict[str, str] | None:
    """Stream headers. grpc_status=True asks Triton (>= 2.49; server src/grpc/stream_infer_handler.cc, header read in
    src/grpc/infer_handler.h ExtractStateFromHeaders) to end a stream whose request failed in a model with that
    error's gRPC status code (INVALID_ARGUMENT, UNAVAILABLE for "server busy", ...) instead of an in-band message
    without one (counted as SERVER_ERROR). The stream closes after the error, so it suits one stream per request
    (AsyncLLMClient). Requests the core refuses before any model runs (an undeclared input) keep the in-band form."""
    return {"triton_grpc_error": "true"} if grpc_status else None


class AsyncLLMClient:
    """asyncio client: every request opens its own gRPC stream on one shared channel, so any number can be in
    flight at once; the server closes a request's stream after its final response. `grpc_status`: see
    `stream_headers`."""

    def __init__(
        self, url: str, schema: Schema, timeout_s: float = DEFAULT_TIMEOUT_S, *, grpc_status: bool = False
    ) -> None:
        self.url = url
        self.schema = schema
        self.timeout_s = timeout_s
        self.headers = stream_headers(grpc_status)
        self._client = aiogrpc.InferenceServerClient(url, channel_args=channel_args())

    @classmethod
    async def connect(cls, url: str, model: str = "ensemble", timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncLLMClient:
        """A client whose schema is read from the server's model config (sch.fetch_schema, off the event loop)."""
        schema = await asyncio.to_thread(sch.fetch_schema, url, model, min(timeout_s, 30.0))
        return cls(url, schema, timeout_s)

    async def stream(
        self, prompt: str, max_tokens: int, *, stream: bool = True, **sampling: Any
    ) -> AsyncIterator[Chunk]:
        req = build_request(self.schema, prompt, max_tokens, stream=stream, **sampling)
        stats = GenerationStats(start=time.perf_counter(), streamed=stream)
        async for chunk in self.run(req, stats):
            yield chunk

    async def run(self, req: Request, stats: GenerationStats) -> AsyncIterator[Chunk]:
        """Send `req` and yield its responses; fills `stats`. Raises GenerationError on any failure."""
        responses = None
        last: grpcclient.InferResult | None = None
        finished = False
        try:
            # gRPC's own deadline on the stream: DEADLINE_EXCEEDED when the request is not done in time
            responses = self._client.stream_infer(
                self._one_request(req), stream_timeout=self.timeout_s, headers=self.headers
            )
            async for result, error in responses:
                now = time.perf_counter()
                if error is not None:
                    raise error
                last = result
                yield Chunk(_read_response(result, stats, now), now, stats.responses - 1)
            finished = True
        except (InferenceServerException, grpc.RpcError) as e:
            raise status_of(e) from e
        finally:  # failed, timed out, cancelled or abandoned: tell the server to stop working on it
            if not finished and responses is not None:
                responses.cancel()
        self._finish(req, stats, last)

    async def complete(self, req: Request, stats: GenerationStats) -> str:
        """Send `req` and return its whole text; fills `stats`. The same exchange as `run` without a generator
        layer and a Chunk per response: the load tester's path, where client CPU per request is the overhead
        scripts/bench_client.py measures. Per response it only keeps the raw text bytes and the arrival time."""
        pieces: list[bytes] = []
        responses = None
        last: grpcclient.InferResult | None = None
        finished = False
        try:
            responses = self._client.stream_infer(
                self._one_request(req), stream_timeout=self.timeout_s, headers=self.headers
            )
            async for result, error in responses:
                if error is not None:
                    raise error
                last = result
                _note_response(stats, time.perf_counter())
                pieces.append(_text_bytes(result))
            finished = True
        except (InferenceServerException, grpc.RpcError) as e:
            raise status_of(e) from e
        finally:
            if not finished and responses is not None:
                responses.cancel()
        self._finish(req, stats, last)
        return decode_text(pieces)

    @staticmethod
    async def _one_request(req: Request) -> AsyncIterator[dict[str, Any]]:
        # no request id: the stream carries this one request only
        yield {"model_name": req.model, "inputs": req.inputs, "outputs": req.outputs}

    @staticmethod
    def _finish(req: Request, stats: GenerationStats, last: grpcclient.InferResult | None) -> None:
        if last is None:
            raise GenerationError("NO_RESPONSE", "the server closed the stream without sending a response")
        stats.end = stats.last_response
        if req.perf:
            _read_perf(last, stats)

    async def generate(
        self, prompt: str, max_tokens: int, *, stream: bool = False, **sampling: Any
    ) -> Generation:
        req = build_request(self.schema, prompt, max_tokens, stream=stream, **sampling)
        stats = GenerationStats(start=time.perf_counter(), streamed=stream)
        return Generation(await self.complete(req, stats), stats)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncLLMClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def sampling_of(values: Mapping[str, Any | None]) -> dict[str, Any]:
    """Drop unset (None) sampling options, so only what the user chose is sent (the server applies defaults)."""
    return {k: v for k, v in values.items() if v is not None}
