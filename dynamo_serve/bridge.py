"""Dynamo's token protocol on the reference engine's in-flight batch: what a `dynamo.runtime` endpoint receives (the
frontend's preprocessed request: `token_ids`, `stop_conditions`, `sampling_options`, `eos_token_ids`) becomes a
`GenerationRequest` in the batcher's queue (triton_repo/models/batcher.py: one thread steps the session), and each
step's accepted tokens go back to the request's asyncio task as one response chunk `{"token_ids": [...]}`; the last
chunk carries `finish_reason` and `completion_usage`. The shapes are the ones Dynamo's own TensorRT-LLM worker
yields (ai-dynamo/dynamo v1.6.1 components/src/dynamo/trtllm/request_handlers/handler_base.py `generate_locally`).

A request whose client went away (the frontend stops its context, or the response stream is closed) leaves the
batch at the next step and frees its slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from core.types import GenerationRequest, GenerationResult, RequestStats, SamplingParams
from triton_repo.models.batcher import Batcher, Job

# The reference engine's finish reasons in Dynamo's words (lib/llm/src/protocols/common.rs FinishReason: "eos",
# "length", "stop", "error", "cancelled").
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled"}
DEFAULT_MAX_TOKENS = 32


class RequestError(ValueError):
    """A request the engine cannot serve; its message goes back to the client."""


@dataclass
class Stream:
    """One request's way back from the stepping thread to its asyncio task."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[list[int], GenerationResult | None, str | None]]
    request: GenerationRequest
    rid: str
    gone: threading.Event = field(default_factory=threading.Event)

    def put(self, ids: list[int], result: GenerationResult | None, error: str | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (ids, result, error))


def sampling_of(req: dict[str, Any]) -> SamplingParams:
    """Dynamo's `sampling_options` (absent or null = the engine's default: greedy)."""
    s = req.get("sampling_options") or {}
    try:
        top_p = s.get("top_p")
        return SamplingParams(temperature=float(s.get("temperature") or 0.0), top_k=int(s.get("top_k") or 0),
                              top_p=1.0 if top_p is None else float(top_p), seed=s.get("seed"))
    except ValueError as e:
        raise RequestError(str(e)) from e


def request_of(req: dict[str, Any], *, prefill_only: bool) -> GenerationRequest:
    """The engine request for a preprocessed Dynamo request. A prefill worker generates one token (the handoff
    Dynamo's frontend expects from a prefill worker: it sends the prefill with max_tokens 1)."""
    ids = req.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise RequestError("the request has no token_ids; the frontend sends the prompt's tokens")
    stop = req.get("stop_conditions") or {}
    max_tokens = 1 if prefill_only else int(stop.get("max_tokens") or DEFAULT_MAX_TOKENS)
    eos = [] if stop.get("ignore_eos") else list(req.get("eos_token_ids") or [])
    eos += list(stop.get("stop_token_ids_hidden") or [])
    try:
        return GenerationRequest(prompt_ids=[int(t) for t in ids], max_new_tokens=max_tokens,
                                 sampling=sampling_of(req), stop_token_ids=eos)
    except ValueError as e:
        raise RequestError(str(e)) from e


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class SpecCounters:
    """The engine's speculative statistics summed over the finished requests (served as Prometheus counters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = RequestStats()
        self.requests = 0

    def add(self, s: RequestStats) -> None:
        with self._lock:
            self.requests += 1
            self.total.generated_tokens += s.generated_tokens
            self.total.target_forwards += s.target_forwards
            self.total.accepted_draft_tokens += s.accepted_draft_tokens
            self.total.draft_tokens += s.draft_tokens

    def exposition(self, worker: str) -> str:
        """Prometheus text: eagle_* counters labelled with this worker's role."""
        with self._lock:
            t, n = self.total, self.requests
        rows = [("eagle_requests_total", "requests finished", n),
                ("eagle_generated_tokens_total", "tokens generated", t.generated_tokens),
                ("eagle_target_forwards_total", "target forward passes after prefill", t.target_forwards),
                ("eagle_accepted_draft_tokens_total", "draft tokens accepted", t.accepted_draft_tokens),
                ("eagle_draft_tokens_total", "draft tokens proposed", t.draft_tokens)]
        out = []
        for name, help_, value in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f'{name}{{worker="{worker}"}} {value}']
        return "\n".join(out) + "\n"


