"""The gRPC status of refused requests on a real tritonserver (the CPU server bundled in nvidia-pytriton) serving the
tiny reference build: with the stream header triton_grpc_error=true a bad request closes its stream with
INVALID_ARGUMENT. One server of its own for the module (see KNOWN_GRPC_RACE)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from clients.client import GenerationError
from testkit import triton_build
from testkit.triton_build import MAX_SEQ
from testkit.triton_requests import BAD_REQUESTS, PROMPT, inputs, stream_call
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server


GRPC_STATUS = {"triton_grpc_error": "true"}
# Triton 2.51 (server r24.10) has a race in its gRPC stream handler between a request's completion and the stream's
# cancellation/close that can crash the server (SIGSEGV right after the log line below; server issue #8034, fixed by
# server PR #7840 from r24.12). Closing a stream with an error status (triton_grpc_error) hits it now and then, so
# these tests run on a server of their own: a crash there cannot take the other tests' server down, and it is
# reported as this known upstream crash (xfail), not hidden.
KNOWN_GRPC_RACE = "HandleCancellation called even when the context was not cancelled"


@pytest.fixture(scope="module")
def status_server(triton_build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log_dir = tmp_path_factory.mktemp("triton_status_log")
    srv, log = triton_build.start_server(triton_build_dir / "triton_repo", log_dir), log_dir / "tritonserver.log"
    yield srv
    code = srv.stop()
    if code != 0 and KNOWN_GRPC_RACE in log.read_text():
        return  # the known 2.51 crash; the test that met it was marked xfail with the log
    assert code == 0, f"tritonserver did not stop cleanly (exit {code}); log {log}"


@pytest.fixture()
def status_client(status_server: TritonServer) -> Any:
    c = tritonclient_grpc.InferenceServerClient(status_server.grpc_url)
    yield c
    c.close()


@contextlib.contextmanager
def known_grpc_race_is_xfail(srv: TritonServer) -> Iterator[None]:
    """Turn a failure caused by the known Triton 2.51 crash (server dead, KNOWN_GRPC_RACE in its log) into xfail."""
    try:
        yield
    except (AssertionError, InferenceServerException, GenerationError):
        time.sleep(0.5)
        if not srv.is_running() and KNOWN_GRPC_RACE in srv.log_path.read_text():
            pytest.xfail(f"Triton 2.51 gRPC stream race crashed the server (server #8034, fixed in r24.12): "
                         f"{srv.log_path}")
        raise


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_streamed_bad_request_with_triton_grpc_error_header_is_invalid_argument(
    status_server: TritonServer, status_client: Any, model: str
) -> None:
    """Triton >= 2.49 (server r24.10 src/grpc/stream_infer_handler.cc StreamInferResponseComplete, header parsed in
    src/grpc/infer_handler.h ExtractStateFromHeaders): with the stream header triton_grpc_error=true a response
    error closes the stream with its gRPC status code instead of an in-band message without one."""
    client = status_client
    with known_grpc_race_is_xfail(status_server):
        for text, max_tokens, extra, message in BAD_REQUESTS[:8]:  # errors the models raise
            with pytest.raises(InferenceServerException) as err:
                stream_call(client, model, inputs(text, max_tokens, **extra), headers=GRPC_STATUS)
            assert message in err.value.message(), (message, err.value.message())
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT", (message, err.value.status())
        [ok] = stream_call(client, model, inputs(PROMPT, 2), headers=GRPC_STATUS)  # a fresh stream serves again
        assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)


def test_request_rejected_before_any_model_runs_keeps_the_in_band_error_even_with_the_header(
    status_server: TritonServer, status_client: Any
) -> None:
    """Triton 2.51 applies triton_grpc_error only to response errors: a request the core refuses when it is enqueued
    (an undeclared input) still gets ModelStreamInferResponse.error_message without a status
    (stream_infer_handler.cc, the InferAsync failure branch of Process)."""
    text, max_tokens, extra, message = BAD_REQUESTS[8]
    with known_grpc_race_is_xfail(status_server):
        with pytest.raises(InferenceServerException) as err:
            stream_call(status_client, "ensemble", inputs(text, max_tokens, **extra), headers=GRPC_STATUS)
        assert message in err.value.message()
        assert err.value.status() is None


def test_async_client_with_grpc_status_reports_invalid_argument(status_server: TritonServer) -> None:
    """clients.client.AsyncLLMClient(grpc_status=True) (one stream per request, header triton_grpc_error) gives a
    bad request the status INVALID_ARGUMENT instead of SERVER_ERROR; the next request is served."""
    import asyncio

    from clients import schema as sch
    from clients.client import AsyncLLMClient

    async def run() -> tuple[str, str, str]:
        srv = status_server
        async with AsyncLLMClient(srv.grpc_url, sch.from_repository(srv.repo, "ensemble"), grpc_status=True) as c:
            try:
                await c.generate(PROMPT, MAX_SEQ)
            except GenerationError as e:
                status, message = e.status, e.message
            else:
                raise AssertionError("a request past max_seq_len was served")
            ok = await c.generate(PROMPT, 2)
            return status, message, ok.text

    with known_grpc_race_is_xfail(status_server):
        status, message, text = asyncio.run(run())
        assert status == "INVALID_ARGUMENT" and f"exceeds engine.max_seq_len={MAX_SEQ}" in message, (status, message)
        assert text
