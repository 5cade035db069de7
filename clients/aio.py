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

Cancellation (closing a stream's iterator early, `break` + the iterator dropped, Ctrl-C in the sync client, a
cancelled asyncio task, the client deadline) frees the request's sequence on the server. A plain gRPC cancel does
that for a single model (the BLS model, the echo model), but Triton <= r26.02 does not forward it into an ensemble
and leaks the ensemble request (README, Triton section, "Cancellation."). So a request to an ensemble is never
cancelled: the client sends tensorrtllm_backend's `stop` request with the request's unique id to the ensemble's LLM
model and reads the stream to its final response (`stop_ensemble_request`, the drain loops of both clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from clients import schema as sch
from clients.cancel import (
    DRAIN_TIMEOUT_S,
    STOP_REQUEST_TIMEOUT_S,
    STOP_RESEND_S,
    cancel_timeout_error,
    server_stop_model,
    stop_ensemble_request,
    stop_request_inputs,
)
from clients.schema import Schema
from clients.transport import (  # noqa: F401  (re-exported: the clients' public API)
    DEFAULT_TIMEOUT_S,
    GenerationError,
    channel_args,
    new_request_id,
    status_of,
)

log = logging.getLogger(__name__)


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
    request_id: str | None = None  # the id the request was sent with (new_request_id); set when it is sent

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
    inputs when sent, so one Request can be sent any number of times, also concurrently (the load tester does);
    hence no request id here: every send gets a new one (new_request_id)."""

    model: str
    inputs: list[grpcclient.InferInput]
    outputs: list[grpcclient.InferRequestedOutput]  # empty: all of the model's outputs
    stream: bool
    perf: bool


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
    return Request(schema.model, inputs, outputs, stream, perf)


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
    """Synchronous client (one request at a time over one gRPC stream, reopened after a failure).

    Cancel a streamed request by closing its iterator (`it.close()`, or `break` and dropping it): close() returns
    once the server has ended the request, or raises GenerationError (CANCEL_TIMEOUT) if it did not in time."""

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
        self._stop_model: str | None = None
        self._stop_model_known = False  # resolved at the first cancellation: it may need the server's configs

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
        stats = GenerationStats(start=time.perf_counter(), streamed=req.stream, request_id=new_request_id())
        assert stats.request_id is not None
        self.last_stats = stats
        deadline = stats.start + self.timeout_s
        sent = False
        try:
            self._ensure_stream()
            self._client.async_stream_infer(
                req.model, req.inputs, outputs=req.outputs, request_id=stats.request_id,
                enable_empty_final_response=True,
            )  # fmt: skip
            sent = True
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
        except queue.Empty as e:  # the client deadline: end the request before reporting it
            self._end_early(stats.request_id)
            raise status_of(e) from e
        except (InferenceServerException, grpc.RpcError) as e:
            self._reset_stream()
            raise status_of(e) from e
        except (GeneratorExit, KeyboardInterrupt):  # the caller stopped iterating or pressed Ctrl-C mid-request
            if sent:
                self._end_early(stats.request_id)
            else:
                self._reset_stream()
            raise

    def _end_early(self, request_id: str) -> None:
        """End the running request `request_id`, so its sequence is freed and no stale response remains on the
        stream: a plain cancel, or for an ensemble the stop request and a drain to the final response."""
        if not self._stop_model_known:
            try:
                self._stop_model = server_stop_model(self.url, self.schema)
            except BaseException:
                self._reset_stream()
                raise
            self._stop_model_known = True
        if self._stop_model is None:
            self._reset_stream()
            return
        deadline = time.perf_counter() + DRAIN_TIMEOUT_S
        stop_error: GenerationError | None = None
        try:
            while time.perf_counter() < deadline:
                try:
                    stop_ensemble_request(self.url, self._stop_model, request_id)
                except GenerationError as e:  # the stream may still end (it failed too, or an earlier stop worked)
                    stop_error = e
                if self._drained(min(deadline, time.perf_counter() + STOP_RESEND_S)):
                    return
        except BaseException:  # Ctrl-C during the drain: the stream holds the request's responses, drop it
            self._reset_stream()
            raise
        self._reset_stream()
        raise cancel_timeout_error(self.schema.model, self._stop_model, request_id, stop_error)

    def _drained(self, until: float) -> bool:
        """Discard the stopped request's responses until its final one (True) or `until` (False)."""
        while (left := until - time.perf_counter()) > 0:
            try:
                result, error = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if error is not None:  # the request ended with an error: nothing of it runs any more
                self._reset_stream()
                return True
            assert result is not None
            if result.get_response().parameters["triton_final_response"].bool_param:
                return True
        return False

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
    `stream_headers`.

    A request that is cancelled (its task, or `aclose()` of / `break` out of `stream`'s iterator) or passes the
    client deadline is ended on the server before the cancellation or DEADLINE_EXCEEDED propagates (see the module
    docstring). The gRPC stream itself is read by a task of its own (`_read`): cancelling a task that awaits a gRPC
    read cancels the RPC (grpc.aio `_StreamResponseMixin._read`), which is exactly what an ensemble must not get."""

    def __init__(
        self, url: str, schema: Schema, timeout_s: float = DEFAULT_TIMEOUT_S, *, grpc_status: bool = False
    ) -> None:
        self.url = url
        self.schema = schema
        self.timeout_s = timeout_s
        self.headers = stream_headers(grpc_status)
        self._client = aiogrpc.InferenceServerClient(url, channel_args=channel_args())
        self._stop_model: asyncio.Future[str | None] | None = None  # resolved once, at the first cancellation

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
        # close run() as soon as this generator is closed, not whenever the garbage collector finalizes it
        async with contextlib.aclosing(self.run(req, stats)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def run(self, req: Request, stats: GenerationStats) -> AsyncIterator[Chunk]:
        """Send `req` and yield its responses; fills `stats`. Raises GenerationError on any failure."""
        arrived: asyncio.Queue[tuple[grpcclient.InferResult, float] | None] = asyncio.Queue()
        reader = self._start(req, stats, lambda result, now: arrived.put_nowait((result, now)))
        reader.add_done_callback(lambda _task: arrived.put_nowait(None))  # wakes the loop below at the end
        deadline = stats.start + self.timeout_s
        last: grpcclient.InferResult | None = None
        try:
            while True:
                # asyncio.timeout, not wait_for: 3.11's wait_for returns a result that arrives together with a
                # cancellation and drops the cancellation. Not around the yield: the caller's time is not ours.
                async with asyncio.timeout(deadline - time.perf_counter()):
                    item = await arrived.get()
                if item is None:
                    break
                last, now = item
                yield Chunk(_read_response(last, stats, now), now, stats.responses - 1)
            await reader  # raises the reader's GenerationError
        except TimeoutError as e:
            await self._end_request(reader, stats)
            raise GenerationError("DEADLINE_EXCEEDED", "no final response before the client deadline") from e
        except asyncio.CancelledError:
            await self._cancelled(reader, stats)
            raise
        except GeneratorExit:  # aclose(): its caller gets a failure to end the request, as the sync close() does
            await self._end_request(reader, stats)
            raise
        self._finish(req, stats, last)

    async def complete(self, req: Request, stats: GenerationStats) -> str:
        """Send `req` and return its whole text; fills `stats`. The same exchange as `run` without a generator
        layer and a Chunk per response: the load tester's path, where client CPU per request is the overhead
        scripts/bench_client.py measures. Per response it only keeps the raw text bytes and the arrival time."""
        pieces: list[bytes] = []
        last: grpcclient.InferResult | None = None

        def on_response(result: grpcclient.InferResult, now: float) -> None:
            nonlocal last
            last = result
            _note_response(stats, now)
            pieces.append(_text_bytes(result))

        reader = self._start(req, stats, on_response)
        try:
            # shield: the deadline and a cancellation of this task must not cancel the reader (see the class doc);
            # asyncio.timeout, not wait_for, which can drop a cancellation (see run)
            async with asyncio.timeout(stats.start + self.timeout_s - time.perf_counter()):
                await asyncio.shield(reader)
        except TimeoutError as e:
            await self._end_request(reader, stats)
            raise GenerationError("DEADLINE_EXCEEDED", "no final response before the client deadline") from e
        except asyncio.CancelledError:
            await self._cancelled(reader, stats)
            raise
        self._finish(req, stats, last)
        return decode_text(pieces)

    def _start(
        self, req: Request, stats: GenerationStats, on_response: Callable[[grpcclient.InferResult, float], None]
    ) -> asyncio.Task[None]:
        stats.request_id = new_request_id()
        return asyncio.ensure_future(self._read(req, stats.request_id, on_response))

    async def _read(
        self, req: Request, request_id: str, on_response: Callable[[grpcclient.InferResult, float], None]
    ) -> None:
        """Send `req` on a stream of its own and hand each response to `on_response` until the server closes it."""
        try:
            # gRPC's own deadline is a backstop only: the client deadline (timeout_s) is enforced by the callers,
            # which must still be able to stop the request and drain its stream after it
            responses = self._client.stream_infer(
                self._one_request(req.model, req.inputs, req.outputs, request_id),
                stream_timeout=self.timeout_s + DRAIN_TIMEOUT_S, headers=self.headers,
            )  # fmt: skip
            async for result, error in responses:
                now = time.perf_counter()
                if error is not None:
                    raise error
                on_response(result, now)
        except (InferenceServerException, grpc.RpcError) as e:
            raise status_of(e) from e

    async def _cancelled(self, reader: asyncio.Task[None], stats: GenerationStats) -> None:
        """End the request of a cancelled task or a closed iterator. The cancellation still propagates if that
        fails (a caller that cancels must not get an error instead, which would read as "carry on"), with the
        failure logged and as its message and __cause__, never swallowed."""
        try:
            await self._end_request(reader, stats)
        except (GenerationError, sch.SchemaError) as e:
            log.error("%s", e)
            raise asyncio.CancelledError(str(e)) from e

    async def _end_request(self, reader: asyncio.Task[None], stats: GenerationStats) -> None:
        """_end_early, carried to its end even when this task is cancelled (again) meanwhile: code that cancels a
        task repeatedly is common (asyncio.gather ends at its first cancelled child, then callers cancel the rest
        once more), and aborting the drain would cancel the stream, the very leak it avoids.
        It is bounded (DRAIN_TIMEOUT_S, STOP_REQUEST_TIMEOUT_S). A cancellation that arrived meanwhile is raised
        after it, chained to its failure if it failed."""
        ending = asyncio.ensure_future(self._end_early(reader, stats))
        cancelled_again = False
        while not ending.done():
            try:
                await asyncio.wait({ending})
            except asyncio.CancelledError:
                cancelled_again = True
        if cancelled_again:
            failure = None if ending.cancelled() else ending.exception()
            raise asyncio.CancelledError("cancelled while ending the request on the server") from failure
        ending.result()

    async def _end_early(self, reader: asyncio.Task[None], stats: GenerationStats) -> None:
        """End the unfinished request whose stream `reader` reads: a plain cancel, or for an ensemble the stop
        request and a drain to the stream's end. Raises GenerationError (CANCEL_TIMEOUT) if it does not end."""
        assert stats.request_id is not None
        try:
            if reader.done():
                return
            llm_model = await self._resolve_stop_model()
            if llm_model is None:
                return  # the finally cancels the reader, and with it the RPC
            deadline = time.perf_counter() + DRAIN_TIMEOUT_S
            stop_error: GenerationError | None = None
            while time.perf_counter() < deadline:
                try:
                    await self._send_stop(llm_model, stats.request_id)
                except GenerationError as e:  # the stream may still end (it failed too, or an earlier stop worked)
                    stop_error = e
                wait_s = min(STOP_RESEND_S, deadline - time.perf_counter())
                if (await asyncio.wait({reader}, timeout=max(0.0, wait_s)))[0]:
                    return
            raise cancel_timeout_error(self.schema.model, llm_model, stats.request_id, stop_error)
        finally:
            if not reader.done():
                reader.cancel()  # cancels the RPC (grpc.aio cancels a call whose read is cancelled)
                await asyncio.wait({reader})
            if not reader.cancelled():
                reader.exception()  # retrieved: a stopped request's own end (even an error) is no news

    async def _resolve_stop_model(self) -> str | None:
        if self._stop_model is None:  # one resolution for all requests cancelled at once (load tester Ctrl-C)
            self._stop_model = asyncio.ensure_future(asyncio.to_thread(server_stop_model, self.url, self.schema))
        resolving = self._stop_model
        try:
            return await asyncio.shield(resolving)
        except (GenerationError, sch.SchemaError):
            if self._stop_model is resolving:  # not cached: the server may be back for the next cancellation
                self._stop_model = None
            raise

    async def _send_stop(self, llm_model: str, request_id: str) -> None:
        """stop_ensemble_request on this client's channel: the stop request on a stream of its own."""
        try:
            responses = self._client.stream_infer(
                self._one_request(llm_model, stop_request_inputs(), [], request_id),
                stream_timeout=STOP_REQUEST_TIMEOUT_S,
            )
            async for _result, error in responses:
                if error is not None:
                    raise error
        except (InferenceServerException, grpc.RpcError) as e:
            err = status_of(e)
            raise GenerationError(err.status, f"stop request to {llm_model!r} for {request_id}: {err.message}") from e

    @staticmethod
    async def _one_request(
        model: str, inputs: list[grpcclient.InferInput], outputs: list[grpcclient.InferRequestedOutput],
        request_id: str,
    ) -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs, "outputs": outputs, "request_id": request_id}

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
