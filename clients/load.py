"""The load generator: closed-loop (fixed concurrency) or open-loop (Poisson arrivals at a request rate) runs of
one load level, recording every request. Nothing a request does can crash a run: every failure becomes a record
with a status. Every loop is bounded (a request count or a duration, each request a client deadline).

Stopping a level early (Ctrl-C: `stop`) cancels the requests in flight, and a request past its deadline is ended
too; AsyncLLMClient.complete ends each on the server before its cancellation or DEADLINE_EXCEEDED propagates (for an
ensemble: stop request and drain, see clients/client.py), and the level waits for that, so no sequence is left
running behind a finished level."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from clients.client import GenerationError, GenerationStats, status_of
from clients.stats import RequestRecord
from clients.tokens import TokenCounter

# After a connection failure a closed-loop worker waits before its next request (doubling up to the cap), so a
# dead server costs a handful of records per second instead of a tight loop of refusals.
BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 1.0
CONNECTION_STATUSES = frozenset({"UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL"})
INTERRUPTED = "INTERRUPTED"


class LoadClient(Protocol):
    """What the load generator needs of a client: the gRPC one (clients/aio.py AsyncLLMClient) or the OpenAI HTTP
    one (clients/openai_http.py OpenAIClient)."""

    def prepare(self, prompt: str, max_tokens: int, *, stream: bool, **sampling: Any) -> Any: ...

    async def complete(self, req: Any, stats: GenerationStats) -> str: ...


@dataclass(frozen=True)
class LevelSpec:
    """One load level. Exactly one of `requests` / `duration_s` bounds it."""

    mode: Literal["concurrency", "rate"]
    level: float  # concurrency (int-valued) or offered requests/s
    max_tokens: int
    stream: bool
    requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    seed: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("a load level needs exactly one of `requests` (count) or `duration_s` (seconds)")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests={self.requests}: must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s={self.duration_s}: must be > 0")
        if self.level <= 0 or (self.mode == "concurrency" and self.level != int(self.level)):
            kind = "integer" if self.mode == "concurrency" else "number"
            raise ValueError(f"{self.mode} level {self.level}: must be a positive {kind}")


@dataclass
class LevelResult:
    spec: LevelSpec
    records: list[RequestRecord]
    duration_s: float
    interrupted: bool


def prompt_order(n_prompts: int, seed: int) -> np.ndarray:
    """A seeded permutation of the prompts; request i uses prompt order[i % n] (every prompt before repeats)."""
    return np.random.default_rng(seed).permutation(n_prompts)


def poisson_arrivals(rate: float, seed: int, *, count: int | None, duration_s: float | None) -> list[float]:
    """Arrival offsets (s) of a Poisson process of `rate` req/s: exponential gaps of mean 1/rate, seeded; `count`
    arrivals, or all arrivals before `duration_s`."""
    rng = np.random.default_rng(seed + 1)  # distinct stream from prompt_order's
    times: list[float] = []
    t = 0.0
    limit = count if count is not None else int(rate * (duration_s or 0) * 4 + 100)  # bound; duration cuts first
    for _ in range(limit):
        t += float(rng.exponential(1.0 / rate))
        if duration_s is not None and t >= duration_s:
            break
        times.append(t)
    return times


class LevelRunner:
    """Runs one level against `client`; `stop` (an asyncio.Event) ends it early, keeping what was measured."""

    def __init__(
        self,
        client: LoadClient,
        prompts: Sequence[str],
        counter: TokenCounter,
        spec: LevelSpec,
        stop: asyncio.Event,
        on_done: Callable[[RequestRecord], object] | None = None,  # its result is not used
    ) -> None:
        self.client, self.prompts, self.counter, self.spec, self.stop = client, prompts, counter, spec, stop
        self.on_done = on_done
        # a plain list: indexing a numpy array per request returns a numpy scalar to convert
        self.order: list[int] = prompt_order(len(prompts), spec.seed).tolist()
        self.records: list[RequestRecord] = []
        self._issued = 0
        # built once per prompt (validation, numpy arrays, tritonclient inputs: client CPU per send), then resent
        self._requests: list[Any] = [None] * len(prompts)

    async def one(self, index: int, record: bool = True) -> RequestRecord:
        """Send request `index` and wait for it; never raises (except cancellation of the run)."""
        p = self.order[index % len(self.order)]
        rec = RequestRecord(index, p, start=time.perf_counter(), status="OK", streamed=self.spec.stream)
        if record:
            self.records.append(rec)
        stats: GenerationStats | None = None
        try:
            req = self._requests[p]
            if req is None:
                req = self._build(p)
            stats = GenerationStats(start=time.perf_counter(), streamed=self.spec.stream)
            rec.start = stats.start  # the clock starts after the (first-use) build, as a bare client's would
            rec.text = await self.client.complete(req, stats)
            rec.output_tokens = stats.output_tokens if stats.output_tokens is not None else self.counter.count(rec.text)
        except asyncio.CancelledError as e:
            # complete() ended the request on the server before this propagates (stop + drain for an ensemble); a
            # failure to end it comes chained as the cause and belongs in the record
            why = "" if e.__cause__ is None else f"; {e.__cause__}"
            rec.status, rec.error = INTERRUPTED, f"run interrupted before the response{why}"
            rec.end = time.perf_counter()
            raise
        except Exception as e:  # every failure is a countable record, never a crash
            err = status_of(e) if not isinstance(e, GenerationError) else e
            rec.status, rec.error = err.status, err.message
            rec.end = time.perf_counter()
        else:
            rec.end = stats.end
        finally:  # timing and speculative counters of whatever arrived, failed requests included
            if stats is not None:
                rec.first_response, rec.responses = stats.first_response, stats.responses
                rec.accepted_draft_tokens, rec.draft_tokens = stats.accepted_draft_tokens, stats.draft_tokens
            if record and self.on_done is not None:
                self.on_done(rec)
        return rec

    def _build(self, p: int) -> Any:
        s = self.spec
        req = self.client.prepare(self.prompts[p], s.max_tokens, stream=s.stream, **s.sampling)
        self._requests[p] = req
        return req

    async def warmup(self) -> None:
        """`spec.warmup` unrecorded requests (at the level's concurrency, at most 16 at once)."""
        n = self.spec.warmup
        width = max(1, min(16, int(self.spec.level) if self.spec.mode == "concurrency" else 1, n))
        for start in range(0, n, width):
            if self.stop.is_set():
                return
            await asyncio.gather(*(self.one(i, record=False) for i in range(start, min(n, start + width))))

    async def run(self) -> LevelResult:
        await self.warmup()
        t0 = time.perf_counter()
        body = self._closed_loop(t0) if self.spec.mode == "concurrency" else self._open_loop(t0)
        main = asyncio.ensure_future(body)
        stopper = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
        interrupted = not main.done()
        if interrupted:
            main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        stopper.cancel()
        ends = [r.end for r in self.records if r.end is not None]
        duration = (max(ends) if ends else time.perf_counter()) - t0
        return LevelResult(self.spec, self.records, duration, interrupted)

    def _next_index(self, t0: float) -> int | None:
        s = self.spec
        if s.requests is not None and self._issued >= s.requests:
            return None
        if s.duration_s is not None and time.perf_counter() - t0 >= s.duration_s:
            return None
        self._issued += 1
        return self._issued - 1

    async def _closed_loop(self, t0: float) -> None:
        async def worker() -> None:
            backoff = BACKOFF_START_S
            while (i := self._next_index(t0)) is not None:
                rec = await self.one(i)
                if rec.status in CONNECTION_STATUSES:
                    await asyncio.sleep(backoff)
                    backoff = min(BACKOFF_MAX_S, backoff * 2)
                else:
                    backoff = BACKOFF_START_S

        workers = [asyncio.ensure_future(worker()) for _ in range(int(self.spec.level))]
        try:
            await asyncio.gather(*workers)
        finally:
            _cancel_once(workers)
            await asyncio.gather(*workers, return_exceptions=True)

    async def _open_loop(self, t0: float) -> None:
        s = self.spec
        tasks: list[asyncio.Task[RequestRecord]] = []
        try:
            for i, at in enumerate(poisson_arrivals(s.level, s.seed, count=s.requests, duration_s=s.duration_s)):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(self.one(i)))
            await asyncio.gather(*tasks)
        finally:
            _cancel_once(tasks)
            await asyncio.gather(*tasks, return_exceptions=True)


def _cancel_once(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel the tasks not cancelled yet. gather() ends at its first cancelled task while the others are still
    ending their requests on the server (stop + drain); cancelling those again would only interrupt that (the client
    carries it through anyway, see AsyncLLMClient._end_request)."""
    for t in tasks:
        if not t.done() and t.cancelling() == 0:
            t.cancel()
