"""One bad request never hurts another, on the real tritonserver (the shared tiny reference build,
testkit/triton_build.py): bad parameters and token ids are refused before they join a batch, required inputs are
required through every entry model, a server-side deadline ends what a vanished client leaves behind, and the LLM
model's custom metrics (in flight, queued, accepted / drafted tokens) have the right values."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from testkit import triton_build
from tests.test_triton_server import _stop_inputs, _wait_idle
from testkit.triton_requests import PROMPT, infer_input, inputs, stream_call, text_of
from testkit.triton_servers import metric
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server
N = 40  # tokens of the good requests (end_id -1: none ends early)


@pytest.fixture(scope="module")
def engine(triton_build_dir: Path) -> Any:
    from engines.api import ReferenceEngine

    return ReferenceEngine.from_build(triton_build_dir, device="cpu")


def solo_ids(engine: Any, prompt_ids: list[int], n: int) -> list[int]:
    """The engine alone, greedy, no end token (as end_id -1 on the server)."""
    from engines.api import GenerationRequest, SamplingParams

    [res] = engine.generate([GenerationRequest(prompt_ids, n, SamplingParams(), [-1])])
    return res.output_ids


def _ids_input(name: str, ids: list[int]) -> Any:
    arr = np.array([ids], dtype=np.int32)
    i = tritonclient_grpc.InferInput(name, list(arr.shape), "INT32")
    i.set_data_from_numpy(arr)
    return i


def llm_inputs(ids: list[int], n: int, **extra: tuple[Any, str]) -> list[Any]:
    """A request to the tensorrt_llm model itself (token ids in and out)."""
    ins = [_ids_input("input_ids", ids), infer_input("input_lengths", len(ids), "INT32"),
           infer_input("request_output_len", n, "INT32"), infer_input("streaming", True, "BOOL")]
    return ins + [infer_input(k, v, dt) for k, (v, dt) in extra.items()]


def _call(url: str, model: str, ins: list[Any], results: dict[str, Any], key: str) -> None:
    c = tritonclient_grpc.InferenceServerClient(url)
    try:
        results[key] = stream_call(c, model, ins)
    except InferenceServerException as e:
        results[key] = e
    finally:
        c.close()


# ---- isolation -----------------------------------------------------------------------------------------------------

POISON = {"temperature": (float("nan"), "FP32"), "top_k": (5, "INT32")}
# A finite, positive temperature that passes every check but overflows logits / temperature to inf, so the sampler
# meets NaN probabilities inside the batched step: an engine fault of one sequence.
TINY_T = 1e-45
ENGINE_FAULT = "engine error: RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"


def test_poisoned_requests_beside_good_streams_fail_alone_and_the_good_outputs_equal_their_solo_runs(
    triton_server: TritonServer, engine: Any
) -> None:
    """temperature=NaN with top_k=5 through ensemble and BLS, input_ids 1e8 and -7 to tensorrt_llm, sent while three
    good greedy streams (one per entry model) are decoding: each is refused with its message before it joins the
    batch; a request that joins and then fails inside the step (TINY_T) ends alone with the engine's error; each
    good request gets its solo output."""
    _wait_idle(triton_server)
    tok = engine.tokenizer
    prompt_ids = tok.encode(PROMPT, add_special_tokens=True)
    good = {
        "ensemble": ("ensemble", inputs(PROMPT, N, end_id=(-1, "INT32"), exclude_input_in_output=(True, "BOOL"))),
        "bls": ("tensorrt_llm_bls", inputs(PROMPT, N, end_id=(-1, "INT32"), stream=(True, "BOOL"))),
        "llm": ("tensorrt_llm", llm_inputs(prompt_ids, N, end_id=(-1, "INT32"))),
    }
    bad = {
        "ensemble_nan": ("ensemble", inputs(PROMPT, N, stream=(True, "BOOL"), **POISON)),
        "bls_nan": ("tensorrt_llm_bls", inputs(PROMPT, N, stream=(True, "BOOL"), **POISON)),
        "llm_nan": ("tensorrt_llm", llm_inputs(prompt_ids, N, temperature=POISON["temperature"],
                                               runtime_top_k=POISON["top_k"])),
        "ensemble_tiny_t": ("ensemble", inputs(PROMPT, N, temperature=(TINY_T, "FP32"), top_k=(5, "INT32"))),
        "llm_huge_id": ("tensorrt_llm", llm_inputs(prompt_ids[:2] + [100_000_000], N)),
        "llm_negative_id": ("tensorrt_llm", llm_inputs([-7] + prompt_ids[1:], N)),
    }
    results: dict[str, Any] = {}
    threads = {k: threading.Thread(target=_call, args=(triton_server.grpc_url, m, ins, results, k))
               for k, (m, ins) in {**good, **bad}.items()}
    for k in good:
        threads[k].start()
    deadline = time.time() + 60  # the bad requests arrive while the good ones are in the batch
    while metric(triton_server, "eagle_llm_requests_in_flight") < len(good) and time.time() < deadline:
        time.sleep(0.01)
    for k in bad:
        threads[k].start()
    for t in threads.values():
        t.join(timeout=300)
    expected = {
        "ensemble_nan": "temperature=nan must be a finite number >= 0",
        "bls_nan": "temperature=nan must be a finite number >= 0",
        "llm_nan": "temperature=nan must be a finite number >= 0",
        "ensemble_tiny_t": ENGINE_FAULT,
        "llm_huge_id": f"input_ids[2]=100000000 is out of range: token ids must be in [0, {engine.vocab_size})",
        "llm_negative_id": f"input_ids[0]=-7 is out of range: token ids must be in [0, {engine.vocab_size})",
    }
    for k, message in expected.items():
        assert isinstance(results[k], InferenceServerException), (k, results[k])
        assert message in results[k].message(), (k, results[k].message())
    ids = solo_ids(engine, prompt_ids, N)
    assert results["ensemble"][0]["text_output"].reshape(-1)[0].decode() == tok.decode(ids, skip_special_tokens=True)
    assert text_of(results["bls"]) == tok.decode(ids, skip_special_tokens=True)
    assert [int(x) for r in results["llm"] for x in r["output_ids"].reshape(-1)] == ids
    _wait_idle(triton_server)


def test_a_sequence_that_fails_in_the_engine_ends_alone_with_internal(triton_build_dir: Path, engine: Any) -> None:
    """The Triton model's batcher over a real engine session: a fault while stepping one sequence ends that job
    with INTERNAL and the engine's message; the others finish."""
    from engines.api import GenerationRequest, SamplingParams
    from triton_repo.models.batcher import Batcher, Job

    finished: list[Job] = []
    session = engine.session(3, 200)
    batcher = Batcher(session, lambda job: job.payload, finished.append, max_queue_size=4)
    reqs = [GenerationRequest([5, 6, 7], 30, SamplingParams(temperature=t, top_k=5, seed=1), [-1])
            for t in (0.7, TINY_T, 0.7)]
    jobs = [Job(payload=r, is_cancelled=lambda: False, streaming=False) for r in reqs]
    try:
        for j in jobs:
            assert batcher.admit(j) is None
        for j in jobs:
            assert j.done.wait(120)
    finally:
        batcher.close()
    assert jobs[1].error_code == "INTERNAL" and jobs[1].error is not None
    assert jobs[1].error == ENGINE_FAULT
    for j in (jobs[0], jobs[2]):
        assert j.error is None and j.result.finish_reason == "length" and len(j.result.output_ids) == 30


