"""One cancellation path per entry model (docs/triton.md, "Cancellation"), on the real CPU tritonserver serving a tiny
reference build. Every sequence slot held, the next request waits in the queue; the entry model's one mechanism
frees the cancelled request's slot and the next request gets it while the other holders still run. The ensemble's one
mechanism is the `stop` request by id and stop_key, sent by our client, or by postprocessing when a streaming client
went away (models/stop_relay.py), presenting the client's stop_key or, without one, the LLM model's handle for that
request (contract.HANDLE_OUTPUT). The old side channel is gone: no cancel handle travels (configs, and Triton refuses
the input). The
`llmapi` entry model: tests/test_triton_llmapi.py; the `pytorch` LLM model's stop request:
tests/test_triton_llmapi_model.py."""

from __future__ import annotations

import asyncio
import queue
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tritonclient_grpc
from tritonclient.utils import InferenceServerException

from clients.aio import AsyncLLMClient
from testkit.triton_requests import inputs, stream_call
from testkit.triton_servers import STOP_TIMEOUT_S, metric, tiny_reference_repo
from testkit.triton_servers import server_on as _server
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server
SLOTS = 4  # engine.max_batch_size of tiny_reference_repo
LONG = 1000  # tokens of the requests that hold a slot (end_id -1: no early EOS); they are cancelled long before
NO_EOS = {"end_id": -1}
RAW_NO_EOS = {"stream": (True, "BOOL"), "end_id": (-1, "INT32")}


@pytest.fixture(scope="module")
def full_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path
) -> Iterator[TritonServer]:
    root = tmp_path_factory.mktemp("cancel_paths")
    repo = tiny_reference_repo(root, "tiny-cancel-paths", tiny_target, eagle_head, max_seq_len=1100, max_queue_size=1)
    srv = _server(repo, root / "server.log").start(timeout_s=300)
    try:
        _wait_metric(srv, "eagle_llm_requests_in_flight", 0)  # ready is answered before the metrics service runs
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
    log = (root / "server.log").read_text()
    leaked = re.findall(r"Model '[^']+' \(version \d+\) has \d+ in-flight inferences", log)
    assert not leaked, f"requests leaked: {sorted(set(leaked))}"


def _wait_metric(srv: TritonServer, name: str, value: float, timeout_s: float = 60.0, **labels: str) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            if metric(srv, name, **labels) == value:
                return
        except OSError:
            pass
        assert time.time() < deadline, f"{name} never reached {value}: {metric(srv, name, **labels)}"
        time.sleep(0.05)


class _RawStream:
    """One request on a gRPC stream of its own from tritonclient (no stop request, no drain): what any client does."""

    def __init__(self, url: str, model: str, ins: list[Any], request_id: str = "", key: str | None = None) -> None:
        self.client = tritonclient_grpc.InferenceServerClient(url)
        self.q: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))
        self.client.async_stream_infer(model, ins, request_id=request_id, enable_empty_final_response=True,
                                       parameters=None if key is None else {"stop_key": key})

    def first_chunk(self) -> None:
        result, error = self.q.get(timeout=120)
        assert error is None, error
        assert result.get_response().outputs

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


async def _slot_freed_by(srv: TritonServer, c: AsyncLLMClient, victim: Any) -> str:
    """Every slot held (SLOTS - 1 ensemble holders and `victim`, whose first chunk arrived), the next request queues;
    `victim.cancel()` (the entry model's mechanism) must give it a slot while the holders still run. Returns its
    text; the holders are then cancelled through the client (stop + drain)."""
    holders = []
    for i in range(SLOTS - 1):  # one at a time: Triton's own queue before the model holds one request
        holders.append(asyncio.ensure_future(c.generate(f"hold {i}", LONG, stream=True, **NO_EOS)))
        await asyncio.to_thread(_wait_metric, srv, "eagle_llm_requests_in_flight", i + 1)
    cancelled = metric(srv, "eagle_llm_requests_cancelled_total")
    try:
        await victim.open()
        await asyncio.to_thread(_wait_metric, srv, "eagle_llm_requests_in_flight", SLOTS)
        after = asyncio.ensure_future(c.generate("next", 3, **NO_EOS))
        await asyncio.to_thread(_wait_metric, srv, "eagle_llm_requests_queued", 1)  # it waits for a slot
        await victim.cancel()
        text = (await after).text
        assert not any(h.done() for h in holders)  # it got the victim's slot, not one a holder left
        assert metric(srv, "eagle_llm_requests_cancelled_total") == cancelled + 1
        return text
    finally:
        for h in holders:
            h.cancel()  # each stops its own sequence (the ensemble's mechanism)
        await asyncio.gather(*holders, return_exceptions=True)


