"""Request admission and in-flight batching for the python LLM model (reference engine).

Triton hands `execute()` whatever its scheduler collected; the model must return quickly in decoupled mode, so
requests become `Job`s on a queue and one worker thread drives an in-flight batch (`Stepper`, which
engines.runtime.Session implements): before every decoding step it moves queued jobs into free slots (up to the
session's capacity, engine.max_batch_size) and drops the jobs whose client cancelled; after it, the jobs that
finished leave the batch and get their final response. A request that arrives while others decode therefore waits
for the step in progress and its own prefill, not for the whole batch.

Admission is bounded: more than `capacity + max_queue_size` jobs in flight are refused with UNAVAILABLE and a
message saying so, never dropped. A job whose client cancelled or disconnected leaves the batch at the next step
(or at its next `on_tokens` callback, which returns False), which frees its sequence slot; so does one named by a
`stop` request (the model sets `Job.cancelled`).

A job is ended with UNAVAILABLE `deadline_s` after it arrived, or, if every slot was taken when it arrived,
`deadline_s` after it got one (its clock restarts then): the bound on how long a client that vanished without a
cancellation reaching us (an ensemble client that neither finishes nor sends a `stop`, and whose request id is not
one postprocessing may name in a `stop` for it: Triton does not tell the LLM model, docs/triton.md "Cancellation")
holds a queue place or a slot, without cutting short a request that merely
waited behind such clients. It is a bound, not a way to cancel. A job that found a slot free keeps its arrival clock
even though its prefill may start later (behind the prefills of the jobs admitted with it), so it expires before any
job that arrived after it and queued behind it. Behind more than `max_batch_size` such vanished clients a live
request can still reach its own queue bound: the vanished ones that queued get the freed slots and restart their
clocks (docs/deploy.md, "Reliability"). A sequence whose step failed
ends alone with INTERNAL (engines.session.Session isolates it); a failure of the session itself (outside any
sequence) still ends every running job with INTERNAL.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from triton_repo import contract as C
from triton_repo.models.step_profile import StepProfile


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
    stop_key: str | None = None  # the owner's secret a `stop` must present with request_id (models/ownership.py)
    deadline: float = float("inf")  # time.monotonic() after which the job ends (set at admission, maybe at its slot)
    expired: bool = False
    waits_for_slot: bool = False  # every slot was taken when it arrived: its clock restarts when it gets one

    def gone(self) -> bool:
        """True once the client cancelled (flag set by a `stop` request or a failed send, or Triton's own)."""
        if not self.cancelled and self.is_cancelled():
            self.cancelled = True
        return self.cancelled


class Stepper(Protocol):
    """The in-flight batch the worker drives (engines.runtime.Session)."""

    capacity: int

    def add(self, request: Any) -> int: ...
    def step(self) -> None: ...
    def cancel(self, slot: int) -> None: ...
    def pop(self, slot: int) -> Any: ...  # the result; a non-empty `error` attribute = that sequence failed

    @property
    def finished(self) -> list[int]: ...

    @property
    def free(self) -> int: ...

    @property
    def done(self) -> bool: ...


class Batcher:
    """`request_of(job)` is the engine request of a job; `finish(job)` sends its final response (job.result is the
    engine's result, or job.error / job.cancelled say why there is none). Both run on the worker thread, as do the
    session's `on_tokens` callbacks, which find their job with `job_in(slot)`."""

    def __init__(
        self,
        session: Stepper,
        request_of: Callable[[Job], Any],
        finish: Callable[[Job], None],
        *,
        max_queue_size: int,
        deadline_s: float = float("inf"),
        on_count: Callable[[int, int], None] = lambda in_flight, queued: None,
        profile: StepProfile | None = None,
    ) -> None:
        """`on_count(in_flight, queued)` is called whenever either changes (queued = admitted, not in a slot).
        `profile` (models/step_profile.py, $EAGLE_DEPLOY_STEP_PROFILE) records where each step's time goes."""
        self.profile = profile
        self._session, self._request_of, self._finish, self._on_count = session, request_of, finish, on_count
        self.max_batch_size, self.max_queue_size, self.deadline_s = session.capacity, max_queue_size, deadline_s
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._running = 0
        self._live: dict[int, Job] = {}
        self._slots: dict[int, Job] = {}  # session slot -> job (worker thread only)
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
            job.waits_for_slot = self._in_flight >= self.max_batch_size
            self._in_flight += 1
            self._live[id(job)] = job
            job.deadline = time.monotonic() + self.deadline_s
            self._publish()
        self._q.put(job)
        return None

    def _publish(self) -> None:
        """Report the counts (caller holds the lock)."""
        self._on_count(self._in_flight, self._in_flight - self._running)

    def jobs(self) -> list[Job]:
        """The jobs admitted and not finished (queued or running)."""
        with self._lock:
            return list(self._live.values())

    def job_in(self, slot: int) -> Job:
        return self._slots[slot]

    # ---- worker thread ------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            t0 = time.perf_counter()
            self._expire_queued()
            self._join_new()
            self._drop_cancelled()
            t1 = t2 = time.perf_counter()
            stepped, batch, prefill = not self._session.done, len(self._slots), bool(getattr(self._session,
                                                                                              "pending", ()))
            if stepped:
                try:
                    self._session.step()
                except Exception as e:  # the session itself failed: every running job gets the error
                    self._fail_all(f"engine error: {type(e).__name__}: {e}")
                t2 = time.perf_counter()
            self._pop_finished()
            if stepped and self.profile is not None:
                self.profile.step(batch, prefill, t1 - t0, t2 - t1, time.perf_counter() - t2)

    def _pop_finished(self) -> None:
        for slot in self._session.finished:
                job = self._slots.pop(slot)
                self._set_running(len(self._slots))
                job.result = self._session.pop(slot)  # kept whatever ended it: its counters are still real
                failed = getattr(job.result, "error", None)  # engines.api.GenerationResult.error
                if job.error is None and failed:  # this sequence alone failed while stepping
                    job.error, job.error_code = f"engine error: {failed}", "INTERNAL"
                self._complete(job)

    def _set_running(self, n: int) -> None:
        with self._lock:
            self._running = n
            self._publish()

    def _expire(self, job: Job) -> bool:
        """True (and the job's error set) once the job is past its deadline."""
        if not job.expired and time.monotonic() > job.deadline:
            job.expired = True
            job.error, job.error_code = (
                f"request ended after the server's deadline of {self.deadline_s:g} s (triton.request_deadline_s); "
                "raise it for longer generations"
            ), C.UNAVAILABLE
        return job.expired

    def _expire_queued(self) -> None:
        """End the queued jobs past their deadline, so a queue of vanished clients does not hold queue places."""
        with self._q.mutex:
            expired = [j for j in self._q.queue if j is not None and self._expire(j)]
            for j in expired:
                self._q.queue.remove(j)
        for j in expired:
            self._complete(j)

    def _join_new(self) -> None:
        """Move queued jobs into free slots; wait for one when nothing is running."""
        while self._session.free and not self._stop:
            try:
                job = self._q.get(block=self._session.done)
            except queue.Empty:
                return
            if job is None:
                self._stop = True
                return
            if job.gone() or self._expire(job):
                self._complete(job)  # cancelled or expired while queued: never prefilled
                continue
            try:
                slot = self._session.add(self._request_of(job))
            except ValueError as e:  # the engine's own checks (the model checks first; this is the backstop)
                job.error = str(e)
                self._complete(job)
                continue
            self._slots[slot] = job
            if job.waits_for_slot:  # it queued behind others: its time in the slot starts now
                job.deadline = time.monotonic() + self.deadline_s
            self._set_running(len(self._slots))

    def _drop_cancelled(self) -> None:
        for slot, job in self._slots.items():
            if (job.gone() or self._expire(job)) and slot not in self._session.finished:
                self._session.cancel(slot)

    def _fail_all(self, message: str) -> None:
        for slot, job in self._slots.items():
            job.error, job.error_code = message, "INTERNAL"
            if slot not in self._session.finished:
                self._session.cancel(slot)

    def _complete(self, job: Job) -> None:
        try:
            self._finish(job)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._live.pop(id(job), None)
                self._publish()
            job.done.set()

    def close(self) -> None:
        self._stop = True  # the loop ends after the step in progress (model unload: nobody waits for the rest)
        self._q.put(None)
        self._thread.join(timeout=30)