class EngineBridge:
    """The reference engine's session, stepped by one batcher thread, served to asyncio handlers."""

    def __init__(self, session: Any, *, max_queue_size: int, counters: SpecCounters) -> None:
        self.counters = counters
        session.on_tokens = self._on_tokens
        self.batcher = Batcher(session, lambda job: job.payload.request, self._finish, max_queue_size=max_queue_size)

    def _on_tokens(self, slot: int, new_ids: list[int]) -> bool:
        job = self.batcher.job_in(slot)
        stream: Stream = job.payload
        if job.gone():
            return False
        if new_ids:
            stream.put(list(new_ids), None, None)
        return True

    def _finish(self, job: Job) -> None:
        stream: Stream = job.payload
        if isinstance(job.result, GenerationResult):
            self.counters.add(job.result.stats)
            logging.info("request %s finished: %s after %d tokens", stream.rid, job.result.finish_reason,
                         len(job.result.output_ids))
        stream.put([], job.result, job.error or ("cancelled" if job.cancelled and job.result is None else None))

    async def run(self, request: GenerationRequest, is_stopped: Callable[[], bool], rid: str) -> AsyncIterator[
            tuple[list[int], GenerationResult | None, str | None]]:
        """Yields (new token ids, final result or None, error or None) until the final item."""
        loop = asyncio.get_running_loop()
        stream = Stream(loop, asyncio.Queue(), request, rid)
        job = Job(payload=stream, is_cancelled=lambda: stream.gone.is_set() or is_stopped(), streaming=True)
        if (refusal := self.batcher.admit(job)) is not None:
            raise RequestError(refusal)
        try:
            while True:
                ids, result, error = await stream.queue.get()
                yield ids, result, error
                if result is not None or error is not None:
                    return
        finally:
            stream.gone.set()  # the client went away (or the request ended): the slot is freed at the next step

    def close(self) -> None:
        self.batcher.close()


async def respond(bridge: EngineBridge, req: dict[str, Any], is_stopped: Callable[[], bool], *,
                  prefill_only: bool, rid: str = "") -> AsyncIterator[dict[str, Any]]:
    """Dynamo response chunks for one preprocessed request."""
    try:
        request = request_of(req, prefill_only=prefill_only)
    except RequestError as e:
        yield {"token_ids": [], "finish_reason": {"error": str(e)}}
        return
    try:
        async for ids, result, error in bridge.run(request, is_stopped, rid):
            if error is not None:
                yield {"token_ids": ids, "finish_reason": {"error": error}}
                return
            if result is None:
                if not prefill_only:  # a prefill worker answers once (the frontend reads its first response)
                    yield {"token_ids": ids}
                continue
            final: dict[str, Any] = {"token_ids": [], "finish_reason": FINISH.get(result.finish_reason, "stop"),
                                     "completion_usage": usage(len(request.prompt_ids), len(result.output_ids))}
            if prefill_only:
                final["token_ids"] = list(result.output_ids)
                final["disaggregated_params"] = handoff(request, result)
            yield final
    except RequestError as e:
        yield {"token_ids": [], "finish_reason": {"error": str(e)}}


def handoff(request: GenerationRequest, result: GenerationResult) -> dict[str, Any]:
    """What a prefill worker hands the decode worker through the frontend (`prefill_result.disaggregated_params`):
    the prompt length and the first token. A GPU worker hands over its KV cache's location here; the reference
    engine's decode worker prefills the prompt again and checks that it agrees with this."""
    return {"prompt_tokens": len(request.prompt_ids), "first_token": result.output_ids[:1]}


def check_handoff(req: dict[str, Any]) -> str | None:
    """A decode request's prefill result disagrees with its prompt: the message; else None."""
    pr = req.get("prefill_result") or {}
    params = pr.get("disaggregated_params") if isinstance(pr, dict) else None
    if not params:
        return None
    n = params.get("prompt_tokens")
    if n is not None and n != len(req.get("token_ids") or []):
        return (f"the prefill result is for a {n}-token prompt but this request has "
                f"{len(req.get('token_ids') or [])} tokens")
    return None