class _ClientVictim:
    """An ensemble stream of our client; cancelled by closing it: `stop` to the LLM model, then drain."""

    def __init__(self, c: AsyncLLMClient) -> None:
        self.stream = c.stream("victim", LONG, **NO_EOS)

    async def open(self) -> None:
        await self.stream.__anext__()

    async def cancel(self) -> None:
        await self.stream.aclose()  # returns once the ensemble request has ended


class _RawVictim:
    """A stream of plain tritonclient to `model`; cancelled by cancelling the gRPC stream, nothing else."""

    def __init__(self, url: str, model: str, request_id: str = "", key: str | None = None) -> None:
        self.url, self.model, self.request_id, self.key = url, model, request_id, key

    async def open(self) -> None:
        self.raw = await asyncio.to_thread(
            _RawStream, self.url, self.model, inputs("victim", LONG, **RAW_NO_EOS), self.request_id, self.key)
        await asyncio.to_thread(self.raw.first_chunk)

    async def cancel(self) -> None:
        await asyncio.to_thread(self.raw.cancel)


def _run(srv: TritonServer, victim_of: Any) -> str:
    async def go() -> str:
        async with await AsyncLLMClient.connect(srv.grpc_url, "ensemble") as c:
            return await _slot_freed_by(srv, c, victim_of(c))

    cancelled = metric(srv, "eagle_llm_requests_cancelled_total")
    text = asyncio.run(go())
    _wait_metric(srv, "eagle_llm_requests_in_flight", 0)
    assert metric(srv, "eagle_llm_requests_cancelled_total") == cancelled + SLOTS  # victim + holders, all stopped
    return text


def test_ensemble_client_stop_frees_the_slot_and_the_next_request_gets_it(full_server: TritonServer) -> None:
    """Ensemble: the client sends tensorrtllm_backend's `stop` with its request's id to the LLM model and drains the
    stream (clients/aio.py)."""
    assert _run(full_server, _ClientVictim)


def test_ensemble_stream_that_goes_away_with_a_stop_key_is_stopped_by_postprocessing(full_server: TritonServer) -> None:
    """Ensemble: a plain tritonclient stream with a short id and a stop_key parameter, cancelled without any stop
    request (a client that goes away). Its next postprocessing steps arrive cancelled and postprocessing sends the
    LLM model the `stop` the client did not, with its key (models/stop_relay.py): the slot is freed and the queued
    request gets it."""
    assert _run(full_server, lambda c: _RawVictim(full_server.grpc_url, "ensemble", "7", uuid.uuid4().hex))


@pytest.mark.parametrize("same_key", [False, True])
def test_a_client_retrying_with_the_same_id_after_abandoning_leaks_no_slot(full_server: TritonServer,
                                                                          same_key: bool) -> None:
    """Three abandons of one request id, one after the other (with a fresh key each time, as our clients make, or
    with the same key): each is stopped by postprocessing, and the LLM model holds no request after each."""
    srv, rid, key = full_server, "retry-7", uuid.uuid4().hex
    _wait_metric(srv, "eagle_llm_requests_in_flight", 0)
    cancelled = metric(srv, "eagle_llm_requests_cancelled_total")
    for attempt in range(3):
        raw = _RawStream(srv.grpc_url, "ensemble", inputs("victim", LONG, **RAW_NO_EOS), rid,
                         key if same_key else uuid.uuid4().hex)
        raw.first_chunk()
        raw.cancel()
        _wait_metric(srv, "eagle_llm_requests_cancelled_total", cancelled + attempt + 1)
        _wait_metric(srv, "eagle_llm_requests_in_flight", 0)


