"""Cancellation through the real ensemble of a tiny reference build, served by the bundled CPU tritonserver: its LLM
model counts cancelled requests and generated tokens, which shows whether a cancelled sequence was freed, and the
server's shutdown log shows a leaked ensemble request."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clients import loadtest
from clients import schema as sch
from clients.client import AsyncLLMClient, LLMClient
from clients.load import INTERRUPTED, LevelResult, LevelSpec
from clients.tokens import WhitespaceCounter
from testkit.triton_servers import STOP_TIMEOUT_S, metric, tiny_reference_repo
from testkit.triton_servers import server_on as _server
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server


# ---- cancellation through the real ensemble (docs/triton.md, "Cancellation") ---------------------------------------

LONG = 1000  # tokens of requests still running when cancelled, on a loaded machine too (end_id -1)
NO_EOS = {"end_id": -1}


@pytest.fixture(scope="module")
def llm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    return tiny_reference_repo(tmp_path_factory.mktemp("cancel_build"), "tiny-cancel", tiny_target, eagle_head,
                               max_seq_len=1100)


@pytest.fixture(scope="module")
def llm_server(llm_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The ensemble server. At shutdown Triton waits for in-flight inferences and logs "Model 'ensemble' (version
    1) has N in-flight inferences" while it does: a cancellation that leaked an ensemble request shows there."""
    log = tmp_path_factory.mktemp("cancel_log") / "server.log"
    srv = _server(llm_repo, log).start(timeout_s=300)
    try:
        deadline = time.time() + 30  # ready is answered before the metrics service has started (~40 ms later)
        while True:
            try:
                urllib.request.urlopen(srv.metrics_url, timeout=5).read()
                break
            except OSError:
                assert time.time() < deadline, f"no metrics at {srv.metrics_url}"
                time.sleep(0.1)
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
    leaked = re.findall(r"Model '[^']+' \(version \d+\) has \d+ in-flight inferences", log.read_text())
    assert not leaked, f"requests leaked: {sorted(set(leaked))}; log {log}"


def _counters(srv: TritonServer) -> dict[str, float]:
    return {
        "cancelled": metric(srv, "eagle_llm_requests_cancelled_total"),
        "tokens": metric(srv, "eagle_llm_generated_tokens_total"),
        "ensemble_ok": metric(srv, "nv_inference_request_success", model="ensemble"),
        "bls_ok": metric(srv, "nv_inference_request_success", model="tensorrt_llm_bls"),
        "in_flight": metric(srv, "eagle_llm_requests_in_flight"),
    }


def _settled(srv: TritonServer, before: dict[str, float], *, cancelled: int, ensemble_ok: int, bls_ok: int = 0,
             timeout_s: float = 30.0) -> dict[str, float]:
    """The counters' increments once they reach the expected ones (metrics lag the responses a little)."""
    want = {"cancelled": cancelled, "ensemble_ok": ensemble_ok, "bls_ok": bls_ok, "in_flight": 0}
    deadline = time.time() + timeout_s
    while True:
        now = _counters(srv)
        got = {k: now[k] - before[k] if k != "in_flight" else now[k] for k in (*want, "tokens")}
        if all(got[k] == v for k, v in want.items()) or time.time() > deadline:
            return got


def _wait_running(srv: TritonServer, n: int) -> None:
    """Until the LLM model holds n requests (so a stop request finds them there)."""
    deadline = time.time() + 60
    while metric(srv, "eagle_llm_requests_in_flight") < n:
        assert time.time() < deadline, f"{n} requests never reached the LLM model"
        time.sleep(0.05)


def test_sync_client_closing_an_ensemble_stream_stops_its_sequence(llm_server: TritonServer) -> None:
    """Closing the iterator after one chunk: the client stops the sequence through the LLM model named in the
    served ensemble config and reads the stream to its end. The model counts a cancellation and generates far
    fewer than the requested tokens, the ensemble request completes (no leak), and the client's stream is clean
    for the next request."""
    before = _counters(llm_server)
    with LLMClient(llm_server.grpc_url) as c:
        assert c.schema.extra == {}  # fetched from the server: the stop model comes from its ensemble config
        it = c.stream("stop me", LONG, **NO_EOS)
        assert next(it).text
        it.close()  # returns once the ensemble request has ended
        stopped = c.last_stats.request_id
        got = _settled(llm_server, before, cancelled=1, ensemble_ok=1)
        assert (got["cancelled"], got["ensemble_ok"], got["in_flight"]) == (1, 1, 0), got
        assert 1 <= got["tokens"] < LONG, got
        after = c.generate("next", 3, **NO_EOS)  # same stream: its own response only, nothing stale
        assert after.stats.responses == 1 and c.last_stats.request_id != stopped
    assert _settled(llm_server, before, cancelled=1, ensemble_ok=2)["ensemble_ok"] == 2


