"""The serve-time Triton models' logic without a server: stop-word lists in TensorRT-LLM's format, the sampling rules
and token-id checks of the request parser (triton_repo/models/llm_io.py, common.py), and the in-flight batcher
(triton_repo/models/batcher.py) over a counting stand-in for the engine session."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from triton_repo.models import batcher, common, llm_io


# ---- request helpers -----------------------------------------------------------------------------------------


def test_stop_word_list_round_trip_in_trtllm_format() -> None:
    arr = common.word_list([[5, 6], [7]])
    assert arr.tolist() == [[5, 6, 7], [2, 3, -1]]
    assert common.parse_word_list(arr) == [[5, 6], [7]]
    assert common.word_list([]).tolist() == [[0], [-1]] and common.parse_word_list(common.word_list([])) == []


@pytest.mark.parametrize(
    ("t", "k", "p", "greedy", "top_p"),
    [(1.0, 0, 0.0, True, 1.0), (0.0, 5, 0.9, True, 0.9), (0.7, 1, 0.0, True, 1.0), (0.7, 40, 0.0, False, 1.0),
     (0.7, 0, 0.9, False, 0.9)],
)
def test_sampling_follows_trtllm_greedy_rule(t: float, k: int, p: float, greedy: bool, top_p: float) -> None:
    s = llm_io.sampling_from(t, k, p, 3)
    assert (s.greedy, s.top_p, s.seed) == (greedy, top_p, 3)


def test_sampling_rejects_bad_values() -> None:
    for t in (-1.0, float("nan"), float("inf")):
        with pytest.raises(common.RequestError, match=rf"temperature={t} must be a finite number >= 0"):
            llm_io.sampling_from(t, 5, 0.0, 0)
    with pytest.raises(common.RequestError, match=r"top_p=nan must be in \(0, 1\]"):
        llm_io.sampling_from(1.0, 0, float("nan"), 0)
    with pytest.raises(
        common.RequestError, match=r"input_ids\[1\]=320 is out of range: token ids must be in \[0, 320\)"
    ):
        llm_io.check_token_ids([5, 320], 320)
    llm_io.check_token_ids([0, 319], 320)
    with pytest.raises(common.RequestError, match=r"top_p=1.5 must be in \(0, 1\]"):
        llm_io.sampling_from(1.0, 0, 1.5, 0)


class CountingSession:
    """A stand-in for engines.runtime.Session (the batcher's Stepper protocol) without a model: a request is the
    number of tokens to generate, one per step; `gate` blocks steps; `log` records (step, active slots)."""

    def __init__(self, capacity: int, gate: threading.Event | None = None, delay: float = 0.0) -> None:
        self.capacity, self.gate, self.delay = capacity, gate, delay
        self.left: dict[int, int] = {}
        self.made: dict[int, int] = {}
        self.ended: dict[int, str] = {}
        self.log: list[list[int]] = []

    def add(self, request: int) -> int:
        slot = min(set(range(self.capacity)) - set(self.left) - set(self.ended))
        self.left[slot], self.made[slot] = request, 0
        return slot

    def step(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(10)
        time.sleep(self.delay)
        self.log.append(sorted(self.left))
        for slot in list(self.left):
            self.made[slot] += 1
            self.left[slot] -= 1
            if self.left[slot] == 0:
                del self.left[slot]
                self.ended[slot] = "length"

    def cancel(self, slot: int) -> None:
        del self.left[slot]
        self.ended[slot] = "cancelled"

    def pop(self, slot: int) -> tuple[str, int]:
        return self.ended.pop(slot), self.made.pop(slot)

    @property
    def finished(self) -> list[int]:
        return sorted(self.ended)

    @property
    def free(self) -> int:
        return self.capacity - len(self.left) - len(self.ended)

    @property
    def done(self) -> bool:
        return not self.left


def _wait_idle(b: batcher.Batcher) -> None:
    deadline = time.time() + 10
    while b.in_flight and time.time() < deadline:
        time.sleep(0.01)
    assert b.in_flight == 0


def test_batcher_admits_up_to_the_limit_then_refuses_and_recovers() -> None:
    gate = threading.Event()
    finished: list[Any] = []
    session = CountingSession(2, gate)
    b = batcher.Batcher(session, lambda j: j.payload, finished.append, max_queue_size=3)
    jobs = [batcher.Job(payload=2, is_cancelled=lambda: False, streaming=False) for _ in range(6)]
    assert [b.admit(j) for j in jobs[:5]] == [None] * 5
    assert b.admit(jobs[5]) == (
        "server busy: 5 requests in flight, limit max_batch_size 2 + triton.max_queue_size 3; retry later"
    )
    gate.set()
    for j in jobs[:5]:
        assert j.done.wait(10)
    assert [j.result for j in finished] == [("length", 2)] * 5
    assert max(len(active) for active in session.log) == 2  # never more than the session's capacity
    _wait_idle(b)
    assert b.admit(jobs[5]) is None  # room again
    assert jobs[5].done.wait(10)
    b.close()


def test_batcher_new_job_joins_the_running_batch_at_the_next_step() -> None:
    """In-flight batching: a job admitted while a long one runs is stepped together with it from the next step
    on, and finishes long before it; its slot is then free for the next job."""
    session = CountingSession(2, delay=0.002)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2)
    long = batcher.Job(payload=400, is_cancelled=lambda: False, streaming=True)
    short = batcher.Job(payload=3, is_cancelled=lambda: False, streaming=True)
    assert b.admit(long) is None
    while len(session.log) < 5:
        time.sleep(0.001)
    assert b.admit(short) is None
    assert short.done.wait(10) and not long.done.is_set()
    assert short.result == ("length", 3)
    joined = next(k for k, active in enumerate(session.log) if active == [0, 1])
    assert joined >= 5 and session.log[joined + 2] == [0, 1]  # three steps together, then long alone
    assert long.done.wait(10) and long.result == ("length", 400)
    b.close()


def test_batcher_cancelled_job_leaves_the_batch_and_frees_its_slot() -> None:
    session = CountingSession(1, delay=0.001)
    flag = threading.Event()
    finished: list[batcher.Job] = []
    b = batcher.Batcher(session, lambda j: j.payload, finished.append, max_queue_size=2)
    running = batcher.Job(payload=10**5, is_cancelled=flag.is_set, streaming=True)
    waiting = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=True)
    assert b.admit(running) is None and b.admit(waiting) is None
    while len(session.log) < 3:
        time.sleep(0.001)
    flag.set()  # the client cancels: the sequence stops at the next step and the queued job gets the slot
    assert running.done.wait(10) and waiting.done.wait(10)
    assert running.cancelled and running.result[0] == "cancelled" and running.result[1] < 10**5
    assert waiting.result == ("length", 2) and finished == [running, waiting]
    b.close()


def test_batcher_skips_jobs_cancelled_while_queued() -> None:
    session = CountingSession(4)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=4)
    j = batcher.Job(payload=5, is_cancelled=lambda: True, streaming=True)
    assert b.admit(j) is None and j.done.wait(10)
    assert j.cancelled and j.result is None and session.log == []
    b.close()


def test_batcher_engine_error_fails_the_running_jobs_and_serves_the_next() -> None:
    class Failing(CountingSession):
        def step(self) -> None:
            if 666 in self.left.values():
                raise RuntimeError("boom")
            super().step()

    session = Failing(2)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2)
    bad = batcher.Job(payload=666, is_cancelled=lambda: False, streaming=False)
    assert b.admit(bad) is None and bad.done.wait(10)
    assert (bad.error, bad.error_code, bad.result) == ("engine error: RuntimeError: boom", "INTERNAL", ("cancelled", 0))
    ok = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=False)
    assert b.admit(ok) is None and ok.done.wait(10) and ok.result == ("length", 2)
    b.close()


def test_batcher_deadline_ends_running_and_queued_jobs_and_reports_the_counts() -> None:
    """A job past triton.request_deadline_s ends with UNAVAILABLE, whether it holds a slot or waits for one;
    on_count(in_flight, queued) follows every change."""
    session = CountingSession(1, delay=0.001)
    counts: list[tuple[int, int]] = []
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2, deadline_s=0.3,
                        on_count=lambda n, q: counts.append((n, q)))
    running, queued = (batcher.Job(payload=10**6, is_cancelled=lambda: False, streaming=True) for _ in range(2))
    assert b.admit(running) is None and b.admit(queued) is None
    assert running.done.wait(10) and queued.done.wait(10)
    for j in (running, queued):
        assert j.expired and j.error_code == "UNAVAILABLE" and j.error == (
            "request ended after the server's deadline of 0.3 s (triton.request_deadline_s); raise it for longer "
            "generations")
    assert running.result[0] == "cancelled" and 0 < running.result[1] < 10**6  # it held the slot, then left it
    assert queued.result is None  # never got the slot
    assert (2, 1) in counts and counts[-1] == (0, 0)
    b.close()


class SlowAdmitSession(CountingSession):
    """CountingSession whose `add` (the prefill) takes `add_delay` seconds."""

    def __init__(self, capacity: int, add_delay: float) -> None:
        super().__init__(capacity, delay=0.001)
        self.add_delay = add_delay

    def add(self, request: int) -> int:
        time.sleep(self.add_delay)
        return super().add(request)


def test_batcher_request_queued_behind_vanished_clients_is_served_not_expired() -> None:
    """Two vanished clients take both free slots (their prefills take 0.5 s each), a live request arrives 0.4 s
    later and queues. The slot holders keep their arrival clocks (they never waited for a slot), so they expire at
    1.0 s, before the live request's queue bound (1.4 s): it gets a slot, its clock restarts, and it is served.
    With the slot clock restarting at every admission the holders expired at 1.5 / 2.0 s and the live request at
    1.4 s, while queued."""
    session = SlowAdmitSession(2, add_delay=0.5)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2, deadline_s=1.0)
    vanished = [batcher.Job(payload=10**6, is_cancelled=lambda: False, streaming=True) for _ in range(2)]
    live = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=True)
    assert all(b.admit(j) is None for j in vanished)
    time.sleep(0.4)
    assert b.admit(live) is None
    assert live.done.wait(10) and all(j.done.wait(10) for j in vanished)
    assert all(j.expired and j.error_code == "UNAVAILABLE" for j in vanished)
    assert not vanished[0].waits_for_slot and not vanished[1].waits_for_slot and live.waits_for_slot
    assert live.error is None and not live.expired and live.result == ("length", 2)
    b.close()


# ---- cancellation: a `stop` request marks its job (models/reference_llm.py _stop_job) --------------------------


def test_a_job_marked_cancelled_leaves_at_the_next_step_and_frees_the_slot() -> None:
    """What the LLM model's stop handler does (Job.cancelled = True, for the job with the stopped request id): the
    running job leaves the batch at the next step and the queued one gets its slot and runs to its end."""
    session = CountingSession(1, delay=0.001)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2, deadline_s=60)
    running = batcher.Job(payload=10**5, is_cancelled=lambda: False, streaming=True)
    waiting = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=True)
    assert b.admit(running) is None and b.admit(waiting) is None
    while len(session.log) < 3:
        time.sleep(0.001)
    assert not waiting.done.is_set()  # one slot: it waits behind the running job
    running.cancelled = True
    assert running.done.wait(10) and waiting.done.wait(10)
    assert running.cancelled and not running.expired and running.result[0] == "cancelled"
    assert waiting.result == ("length", 2)
    assert b.in_flight == 0
    b.close()