# ---- required inputs -----------------------------------------------------------------------------------------------

MISSING = [
    ([("text_input", PROMPT, "BYTES"), ("stream", True, "BOOL")], "input max_tokens is required"),
    (
        [("text_input", PROMPT, "BYTES"), ("stream", False, "BOOL"), ("end_id", 2, "INT32")],
        "input max_tokens is required",
    ),
    ([("max_tokens", 4, "INT32"), ("stream", True, "BOOL")], "input text_input is required"),
]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_request_without_text_input_or_max_tokens_is_refused_naming_it(
    triton_server: TritonServer, model: str
) -> None:
    """Triton 2.51 counts inputs only: with another optional input sent, the ensemble used to skip its steps and
    answer an empty success."""
    c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    for given, message in MISSING:
        with pytest.raises(InferenceServerException) as err:
            stream_call(c, model, [infer_input(*g) for g in given])
        assert message in err.value.message(), err.value.message()
    [ok] = stream_call(c, model, inputs(PROMPT, 2))
    assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)
    c.close()


def test_preprocessing_refuses_a_missing_required_input_with_invalid_argument(triton_server: TritonServer) -> None:
    c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    for ins, message in (([infer_input("QUERY", PROMPT, "BYTES")], "input max_tokens is required (send the number of "
                          "tokens to generate, shape [1, 1] INT32)"),
                         ([infer_input("REQUEST_OUTPUT_LEN", 4, "INT32"), infer_input("END_ID", 2, "INT32")],
                          "input text_input is required (send the prompt text")):
        with pytest.raises(InferenceServerException) as err:
            c.infer("preprocessing", ins)
        assert message in err.value.message() and err.value.status() == "StatusCode.INVALID_ARGUMENT"
    c.close()


