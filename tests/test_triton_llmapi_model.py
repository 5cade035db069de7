"""The LLM-API python model (engine.backend pytorch, triton_repo/models/llmapi_llm.py) on the real tritonserver,
with a stand-in for the TensorRT-LLM LLM API (tests/fixtures/llmapi_standin: no GPU here), so its request,
streaming and cancellation paths run through the real ensemble: a stream delivers the model's tokens as text, and our
client cancelling an ensemble request (tensorrtllm_backend's `stop` with the request's id, then a drain) aborts its LLM
request, streaming or not; a plain gRPC cancel of an ensemble stream is relayed as that stop by postprocessing, with
the client's stop_key or the model's handle for the request (docs/triton.md, "Cancellation")."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from clients.aio import AsyncLLMClient
from clients.client import LLMClient

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

from builders.build import main as build_main
from tests.engine_cases import write_build_yaml
from testkit.triton_requests import inputs, stream_call
from testkit.triton_servers import server_on

pytestmark = pytest.mark.server
STANDIN = Path(__file__).parent / "fixtures" / "llmapi_standin"
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def llmapi_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pytorch-backend build of a tiny 4-layer target + EAGLE-3 head (as tests/test_triton_render.py), all stages."""
    from testkit import tiny_models as tm

    root = tmp_path_factory.mktemp("llmapi_model")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    head_cfg = json.loads((head / "config.json").read_text())
    head_cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # TensorRT-LLM needs three distinct layers
    (head / "config.json").write_text(json.dumps(head_cfg))
    cfg = write_build_yaml(root / "pt.yaml", output_dir=root / "build", target=target, head=head, draft="eagle3",
                           backend="pytorch", tree="chain-3", name="llmapi-model", version="1.2")
    assert build_main([str(cfg)]) == 0
    return root / "build" / "triton_repo"


@pytest.fixture(scope="module")
def llmapi_server(llmapi_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log_dir = tmp_path_factory.mktemp("llmapi_model_log")
    # The stand-in goes next to the model: the python backend stub puts the model's version directory on sys.path.
    shutil.copytree(STANDIN / "tensorrt_llm", llmapi_repo / "tensorrt_llm" / "1" / "tensorrt_llm")
    mp = pytest.MonkeyPatch()
    mp.setenv("STANDIN_LLM_LOG", str(log_dir / "llm.log"))
    srv = server_on(llmapi_repo, log_dir / "tritonserver.log").start(timeout_s=240)
    mp.undo()  # the server has its environment
    yield srv, log_dir / "llm.log"
    assert srv.stop(timeout_s=20) == 0  # nothing left in flight


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.is_file() else []


def _tokenizer(repo: Path) -> Any:
    """The tokenizer the served preprocessing model loads (its tokenizer_dir parameter, relative to the repository)."""
    from google.protobuf import text_format
    from transformers import AutoTokenizer
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse((repo / "preprocessing" / "config.pbtxt").read_text(), mc.ModelConfig())
    return AutoTokenizer.from_pretrained(str((repo / cfg.parameters["tokenizer_dir"].string_value).resolve()))


def test_llmapi_model_streams_its_tokens_through_the_ensemble(llmapi_server: Any, llmapi_repo: Path) -> None:
    """Six chunks of one token each, every one detokenized alone by postprocessing (special tokens dropped)."""
    srv, log = llmapi_server
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    got = stream_call(c, "ensemble", inputs(PROMPT, 6, stream=(True, "BOOL")))
    c.close()
    tok = _tokenizer(llmapi_repo)
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]  # what preprocessing sends the LLM model
    want = [tok.decode([ids[i % len(ids)]], skip_special_tokens=True) for i in range(6)]
    assert [r["text_output"].reshape(-1)[0].decode() for r in got] == want
    assert _lines(log)[-1] == "finished 6"


def _one_new_line(log: Path, before: int) -> tuple[str, int]:
    deadline = time.time() + 30
    while time.time() < deadline and len(_lines(log)) == before:
        time.sleep(0.05)
    time.sleep(0.2)  # nothing else may follow
    [line] = _lines(log)[before:]
    kind, made = line.split()
    return kind, int(made)


