"""Abandoned streams on the real tritonserver (the shared tiny reference build): a client that opens a stream, reads
one chunk and goes away (cancels its gRPC stream, is killed so its connection drops, or drops an HTTP
generate_stream connection) has its request cancelled and its slot freed, through every entry model, with or
without a stop_key and whatever its request id (bench/bench_abandon.py; docs/deploy.md "Abandoned streams")."""

from __future__ import annotations

import secrets
import threading
import time

import pytest

from bench import bench_abandon as B
from testkit.triton_build import MAX_INPUT, MAX_SEQ
from testkit.triton_servers import metric
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server
LONGEST = MAX_SEQ - MAX_INPUT  # far more tokens than the wait below lets the tiny model make: only a cancel ends it


def _idle(srv: TritonServer, wait_s: float = 90) -> float:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and metric(srv, "eagle_llm_requests_in_flight") > 0:
        time.sleep(0.05)
    return metric(srv, "eagle_llm_requests_in_flight")


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("way", ["cancel", "kill", "http"])
def test_an_abandoned_stream_is_cancelled_and_frees_its_slot(triton_server: TritonServer, model: str,
                                                              way: str) -> None:
    assert _idle(triton_server) == 0
    before = metric(triton_server, "eagle_llm_requests_cancelled_total")
    for stop_key in (False, True):  # a client of ours sends one, a bare client none: both are cancelled
        B.leave(triton_server, model, LONGEST, way, stop_key)
    assert _idle(triton_server) == 0
    assert metric(triton_server, "eagle_llm_requests_cancelled_total") == before + 2


def test_abandoned_streams_sharing_an_id_or_without_one_are_each_cancelled(triton_server: TritonServer) -> None:
    """Keyless ensemble streams under one guessable id, under a fresh id shared by two, and over HTTP, left at
    the same time: each is cancelled by its own handle, whatever the others do with the same id."""
    assert _idle(triton_server) == 0
    before = metric(triton_server, "eagle_llm_requests_cancelled_total")
    shared = secrets.token_hex(8)
    calls = [lambda: B.leave_grpc(triton_server, "ensemble", LONGEST, False, request_id="1")] * 2 + [
        lambda: B.leave_grpc(triton_server, "ensemble", LONGEST, False, request_id=shared),
        lambda: B.leave_grpc(triton_server, "ensemble", LONGEST, True, request_id=shared),
        lambda: B.leave_http(triton_server, "ensemble", LONGEST, False),
    ]
    threads = [threading.Thread(target=f) for f in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert _idle(triton_server) == 0
    assert metric(triton_server, "eagle_llm_requests_cancelled_total") == before + len(calls)