# ---- metrics -------------------------------------------------------------------------------------------------------

COUNTERS = ("eagle_llm_target_forwards_total", "eagle_llm_accepted_draft_tokens_total", "eagle_llm_draft_tokens_total",
            "eagle_llm_generated_tokens_total")


def test_token_counters_match_the_request_perf_outputs_so_tau_can_be_graphed(
    triton_server: TritonServer, engine: Any
) -> None:
    _wait_idle(triton_server)
    before = {m: metric(triton_server, m) for m in COUNTERS}
    c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    [resp] = stream_call(c, "ensemble", inputs(PROMPT, 12, return_perf_metrics=(True, "BOOL")))
    c.close()
    from engines.api import GenerationRequest, SamplingParams

    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    [solo] = engine.generate([GenerationRequest(ids, 12, SamplingParams(), [engine.tokenizer.eos_token_id])])
    delta = {m: metric(triton_server, m) - before[m] for m in COUNTERS}
    assert delta["eagle_llm_accepted_draft_tokens_total"] == int(resp["total_accepted_draft_tokens"].reshape(-1)[0])
    assert delta["eagle_llm_draft_tokens_total"] == int(resp["total_draft_tokens"].reshape(-1)[0]) > 0
    assert delta["eagle_llm_target_forwards_total"] == solo.stats.target_forwards > 0
    assert delta["eagle_llm_generated_tokens_total"] == len(solo.output_ids)
    tau = 1 + delta["eagle_llm_accepted_draft_tokens_total"] / delta["eagle_llm_target_forwards_total"]
    assert tau == pytest.approx(solo.stats.tau)


def test_in_flight_and_queued_gauges_count_running_and_waiting_requests(triton_server: TritonServer) -> None:
    """max_batch_size + 2 long requests on max_batch_size slots: in flight 6, queued 2; 0 and 0 once they were
    stopped (tensorrtllm_backend's stop request, by request id)."""
    _wait_idle(triton_server)
    n, results = triton_build.MAX_BATCH + 2, {}
    ids = [f"held-{i}" for i in range(n)]
    keys = [{"stop_key": uuid.uuid4().hex} for _ in range(n)]  # what a stop must present

    def one(i: int) -> None:
        c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
        try:
            results[i] = stream_call(c, "tensorrt_llm", llm_inputs([5, 6, 7 + i], 300, end_id=(-1, "INT32")),
                                     request_id=ids[i], parameters=keys[i])
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        deadline, seen = time.time() + 120, (0.0, 0.0)
        while time.time() < deadline and seen != (n, 2):
            seen = (metric(triton_server, "eagle_llm_requests_in_flight"),
                    metric(triton_server, "eagle_llm_requests_queued"))
            time.sleep(0.05)
        assert seen == (n, 2)
    finally:
        stopper = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
        for rid, key in zip(ids, keys):
            stream_call(stopper, "tensorrt_llm", _stop_inputs(), request_id=rid, parameters=key)
        stopper.close()
        for t in threads:
            t.join(120)
    _wait_idle(triton_server)
    assert metric(triton_server, "eagle_llm_requests_queued") == 0
    assert all(sum(r["output_ids"].size for r in results[i]) < 300 for i in range(n))  # stopped, not finished


# ---- the deadline ----------------------------------------------------------------------------------------------------

DEADLINE_S = 0.5
FULL = triton_build.MAX_SEQ - 20
# Sampling the whole distribution: the random head's drafts are almost never accepted, so FULL tokens take FULL
# decoding steps (several ms each here), far beyond DEADLINE_S; a 2-token request takes two.
SLOW = {"stream": (True, "BOOL"), "end_id": (-1, "INT32"), "temperature": (1.0, "FP32"), "top_p": (1.0, "FP32")}