def test_bls_plain_grpc_cancel_frees_the_slot_and_the_next_request_gets_it(full_server: TritonServer) -> None:
    """tensorrt_llm_bls: any client's plain gRPC cancel (here tritonclient's, no stop request) reaches the BLS model,
    which stops its LLM request by the id it minted."""
    assert _run(full_server, lambda c: _RawVictim(full_server.grpc_url, "tensorrt_llm_bls"))


def test_the_removed_ensemble_paths_are_gone_and_a_keyless_stream_is_stopped_by_its_handle(
        full_server: TritonServer) -> None:
    """No cancel handle of the old side channel in the served configs and Triton refuses one sent to
    postprocessing. Postprocessing relays only the `stop` by id and key: a plain gRPC cancel of an ensemble stream
    sent without a stop_key (whatever its id) is stopped with the LLM model's handle for that request, counted
    cancelled, and the ensemble request still completes."""
    srv = full_server
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    try:
        llm = c.get_model_config("tensorrt_llm", as_json=True)["config"]
        post = c.get_model_config("postprocessing", as_json=True)["config"]
        ens = c.get_model_config("ensemble", as_json=True)["config"]
        assert "cancel_handle" not in {o["name"] for o in llm["output"]}
        assert "CANCEL_HANDLE" not in {i["name"] for i in post["input"]}
        assert "sequence_handle" in {o["name"] for o in llm["output"]}
        assert {"name": "SEQUENCE_HANDLE", "optional": True} .items() <= next(
            i for i in post["input"] if i["name"] == "SEQUENCE_HANDLE").items()
        assert "sequence_handle" not in {o["name"] for o in ens["output"]}  # never returned to a client
        assert post["parameters"]["decoupled"]["string_value"] == "true"  # it relays stop requests (stop_relay.py)
        assert "CANCEL_HANDLE" not in str(ens["ensemble_scheduling"])
        tensors = []
        for name, arr in (
            ("TOKENS_BATCH", np.array([[[1, 2]]], np.int32)),
            ("SEQUENCE_LENGTH", np.array([[2]], np.int32)),
            ("CANCEL_HANDLE", np.array([[b"eagle-cancel-" + b"0" * 32 + b"/" + b"0" * 32]], object)),
        ):
            t = tritonclient_grpc.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else "INT32")
            t.set_data_from_numpy(arr)
            tensors.append(t)
        with pytest.raises(InferenceServerException) as refused:
            c.infer("postprocessing", tensors)
        assert "unexpected inference input 'CANCEL_HANDLE' for model 'postprocessing'" in refused.value.message()
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"

        names = ("eagle_llm_requests_cancelled_total", "eagle_llm_generated_tokens_total")
        n = 1000  # far more than the tiny model makes before the stop lands: only the stop ends it
        for request_id in ("", "req-7", uuid.uuid4().hex):  # no stop_key: the handle names it (stop_relay.py)
            before = {name: metric(srv, name) for name in names}
            ens_ok = metric(srv, "nv_inference_request_success", model="ensemble")
            ins = inputs("cancel me", n, **RAW_NO_EOS)
            got = stream_call(c, "ensemble", ins, cancel_after=1, request_id=request_id)
            assert len(got) == 1
            deadline = time.time() + 60
            while time.time() < deadline and metric(srv, "nv_inference_request_success", model="ensemble") <= ens_ok:
                time.sleep(0.05)
            assert metric(srv, "nv_inference_request_success", model="ensemble") == ens_ok + 1  # completed
            _wait_metric(srv, "eagle_llm_requests_in_flight", 0)
            assert metric(srv, names[0]) == before[names[0]] + 1  # stopped by postprocessing's relay
            assert metric(srv, names[1]) - before[names[1]] < n  # cut short
    finally:
        c.close()
