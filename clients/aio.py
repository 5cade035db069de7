"""The asyncio LLM client over Triton's gRPC API (`tritonclient.grpc.aio`) that speaks the ensemble contract; the
sync `clients.client.LLMClient` runs this client on an event loop of its own.

Requests travel over the bidirectional stream API (aio stream_infer), as tensorrtllm_backend's own clients do
(inflight_batcher_llm/client/end_to_end_grpc_client.py): a repository whose LLM model is decoupled (streaming)
refuses the unary ModelInfer call, and the stream works for both kinds. Every request has a deadline; failures raise
`GenerationError` carrying a status (gRPC status code name, DEADLINE_EXCEEDED for the client deadline, or
SERVER_ERROR) so callers (the load tester) can count them.

Cancellation (closing a stream's iterator early, a cancelled asyncio task, Ctrl-C in the sync client, the client
deadline) frees the request's sequence on the server. A plain gRPC cancel does that for a single model (the BLS
model, the `llmapi` model, the echo model), but Triton <= r26.02 does not forward it into an ensemble and leaks the
ensemble request (docs/triton.md, "Cancellation"). So a request to an ensemble is never cancelled: the client sends
tensorrtllm_backend's `stop` request with the request's unique id and its secret `stop_key` request parameter
(sent with the request; triton_repo/models/ownership.py) to the ensemble's LLM model and reads the stream
to its final response (`AsyncLLMClient._end_early`): this protocol is written once, here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
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
    stop_request_inputs,
)
from clients.request import (
    Chunk,
    Generation,
    GenerationStats,
    Request,
    build_request,
    decode_text,
    note_response,
    read_perf,
    read_response,
    text_bytes,
)
from clients.schema import Schema
from clients.transport import (
    DEFAULT_TIMEOUT_S,
    STOP_KEY,
    GenerationError,
    channel_args,
    new_request_id,
    new_stop_key,
    status_of,
)

log = logging.getLogger(__name__)


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
    async def connect(cls, url: str, model: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncLLMClient:
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

    def prepare(self, prompt: str, max_tokens: int, *, stream: bool, **sampling: Any) -> Request:
        """A ready-to-send request (the load generator builds one per prompt, clients/load.py)."""
        return build_request(self.schema, prompt, max_tokens, stream=stream, **sampling)

    async def run(self, req: Request, stats: GenerationStats) -> AsyncGenerator[Chunk, None]:
        """Send `req` and yield its responses; fills `stats`. Raises GenerationError on any failure."""
        arrived: asyncio.Queue[tuple[grpcclient.InferResult, float] | None] = asyncio.Queue()
        reader = self._start(req, stats, lambda result, now: arrived.put_nowait((result, now)))
        reader.add_done_callback(lambda _task: arrived.put_nowait(None))  # wakes the loop below at the end
        deadline = stats.start + self.timeout_s
        last: grpcclient.InferResult | None = None
        so_far = ""
        try:
            while True:
                # asyncio.timeout, not wait_for: 3.11's wait_for returns a result that arrives together with a
                # cancellation and drops the cancellation. Not around the yield: the caller's time is not ours.
                async with asyncio.timeout(deadline - time.perf_counter()):
                    item = await arrived.get()
                if item is None:
                    break
                last, now = item
                text = read_response(last, stats, now)
                if req.cumulative:  # the text so far: the chunk is what it adds
                    text, so_far = text[len(so_far) :], text
                yield Chunk(text, now, stats.responses - 1)
            await reader  # raises the reader's GenerationError
        except (TimeoutError, asyncio.CancelledError, GeneratorExit) as e:  # GeneratorExit: aclose() of the caller
            ended = await self._end_after(e, reader, stats)
            raise ended from ended.__cause__  # the cause _end_after set (a failure to end the request), if any
        self._finish(req, stats, last)

    async def complete(self, req: Request, stats: GenerationStats) -> str:
        """Send `req` and return its whole text; fills `stats`. The same exchange as `run` without a generator
        layer and a Chunk per response: the load tester's path, where client CPU per request is the overhead
        bench/bench_client.py measures. Per response it only keeps the raw text bytes and the arrival time."""
        pieces: list[bytes] = []
        last: grpcclient.InferResult | None = None

        def on_response(result: grpcclient.InferResult, now: float) -> None:
            nonlocal last
            last = result
            note_response(stats, now)
            pieces.append(text_bytes(result))

        reader = self._start(req, stats, on_response)
        try:
            # shield: the deadline and a cancellation of this task must not cancel the reader (see the class doc);
            # asyncio.timeout, not wait_for, which can drop a cancellation (see run)
            async with asyncio.timeout(stats.start + self.timeout_s - time.perf_counter()):
                await asyncio.shield(reader)
        except (TimeoutError, asyncio.CancelledError) as e:
            ended = await self._end_after(e, reader, stats)
            raise ended from ended.__cause__  # the cause _end_after set (a failure to end the request), if any
        self._finish(req, stats, last)
        # cumulative: the longest piece is the whole text (a final response may come without text)
        return decode_text([max(pieces, key=len)] if req.cumulative and pieces else pieces)

    def _start(
        self, req: Request, stats: GenerationStats, on_response: Callable[[grpcclient.InferResult, float], None]
    ) -> asyncio.Task[None]:
        stats.request_id, stats.stop_key = new_request_id(), new_stop_key()
        return asyncio.ensure_future(self._read(req, stats.request_id, stats.stop_key, on_response))

    async def _read(
        self, req: Request, request_id: str, stop_key: str,
        on_response: Callable[[grpcclient.InferResult, float], None],
    ) -> None:
        """Send `req` on a stream of its own and hand each response to `on_response` until the server closes it."""
        try:
            # gRPC's own deadline is a backstop only: the client deadline (timeout_s) is enforced by the callers,
            # which must still be able to stop the request and drain its stream after it
            responses = self._client.stream_infer(
                self._one_request(req.model, req.inputs, req.outputs, request_id, stop_key),
                stream_timeout=self.timeout_s + DRAIN_TIMEOUT_S, headers=self.headers,
            )
            async for result, error in responses:
                now = time.perf_counter()
                if error is not None:
                    raise error
                on_response(result, now)
        except (InferenceServerException, grpc.RpcError) as e:
            raise status_of(e) from e

    async def _end_after(
        self, failure: BaseException, reader: asyncio.Task[None], stats: GenerationStats
    ) -> BaseException:
        """End the request on the server after the client deadline, a cancellation or a closed iterator; returns
        what to raise: DEADLINE_EXCEEDED for the deadline, else `failure` itself (a closed iterator's caller gets a
        failure to end the request, as the sync close() does; a cancellation propagates, see `_cancelled`)."""
        if isinstance(failure, asyncio.CancelledError):
            await self._cancelled(reader, stats)
            return failure
        await self._end_request(reader, stats)
        if isinstance(failure, TimeoutError):
            deadline = GenerationError("DEADLINE_EXCEEDED", "no final response before the client deadline")
            deadline.__cause__ = failure
            return deadline
        return failure

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
        assert stats.request_id is not None and stats.stop_key is not None
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
                    await self._send_stop(llm_model, stats.request_id, stats.stop_key)
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

    async def _send_stop(self, llm_model: str, request_id: str, stop_key: str) -> None:
        """stop_ensemble_request on this client's channel: the stop request, with the request's id and stop key, on
        a stream of its own."""
        try:
            responses = self._client.stream_infer(
                self._one_request(llm_model, stop_request_inputs(), [], request_id, stop_key),
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
        request_id: str, stop_key: str,
    ) -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs, "outputs": outputs, "request_id": request_id,
               "parameters": {STOP_KEY: stop_key}}

    @staticmethod
    def _finish(req: Request, stats: GenerationStats, last: grpcclient.InferResult | None) -> None:
        if last is None:
            raise GenerationError("NO_RESPONSE", "the server closed the stream without sending a response")
        stats.end = stats.last_response
        if req.perf:
            read_perf(last, stats)

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