@pytest.fixture(scope="module")
def deadline_server(triton_build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shared build's repository rendered again with a short triton.request_deadline_s, on a server of its own."""
    from builders.config import load_config
    from builders.triton import render

    bc = load_config(triton_build_dir.parent / "tiny.yaml", [f"triton.request_deadline_s={DEADLINE_S}"])
    repo = tmp_path_factory.mktemp("deadline") / "triton_repo"
    render.render(bc, triton_build_dir, repo)
    log_dir = tmp_path_factory.mktemp("deadline_log")
    srv = triton_build.start_server(repo, log_dir)
    yield srv
    srv.stop(timeout_s=8)  # Triton 2.51 waits for the ensemble requests it leaked (see the test below)


def _abandon(url: str, ins: list[Any], results: list[int]) -> None:
    """An ensemble stream whose client vanishes (cancels) after its first chunk."""
    c = tritonclient_grpc.InferenceServerClient(url)
    try:
        results.append(len(stream_call(c, "ensemble", ins, cancel_after=1)))
    finally:
        c.close()


def test_deadline_ends_what_a_vanished_client_leaves_behind(deadline_server: TritonServer) -> None:
    """What no chunk reveals (a non-streaming ensemble request sends one response, at the end) the deadline ends:
    a client that vanishes from one does not hold its slot past the deadline (counted expired, not cancelled),
    the freed slot serves the next request, and a client still waiting past the deadline gets the reason."""
    srv = deadline_server
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    c.start_stream(callback=lambda result, error: None)
    c.async_stream_infer("ensemble", inputs("abandon", FULL, **{**SLOW, "stream": (False, "BOOL")}))
    time.sleep(0.2)
    c.stop_stream(cancel_requests=True)
    deadline = time.time() + 60
    while time.time() < deadline and metric(srv, "eagle_llm_requests_expired_total") < 1:
        time.sleep(0.05)
    assert metric(srv, "eagle_llm_requests_expired_total") == 1
    assert metric(srv, "eagle_llm_requests_cancelled_total") == 0
    assert metric(srv, "eagle_llm_generated_tokens_total") < FULL
    _wait_idle(srv)
    [ok] = stream_call(c, "tensorrt_llm_bls", inputs(PROMPT, 2))  # the freed slots serve
    assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)
    with pytest.raises(InferenceServerException) as err:
        stream_call(c, "tensorrt_llm_bls", inputs(PROMPT, FULL, **{**SLOW, "stream": (False, "BOOL")}))
    assert f"request ended after the server's deadline of {DEADLINE_S:g} s (triton.request_deadline_s)" in (
        err.value.message()
    )
    # Python backend 24.10 limit: an error the LLM model sends after streamed chunks never reaches the BLS model's
    # response iterator, so a streaming BLS client sees its stream end early without the reason (docs/deploy.md).
    expired = metric(srv, "eagle_llm_requests_expired_total")
    assert isinstance(stream_call(c, "tensorrt_llm_bls", inputs(PROMPT, FULL, **SLOW)), list)  # ended, no error
    assert metric(srv, "eagle_llm_requests_expired_total") == expired + 1
    c.close()


def test_abandoned_ensemble_streams_are_ended_by_the_deadline_and_free_their_slots(
    deadline_server: TritonServer,
) -> None:
    """As many ensemble streams as slots, each abandoned by its client after its first chunk (a plain gRPC cancel,
    no stop request, no request id). Triton 2.51 does not pass an ensemble client's cancellation on; postprocessing
    relays a stop with the sequence handle the LLM model gave the request (docs/triton.md, "Cancellation"), and the
    deadline bounds whatever that misses: every one is counted cancelled or expired, none runs to its end, and a
    request sent afterwards is served."""
    srv = deadline_server
    names = (
        "eagle_llm_requests_cancelled_total",
        "eagle_llm_requests_expired_total",
        "eagle_llm_generated_tokens_total",
    )
    _wait_idle(srv)
    before = {m: metric(srv, m) for m in names}
    n, got = triton_build.MAX_BATCH, []
    threads = [
        threading.Thread(target=_abandon, args=(srv.grpc_url, inputs(f"abandon {i}", FULL, **SLOW), got))
        for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == [1] * n
    deadline = time.time() + 60
    while time.time() < deadline and metric(srv, names[0]) + metric(srv, names[1]) < \
            before[names[0]] + before[names[1]] + n:
        time.sleep(0.05)
    delta = {m: metric(srv, m) - before[m] for m in names}
    assert delta[names[0]] + delta[names[1]] == n, delta  # each ended once: cancelled (the relayed stop) or expired
    assert delta[names[2]] < n * FULL  # none ran to its end
    _wait_idle(srv)
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    [ok] = stream_call(c, "ensemble", inputs(PROMPT, 2))
    assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)
    c.close()
