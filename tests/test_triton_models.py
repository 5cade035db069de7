"""The serve-time Triton models' logic without a server: stop-word lists in TensorRT-LLM's format, the request parser
of the tensorrt_llm model (triton_repo/models/llm_io.py `parse_request`: every input, default and refusal; its
sampling rules and token-id checks; common.py), and the in-flight batcher
(triton_repo/models/batcher.py) over a counting stand-in for the engine session."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from core.types import Limits, SamplingParams
from engines.api import GenerationRequest
from testkit import tiny_models as tm
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
    assert (s.greedy, s.top_k, s.top_p, s.seed) == (greedy, k, top_p, 3)  # greedy keeps top_k for a backend


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


# ---- parse_request: the tensorrt_llm model's request validation, without a server ----------------------------
# `pb_utils` is Triton's own triton_python_backend_utils (the file the python backend stub imports; its
# get_input_tensor_by_name is pure Python over request.inputs()). The request carries the inputs as the stub's
# InferenceRequest does: objects with name() and as_numpy(). tests/test_triton_direct.py sends the same requests
# to a real server; these run the parser's every branch in milliseconds.

def _pb_utils() -> Any:
    import importlib.util

    found = importlib.util.find_spec("pytriton")  # the wheel's files, without importing the package
    assert found is not None and found.submodule_search_locations, "the nvidia-pytriton wheel is not installed"
    path = Path(found.submodule_search_locations[0]) / "tritonserver/backends/python/triton_python_backend_utils.py"
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WireTensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self._name, self._value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value


class WireRequest:
    def __init__(self, **inputs: Any) -> None:
        self._inputs = [WireTensor(k, v) for k, v in inputs.items() if v is not None]

    def inputs(self) -> list[WireTensor]:
        return self._inputs


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    d = tmp_path_factory.mktemp("tok")
    tm.make_tokenizer(d)
    return _pb_utils(), AutoTokenizer.from_pretrained(d)


def _i32(*v: int) -> np.ndarray:
    return np.array([list(v)], np.int32)


def _req(ids: list[int] | None = None, n_in: int | None = None, n_out: int = 3, **extra: Any) -> WireRequest:
    ids = [5, 6, 7] if ids is None else ids
    inputs = {"input_ids": np.array([ids], np.int32), "input_lengths": _i32(len(ids) if n_in is None else n_in),
              "request_output_len": _i32(n_out)}
    return WireRequest(**{**inputs, **extra})


def _parse(wire: tuple[Any, Any], request: Any, vocab: int | None = 320, decoupled: bool = True) -> llm_io.Parsed:
    pb_utils, tok = wire
    return llm_io.parse_request(pb_utils, request, Limits(max_batch_size=4, max_input_len=8, max_seq_len=12), vocab,
                                tok, decoupled)


def test_parse_request_defaults(wire: tuple[Any, Any]) -> None:
    p = _parse(wire, _req([5, 6, 7, 8], n_in=3, n_out=4))
    eos = wire[1].eos_token_id
    assert (p.prompt_ids, p.max_new_tokens, p.end_id, p.stop_strings) == ([5, 6, 7], 4, eos, [])
    # temperature 1.0 with top_k 0 and top_p 0 (the contract's defaults) is TensorRT-LLM's greedy
    assert p.sampling == SamplingParams(temperature=0.0, top_k=0, top_p=1.0, seed=0)
    assert (p.streaming, p.exclude_input, p.perf) == (False, False, False)
    r = p.request
    assert isinstance(r, GenerationRequest)
    assert (r.prompt_ids, r.max_new_tokens, r.sampling, r.stop_token_ids, r.stop_strings) == (
        [5, 6, 7], 4, p.sampling, [eos], [])


def test_parse_request_reads_every_input(wire: tuple[Any, Any]) -> None:
    tok = wire[1]
    word = tok.encode("ab")
    words = common.word_list([word, [9]])[None]
    p = _parse(wire, _req([1, 2, 3, 4, 5, 6, 7, 8], n_out=4, end_id=_i32(11), pad_id=_i32(0), stop_words_list=words,
                          temperature=np.array([[0.5]], np.float32), runtime_top_k=_i32(7),
                          runtime_top_p=np.array([[0.75]], np.float32), seed=np.array([[42]], np.uint64),
                          streaming=np.array([[True]]), exclude_input_in_output=np.array([[True]]),
                          return_perf_metrics=np.array([[True]])))
    assert (p.prompt_ids, p.max_new_tokens, p.end_id) == ([1, 2, 3, 4, 5, 6, 7, 8], 4, 11)
    assert p.stop_strings == [tok.decode(word), tok.decode([9])] and p.stop_strings[0] == "ab"
    assert p.sampling == SamplingParams(temperature=0.5, top_k=7, top_p=0.75, seed=42)
    assert (p.streaming, p.exclude_input, p.perf) == (True, True, True)
    assert (p.request.stop_token_ids, p.request.stop_strings, p.request.sampling) == ([11], p.stop_strings, p.sampling)
    # end_id -1: no token ends generation (TensorRT-LLM's convention), kept as -1
    assert _parse(wire, _req(end_id=_i32(-1))).end_id == -1
    # without vocab_size the engine checks prompt ids itself; end_id is still bounded by the tokenizer's size
    assert _parse(wire, _req([5, 10_000]), vocab=None).prompt_ids == [5, 10_000]
    assert _parse(wire, _req(end_id=_i32(len(tok) - 1)), vocab=None).end_id == len(tok) - 1
    with pytest.raises(common.RequestError, match=rf"^end_id={len(tok)} is out of range: token ids must be in "
                       rf"\[0, {len(tok)}\) or -1"):
        _parse(wire, _req(end_id=_i32(len(tok))), vocab=None)


SHAPE_FIX = "send one prompt per request, shape [1, n] (concurrent requests are batched by the server)"
VOCAB = "token ids must be in [0, 320)"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (WireRequest(input_lengths=_i32(1), request_output_len=_i32(1)), f"input_ids shape None: {SHAPE_FIX}"),
        (WireRequest(input_ids=np.array([5, 6], np.int32), input_lengths=_i32(2), request_output_len=_i32(1)),
         f"input_ids shape [2]: {SHAPE_FIX}"),
        (WireRequest(input_ids=np.array([[5], [6]], np.int32), input_lengths=_i32(1), request_output_len=_i32(1)),
         f"input_ids shape [2, 1]: {SHAPE_FIX}"),
        (_req(list(range(9)), n_out=1), "input_ids holds 9 ids > max_input_len=8; shorten it"),
        (_req([5, 6], n_in=0), "input_lengths=0 must be in 1..2 (the input_ids given)"),
        (_req([5, 6], n_in=3), "input_lengths=3 must be in 1..2 (the input_ids given)"),
        (_req([5, 320, 6], n_in=2), f"input_ids[1]=320 is out of range: {VOCAB} (the model's vocabulary)"),
        (_req([-1]), f"input_ids[0]=-1 is out of range: {VOCAB} (the model's vocabulary)"),
        (_req(n_out=0), "request_output_len (max_tokens)=0 must be >= 1"),
        (_req([1, 2, 3, 4, 5], n_out=8), ("prompt 5 + request_output_len (max_tokens) 8 exceeds engine.max_seq_len="
                                          "12; lower request_output_len (max_tokens) to at most 7")),
        (_req(beam_width=_i32(2)), "beam_width=2: only 1 is supported (speculative decoding has no beam search)"),
        (_req(end_id=_i32(320)), f"end_id=320 is out of range: {VOCAB} or -1 (no end token) (the model's vocabulary)"),
        (_req(end_id=_i32(-2)), f"end_id=-2 is out of range: {VOCAB} or -1 (no end token) (the model's vocabulary)"),
        (_req(pad_id=_i32(320)), f"pad_id=320 is out of range: {VOCAB} (the model's vocabulary)"),
        (_req(pad_id=_i32(-1)), f"pad_id=-1 is out of range: {VOCAB} (the model's vocabulary)"),
        (_req(stop_words_list=np.array([[5, 6]], np.int32)),
         "stop_words_list has shape [1, 2]; send [1, 2, L]: ids, then -1-padded end offsets"),
        (_req(stop_words_list=common.word_list([[5, 320]])[None]),
         f"stop_words_list[0][1]=320 is out of range: {VOCAB}"),
        (_req(temperature=np.array([[-1.0]], np.float32)),
         "temperature=-1.0 must be a finite number >= 0 (0 = greedy)"),
        (_req(request_output_len=np.array([[1, 1]], np.int32)),
         "input request_output_len has 2 values; send one, shape [1, 1]"),
    ],
)
def test_parse_request_refuses_each_input_with_its_message(
    wire: tuple[Any, Any], request_: WireRequest, message: str
) -> None:
    with pytest.raises(common.RequestError) as e:
        _parse(wire, request_)
    assert str(e.value) == message


def test_parse_request_limits_are_inclusive_and_stream_needs_a_decoupled_model(wire: tuple[Any, Any]) -> None:
    assert _parse(wire, _req(list(range(8)), n_out=4)).prompt_ids == list(range(8))  # max_input_len, max_seq_len
    assert _parse(wire, _req([5, 6], n_in=1)).prompt_ids == [5]
    assert _parse(wire, _req([0, 319])).prompt_ids == [0, 319]
    assert _parse(wire, _req(end_id=_i32(319), pad_id=_i32(319), beam_width=_i32(1))).end_id == 319
    assert _parse(wire, _req(pad_id=_i32(0))).end_id == wire[1].eos_token_id
    # the model's vocabulary (vocab_size, e.g. padded past the tokenizer's) bounds every id, not the tokenizer's size
    wide = _parse(wire, _req([330], end_id=_i32(383), pad_id=_i32(383),
                             stop_words_list=common.word_list([[383]])[None]), vocab=384)
    assert (wide.prompt_ids, wide.end_id) == ([330], 383) and len(wide.stop_strings) <= 1
    stream = _req(streaming=np.array([[True]]))
    with pytest.raises(common.RequestError, match=r"^stream=true but this repository is not decoupled \(rendered with "
                       r"triton\.streaming=false\); send stream=false or re-render with triton\.streaming=true$"):
        _parse(wire, stream, decoupled=False)
    assert _parse(wire, _req(streaming=np.array([[False]])), decoupled=False).streaming is False
    assert _parse(wire, stream).streaming is True


def test_stop_request_is_read_from_its_input(wire: tuple[Any, Any]) -> None:
    pb_utils, _ = wire
    assert llm_io.is_stop_request(pb_utils, WireRequest(stop=np.array([[True]])))
    assert not llm_io.is_stop_request(pb_utils, WireRequest(stop=np.array([[False]])))
    assert not llm_io.is_stop_request(pb_utils, WireRequest())