def test_async_cancel_and_break_stop_the_ensemble_sequence(llm_repo: Path, llm_server: TritonServer) -> None:
    """Schema from client.json (its `llm_model` names the stop target). A task cancelled (twice) and an iterator
    left with `break` (closed by aclosing) each stop their sequence; both ensemble requests complete."""
    schema = sch.from_descriptor(llm_repo)
    assert schema.extra["llm_model"] == "tensorrt_llm"
    before = _counters(llm_server)

    async def go() -> None:
        async with AsyncLLMClient(llm_server.grpc_url, schema) as c:
            first = asyncio.Event()

            async def consume() -> None:
                async for _chunk in c.stream("cancel me", LONG, **NO_EOS):
                    first.set()

            task = asyncio.ensure_future(consume())
            await asyncio.wait_for(first.wait(), 60)
            task.cancel()
            for _ in range(3):  # into the stop + drain: a second cancel must not abort it (that would leak)
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # propagates only once the request has ended
            async with contextlib.aclosing(c.stream("break me", LONG, **NO_EOS)) as chunks:
                async for _chunk in chunks:
                    break

    asyncio.run(go())
    got = _settled(llm_server, before, cancelled=2, ensemble_ok=2)
    assert (got["cancelled"], got["ensemble_ok"], got["in_flight"]) == (2, 2, 0), got
    assert 2 <= got["tokens"] < 2 * LONG, got


def _level(url: str, repo: Path, spec: LevelSpec, timeout_s: float, stop: asyncio.Event | None = None,
           on_running: Callable[[], None] | None = None) -> LevelResult:
    async def go() -> LevelResult:
        event = stop or asyncio.Event()
        async with AsyncLLMClient(url, sch.from_descriptor(repo), timeout_s=timeout_s) as c:
            run = asyncio.ensure_future(
                loadtest.run_level(c, ["one two three"], WhitespaceCounter(), spec, event, progress=False)
            )
            if on_running is not None:
                await asyncio.to_thread(on_running)
                event.set()  # what the CLI's SIGINT handler does
            return await run

    return asyncio.run(go())


def test_loadtest_deadline_stops_ensemble_sequences(llm_repo: Path, llm_server: TritonServer) -> None:
    """Requests past the client deadline are stopped on the server before DEADLINE_EXCEEDED is counted."""
    spec = LevelSpec(mode="concurrency", level=2, max_tokens=LONG, stream=True, requests=2, sampling=NO_EOS)
    before = _counters(llm_server)
    result = _level(llm_server.grpc_url, llm_repo, spec, timeout_s=0.3)  # a whole request takes seconds
    assert [r.status for r in result.records] == ["DEADLINE_EXCEEDED"] * 2, [r.error for r in result.records]
    got = _settled(llm_server, before, cancelled=2, ensemble_ok=2)
    assert (got["cancelled"], got["ensemble_ok"], got["in_flight"]) == (2, 2, 0), got
    assert got["tokens"] < 2 * LONG, got


def test_loadtest_interrupt_stops_ensemble_sequences(llm_repo: Path, llm_server: TritonServer) -> None:
    """Ctrl-C (the stop event its handler sets) while two requests generate: both are stopped and drained before
    the level returns; their records say INTERRUPTED with no stop failure."""
    spec = LevelSpec(mode="concurrency", level=2, max_tokens=LONG, stream=True, duration_s=120, sampling=NO_EOS)
    before = _counters(llm_server)
    result = _level(llm_server.grpc_url, llm_repo, spec, timeout_s=120,
                    on_running=lambda: _wait_running(llm_server, 2))
    assert result.interrupted
    assert [(r.status, r.error) for r in result.records] == [(INTERRUPTED, "run interrupted before the response")] * 2
    got = _settled(llm_server, before, cancelled=2, ensemble_ok=2)  # already done when the level returned
    assert (got["cancelled"], got["ensemble_ok"], got["in_flight"]) == (2, 2, 0), got
    assert got["tokens"] < 2 * LONG, got


def test_bls_streams_are_cancelled_plainly(llm_server: TritonServer) -> None:
    """Through the BLS model a plain gRPC cancel works (the BLS model forwards it): no stop request is needed and
    the client sends none (the BLS config is a python model, no ensemble)."""
    before = _counters(llm_server)
    with LLMClient(llm_server.grpc_url, model="tensorrt_llm_bls") as c:
        it = c.stream("cancel me", LONG, **NO_EOS)
        assert next(it).text
        it.close()
        assert c.aio._stop_model is not None and c.aio._stop_model.result() is None  # resolved: no stop model
    got = _settled(llm_server, before, cancelled=1, ensemble_ok=0, bls_ok=1)
    assert (got["cancelled"], got["ensemble_ok"], got["in_flight"]) == (1, 0, 0), got
    assert got["tokens"] < LONG, got
