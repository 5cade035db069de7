"""LLM clients over Triton's gRPC API that speak the ensemble contract: the asyncio client (clients/aio.py) and
`LLMClient`, a synchronous wrapper that runs it on an event loop thread of its own.

    from clients.client import LLMClient
    with LLMClient("localhost:8001") as c:
        g = c.generate("Hello", max_tokens=32, temperature=0.0)       # -> Generation(text, stats)
        for chunk in c.stream("Hello", max_tokens=32):                # chunks as they arrive
            print(chunk.text, end="", flush=True)

Deadlines, errors and cancellation (the stop request and drain an ensemble needs) are the asyncio client's: see
clients/aio.py. This module is the clients' public API and re-exports the names callers use.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from clients import schema as sch
from clients.aio import AsyncLLMClient, stream_headers
from clients.request import (
    Chunk,
    Generation,
    GenerationStats,
    Request,
    build_request,
    decode_text,
    sampling_of,
)
from clients.schema import Schema
from clients.transport import DEFAULT_TIMEOUT_S, GenerationError, channel_args, new_request_id, status_of

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncLLMClient",
    "Chunk",
    "Generation",
    "GenerationError",
    "GenerationStats",
    "LLMClient",
    "Request",
    "build_request",
    "channel_args",
    "decode_text",
    "new_request_id",
    "sampling_of",
    "status_of",
    "stream_headers",
]

T = TypeVar("T")
_DONE = object()  # the end of a request's chunks on the hand-over queue


class LLMClient:
    """Synchronous client: one request at a time, sent by an AsyncLLMClient on this client's event loop thread.

    Cancel a streamed request by closing its iterator (`it.close()`, or `break` and dropping it) or with Ctrl-C:
    the request is ended on the server first (close() returns once it has ended, or raises GenerationError
    CANCEL_TIMEOUT if it did not in time)."""

    def __init__(
        self, url: str, model: str | None = None, schema: Schema | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.schema = schema if schema is not None else sch.fetch_schema(url, model)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llm-client-loop", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self.last_stats: GenerationStats | None = None
        self.aio: AsyncLLMClient = self._call(self._open())

    async def _open(self) -> AsyncLLMClient:
        return AsyncLLMClient(self.url, self.schema, self.timeout_s)  # its channel belongs to this loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stream(self, prompt: str, max_tokens: int, *, stream: bool = True, **sampling: Any) -> Iterator[Chunk]:
        """Yield each response as it arrives; the stats of the finished request are in `self.last_stats`."""
        req = build_request(self.schema, prompt, max_tokens, stream=stream, **sampling)
        with self._lock:
            yield from self._run(req)

    def _run(self, req: Request) -> Iterator[Chunk]:
        stats = GenerationStats(start=time.perf_counter(), streamed=req.stream)
        self.last_stats = stats
        chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def pump() -> None:
            try:
                async for chunk in self.aio.run(req, stats):
                    chunks.put(chunk)
                chunks.put(_DONE)
            except BaseException as e:  # handed to the caller's thread, raised there
                chunks.put(e)

        task = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := chunks.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        except (GeneratorExit, KeyboardInterrupt):  # the caller stopped iterating or pressed Ctrl-C mid-request
            task.cancel()  # AsyncLLMClient ends the request on the server before the cancellation completes
            while (outcome := chunks.get()) is not _DONE and not isinstance(outcome, BaseException):
                pass  # chunks that arrived before the cancellation
            _raise_end_failure(outcome)
            raise

    def generate(self, prompt: str, max_tokens: int, *, stream: bool = False, **sampling: Any) -> Generation:
        """The whole text and the request's stats."""
        text = "".join(c.text for c in self.stream(prompt, max_tokens, stream=stream, **sampling))
        assert self.last_stats is not None
        return Generation(text, self.last_stats)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self.aio.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _raise_end_failure(outcome: object) -> None:
    """After a cancellation: the request ended on the server unless ending it failed, which the async client
    reports as the cancellation's cause (e.g. GenerationError CANCEL_TIMEOUT): raise that."""
    failures = (GenerationError, sch.SchemaError)
    if isinstance(outcome, asyncio.CancelledError) and isinstance(outcome.__cause__, failures):
        raise outcome.__cause__
    if isinstance(outcome, failures):
        raise outcome
