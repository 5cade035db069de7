"""Request admission and batching for the python LLM models (reference engine; LLM API).

Triton hands `execute()` whatever its dynamic batcher collected; the model must return quickly in decoupled mode,
so requests become `Job`s on a queue and one worker thread runs them in batches of up to `max_batch_size`
(requests that arrive while a batch runs wait for the next one: the reference engine's `generate` takes a fixed
list). Admission is bounded: more than `max_batch_size + max_queue_size` jobs in flight are refused with
UNAVAILABLE and a message saying so, never dropped. A job whose client cancelled or disconnected stops at its next
`on_tokens` callback (returning False frees its sequence in the engine).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triton_repo import contract as C


@dataclass
class Job:
    """One admitted request. `payload` is what the engine needs; `sender`/`done` deliver the responses."""

    payload: Any
    is_cancelled: Callable[[], bool]
    streaming: bool
    result: Any = None
    error: str | None = None
    error_code: str = C.INVALID_ARGUMENT
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    request_id: str = ""


class Batcher:
    """`run_batch(jobs)` runs a list of jobs to completion (filling job.result / job.error); `finish(job)` sends the
    final response. Both run on the worker thread."""

    def __init__(
        self,
        run_batch: Callable[[list[Job]], None],
        finish: Callable[[Job], None],
        *,
        max_batch_size: int,
        max_queue_size: int,
        on_count: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._run_batch, self._finish, self._on_count = run_batch, finish, on_count
        self.max_batch_size, self.max_queue_size = max_batch_size, max_queue_size
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._live: dict[int, Job] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="llm-batcher", daemon=True)
        self._thread.start()

    @property
    def limit(self) -> int:
        return self.max_batch_size + self.max_queue_size

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def admit(self, job: Job) -> str | None:
        """Queue `job`; returns None, or the refusal message when the server is full."""
        with self._lock:
            if self._in_flight >= self.limit:
                return (
                    f"server busy: {self._in_flight} requests in flight, limit max_batch_size {self.max_batch_size} + "
                    f"triton.max_queue_size {self.max_queue_size}; retry later"
                )
            self._in_flight += 1
            self._live[id(job)] = job
            self._on_count(self._in_flight)
        self._q.put(job)
        return None

    def jobs(self) -> list[Job]:
        """The jobs admitted and not finished (queued or running)."""
        with self._lock:
            return list(self._live.values())

    def _take(self) -> list[Job]:
        first = self._q.get()
        if first is None:
            return []
        jobs = [first]
        while len(jobs) < self.max_batch_size:
            try:
                nxt = self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._stop = True
                break
            jobs.append(nxt)
        return jobs

    def _loop(self) -> None:
        while not self._stop:
            jobs = self._take()
            if not jobs:
                return
            live = []
            for j in jobs:
                if j.cancelled or j.is_cancelled():
                    j.cancelled = True
                else:
                    live.append(j)
            try:
                if live:
                    self._run_batch(live)
            except Exception as e:  # the engine failed: every job of the batch gets the error, the server lives on
                for j in live:
                    j.error, j.error_code = f"engine error: {type(e).__name__}: {e}", "INTERNAL"
            for j in jobs:
                try:
                    self._finish(j)
                finally:
                    with self._lock:
                        self._in_flight -= 1
                        self._live.pop(id(j), None)
                        self._on_count(self._in_flight)
                    j.done.set()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