def test_client_stop_aborts_the_llm_api_request_of_an_ensemble_stream(llmapi_server: Any) -> None:
    """Closing our client's stream after one chunk: the stop request reaches the LLM-API model, which aborts the
    request a few tokens in (400 tokens would take 4 s); the ensemble request completes (the server stops clean)."""
    srv, log = llmapi_server
    before = len(_lines(log))
    with LLMClient(srv.grpc_url) as c:
        it = c.stream(PROMPT, 400)
        assert next(it).text is not None
        it.close()  # returns once the ensemble request has ended
        kind, made = _one_new_line(log, before)
        assert kind == "aborted" and made < 50
        assert c.generate(PROMPT, 2).text is not None  # the server serves on


def test_client_stop_aborts_a_non_streaming_llm_api_request_at_once(llmapi_server: Any) -> None:
    """A non-streaming request sends nothing before its end; the stop aborts it anyway, not at its last output."""
    srv, log = llmapi_server
    before = len(_lines(log))

    async def go() -> None:
        async with await AsyncLLMClient.connect(srv.grpc_url, "ensemble") as c:
            task = asyncio.ensure_future(c.generate(PROMPT, 400))
            await asyncio.to_thread(_wait_in_flight, srv, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    kind, made = _one_new_line(log, before)
    assert kind == "aborted" and made < 300


def _wait_in_flight(srv: Any, n: int) -> None:
    from testkit.triton_servers import metric

    deadline = time.time() + 30
    while metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") != n:
        assert time.time() < deadline
        time.sleep(0.02)


def test_plain_grpc_cancel_of_an_ensemble_stream_is_relayed_with_or_without_a_stop_key(llmapi_server: Any) -> None:
    """A plain gRPC cancel of an ensemble stream (no stop request from the client): postprocessing sends the stop on
    its behalf (models/stop_relay.py), presenting the client's stop_key or, without one, the model's handle for that
    request, and the LLM-API request is aborted a few tokens in. A stop request without a key is refused."""
    srv, log = llmapi_server
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    try:
        for rid, params in (("1", {"stop_key": uuid.uuid4().hex}), ("1", None), ("", None)):
            before = len(_lines(log))
            ins = inputs(PROMPT, 400, stream=(True, "BOOL"))
            assert len(stream_call(c, "ensemble", ins, cancel_after=1, request_id=rid, parameters=params)) == 1
            kind, made = _one_new_line(log, before)
            assert kind == "aborted" and made < 400, (rid, params, kind, made)  # cut short
        stop = [tritonclient_grpc.InferInput(n, [1, 1], dt) for n, dt in
                (("input_ids", "INT32"), ("input_lengths", "INT32"), ("request_output_len", "INT32"), ("stop", "BOOL"))]
        for t in stop:
            t.set_data_from_numpy(np.ones((1, 1), bool if t.datatype() == "BOOL" else np.int32))
        with pytest.raises(InferenceServerException) as refused:
            stream_call(c, "tensorrt_llm", stop, request_id="1")
        assert "stop: no stop_key parameter" in refused.value.message()
    finally:
        c.close()


def test_llm_api_models_speculative_counters_equal_its_perf_outputs(llmapi_server: Any) -> None:
    """The counters on /metrics (triton_repo/models/spec_metrics.py) move by the request's perf outputs; forwards =
    tokens - 1 - accepted (the LLM API reports no forward count); nothing stays in flight."""
    from testkit.triton_servers import metric

    srv, _log = llmapi_server
    names = ("eagle_llm_accepted_draft_tokens_total", "eagle_llm_draft_tokens_total", "eagle_llm_target_forwards_total")
    before = {n: metric(srv, n, backend="pytorch", model="tensorrt_llm") for n in names}
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    [resp] = stream_call(c, "ensemble", inputs(PROMPT, 9, return_perf_metrics=(True, "BOOL")))
    c.close()
    delta = {n: metric(srv, n, backend="pytorch", model="tensorrt_llm") - before[n] for n in names}
    accepted = int(resp["total_accepted_draft_tokens"].reshape(-1)[0])
    assert delta["eagle_llm_accepted_draft_tokens_total"] == accepted > 0
    assert delta["eagle_llm_draft_tokens_total"] == int(resp["total_draft_tokens"].reshape(-1)[0])
    assert delta["eagle_llm_target_forwards_total"] == 9 - 1 - accepted
    assert metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") == 0
    assert metric(srv, "eagle_llm_speculation_enabled", model="tensorrt_llm") == 1
