"""A real tritonserver (the CPU server bundled in nvidia-pytriton) on a repository rendered by the build's
triton_repo stage for the tiny reference build (2-layer Llama + EAGLE-1 head, topk-2-2 tree). One server start for
the whole module. Contract: tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from testkit import triton_build
from testkit.triton_build import MAX_BATCH, MAX_QUEUE
from testkit.triton_requests import BAD_REQUESTS, PROMPT, infer_input, inputs, stream_call, text_of
from testkit.triton_servers import metric
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server
LONG = 300  # tokens of the requests that must still be running when the test acts on them (end_id -1)


@pytest.fixture(scope="module")
def build_dir(triton_build_dir: Path) -> Path:
    return triton_build_dir


def start_server(build_dir: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> tuple[TritonServer, Path]:
    """A server of its own on the build's repository (the shared one is `triton_server`)."""
    log_dir = tmp_path_factory.mktemp(name)
    return triton_build.start_server(build_dir / "triton_repo", log_dir), log_dir / "tritonserver.log"


@pytest.fixture(scope="module")
def server(triton_server: TritonServer) -> Any:
    return triton_server


@pytest.fixture(scope="module")
def client(server: TritonServer) -> Any:
    return tritonclient_grpc.InferenceServerClient(server.grpc_url)


@pytest.fixture(scope="module")
def engine(build_dir: Path) -> Any:
    from engines.api import ReferenceEngine

    return ReferenceEngine.from_build(build_dir, device="cpu")


# ---- request helpers ----------------------------------------------------------------------------------------------


def engine_greedy(engine: Any, text: str, n: int) -> tuple[list[int], Any]:
    from engines.api import GenerationRequest, SamplingParams

    tok = engine.tokenizer
    ids = tok.encode(text, add_special_tokens=True)
    [res] = engine.generate(
        [
            GenerationRequest(
                prompt_ids=ids, max_new_tokens=n, sampling=SamplingParams(), stop_token_ids=[tok.eos_token_id]
            )
        ]
    )
    return res.output_ids, res.stats


# ---- tests --------------------------------------------------------------------------------------------------------


def test_server_ready_with_every_model_and_client_json_ignored(server: TritonServer, client: Any) -> None:
    models = {m.name: m.state for m in client.get_model_repository_index(headers=server.admin_headers).models}
    assert models == {n: "READY" for n in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm",
                                            "tensorrt_llm_bls")}
    assert (server.repo / "client.json").is_file() and (server.repo / "manifest.json").is_file()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_unary_greedy_equals_reference_engine_and_perf_metrics_match(client: Any, engine: Any, model: str) -> None:
    n = 12
    [resp] = stream_call(client, model, inputs(PROMPT, n, exclude_input_in_output=(True, "BOOL"),
                                               return_perf_metrics=(True, "BOOL")))
    ids, stats = engine_greedy(engine, PROMPT, n)
    assert resp["text_output"].reshape(-1)[0].decode() == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert int(resp["total_draft_tokens"].reshape(-1)[0]) == stats.draft_tokens > 0
    assert int(resp["total_accepted_draft_tokens"].reshape(-1)[0]) == stats.accepted_draft_tokens
    assert float(resp["acceptance_rate"].reshape(-1)[0]) == pytest.approx(stats.acceptance_rate)


def test_unary_default_includes_prompt_and_omits_perf_outputs(client: Any, engine: Any) -> None:
    """tensorrtllm_backend default exclude_input_in_output=false: non-streaming text_output repeats the prompt."""
    [resp] = stream_call(client, "ensemble", inputs(PROMPT, 6))
    ids, _ = engine_greedy(engine, PROMPT, 6)
    prompt_ids = engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    assert resp["text_output"].reshape(-1)[0].decode() == engine.tokenizer.decode(
        prompt_ids + ids, skip_special_tokens=True
    )
    assert set(resp) == {"text_output"}


def test_greedy_matches_hugging_face(client: Any, tiny_target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    model = AutoModelForCausalLM.from_pretrained(tiny_target, torch_dtype=torch.float32)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=10, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id
        )
    expected = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    [resp] = stream_call(client, "ensemble", inputs(PROMPT, 10, exclude_input_in_output=(True, "BOOL")))
    assert resp["text_output"].reshape(-1)[0].decode() == expected


def engine_chunks(engine: Any, text: str, n: int) -> list[list[int]]:
    """The token chunks the engine hands to on_tokens (one per decoding step)."""
    from engines.api import GenerationRequest, SamplingParams

    tok = engine.tokenizer
    chunks: list[list[int]] = []
    req = GenerationRequest(prompt_ids=tok.encode(text, add_special_tokens=True), max_new_tokens=n,
                            sampling=SamplingParams(), stop_token_ids=[tok.eos_token_id])
    engine.generate([req], on_tokens=lambda i, new: chunks.append(list(new)) or True)
    return chunks


def test_streaming_bls_text_equals_unary_and_ensemble_streams_engine_chunks(client: Any, engine: Any) -> None:
    n = 16
    ids, stats = engine_greedy(engine, PROMPT, n)
    unary = engine.tokenizer.decode(ids, skip_special_tokens=True)
    bls = stream_call(
        client, "tensorrt_llm_bls", inputs(PROMPT, n, stream=(True, "BOOL"), return_perf_metrics=(True, "BOOL"))
    )
    assert text_of(bls) == unary  # incremental detokenization: no chunk splits a character
    assert int(bls[-1]["total_draft_tokens"].reshape(-1)[0]) == stats.draft_tokens
    ens = stream_call(client, "ensemble", inputs(PROMPT, n, stream=(True, "BOOL")))
    # One response per engine step; each chunk decoded on its own (upstream postprocessing behaviour).
    chunks = engine_chunks(engine, PROMPT, n)
    assert sum(len(c) for c in chunks) == len(ids) and len(chunks) > 1
    assert [r["text_output"].reshape(-1)[0].decode() for r in ens] == [
        engine.tokenizer.decode(c, skip_special_tokens=True) for c in chunks
    ]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_each_bad_request_gets_its_error_and_server_keeps_serving(client: Any, model: str) -> None:
    """Over a gRPC stream the error travels in-band (message only: ModelStreamInferResponse.error_message)."""
    for text, max_tokens, extra, message in BAD_REQUESTS:
        with pytest.raises(InferenceServerException) as err:
            stream_call(client, model, inputs(text, max_tokens, **extra))
        assert message in err.value.message(), (message, err.value.message())
        [ok] = stream_call(client, model, inputs(PROMPT, 2))
        assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)


@pytest.mark.parametrize(("text", "max_tokens", "message"), [(t, n, m) for t, n, e, m in BAD_REQUESTS[:6]])
def test_bad_request_status_is_invalid_argument(client: Any, text: Any, max_tokens: int, message: str) -> None:
    """Unary gRPC to the (non-decoupled) preprocessing model shows the status code the checks set."""
    ins = [infer_input("QUERY", text, "BYTES"), infer_input("REQUEST_OUTPUT_LEN", max_tokens, "INT32")]
    with pytest.raises(InferenceServerException) as err:
        client.infer("preprocessing", ins)
    assert message in err.value.message()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value.status()


def test_cancel_mid_stream_frees_the_sequence(server: TritonServer, client: Any) -> None:
    before_cancel = metric(server, "eagle_llm_requests_cancelled_total")
    before_tokens = metric(server, "eagle_llm_generated_tokens_total")
    ins = inputs("cancel me", LONG, stream=(True, "BOOL"), end_id=(-1, "INT32"))
    got = stream_call(client, "tensorrt_llm_bls", ins, cancel_after=1)
    assert len(got) == 1
    deadline = time.time() + 60
    while time.time() < deadline and metric(server, "eagle_llm_requests_cancelled_total") == before_cancel:
        time.sleep(0.2)
    assert metric(server, "eagle_llm_requests_cancelled_total") == before_cancel + 1
    assert metric(server, "eagle_llm_generated_tokens_total") - before_tokens < LONG  # stopped early
    assert metric(server, "eagle_llm_requests_in_flight") == 0
    [ok] = stream_call(client, "ensemble", inputs(PROMPT, 2))  # still serving
    assert ok["text_output"].size == 1


def _concurrent(
    server: TritonServer, n: int, max_tokens: int, model: str = "ensemble", end_id: int | None = None, **kw: Any
) -> list[Any]:
    """n requests at once, one gRPC stream each; per request its responses or its InferenceServerException.
    end_id=-1 makes every request run to max_tokens (no eos can end it early)."""
    results: list[Any] = [None] * n
    extra: dict[str, Any] = {"stream": (True, "BOOL")} if "cancel_after" in kw else {}
    if end_id is not None:
        extra["end_id"] = (end_id, "INT32")

    ready = threading.Barrier(n)  # every client connected first: then all send at once, however slowly threads start

    def one(i: int) -> None:
        c = tritonclient_grpc.InferenceServerClient(server.grpc_url)
        try:
            ready.wait(timeout=120)
            results[i] = stream_call(c, model, inputs(f"{PROMPT} {i}", max_tokens, **extra), **kw)
        except InferenceServerException as e:
            results[i] = e
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results


def test_fifty_concurrent_requests_all_complete(server: TritonServer, engine: Any) -> None:
    before = metric(server, "nv_inference_request_success", model="ensemble")
    results = _concurrent(server, 50, 4)
    errors = [r for r in results if not isinstance(r, list)]
    assert not errors, [e.message() for e in errors[:3]]
    for i in (0, 17, 49):  # batched greedy == the engine alone
        ids, _ = engine_greedy(engine, f"{PROMPT} {i}", 4)
        prompt_ids = engine.tokenizer.encode(f"{PROMPT} {i}", add_special_tokens=True)
        assert text_of(results[i]) == engine.tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    assert metric(server, "nv_inference_request_success", model="ensemble") == before + 50
    assert metric(server, "nv_inference_request_success", model="tensorrt_llm") >= 50
    assert metric(server, "nv_inference_count", model="preprocessing") >= 50


def test_requests_beyond_the_queue_limit_are_refused_not_dropped(server: TritonServer) -> None:
    """limit + 30 requests at once through the ensemble: every request is answered, the excess with a clear
    refusal (the LLM model's admission: max_batch_size + triton.max_queue_size in flight)."""
    limit = MAX_BATCH + MAX_QUEUE
    before = metric(server, "eagle_llm_requests_refused_total")
    # 100 tokens each, no early eos: the admitted requests still hold their slots and queue places when the excess
    # arrives (in-flight batching frees a slot the moment its request ends; on a loaded CPU the 82 client threads
    # start slowly enough for 16-token requests to end first, and then nothing is refused).
    results = _concurrent(server, limit + 30, 100, end_id=-1)
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    done = [r for r in results if isinstance(r, list)]
    assert len(refused) + len(done) == limit + 30  # every request answered: text or a refusal
    assert refused, "no request was refused although more than max_batch_size + max_queue_size were sent"
    assert len(done) >= limit
    for e in refused:
        assert "server busy" in e.message() and f"max_batch_size {MAX_BATCH}" in e.message(), e.message()
    assert metric(server, "eagle_llm_requests_refused_total") == before + len(refused)
    assert metric(server, "eagle_llm_requests_in_flight") == 0


# ---- in-flight batching (the reference model's batcher over one engine session) ------------------------------------


def _timed_stream(url: str, ins: list[Any], marks: dict[str, Any], key: str, model: str = "ensemble") -> None:
    """One stream; records when its first and its final response arrived, and its text."""
    c = tritonclient_grpc.InferenceServerClient(url)
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    parts: list[str] = []
    try:
        c.async_stream_infer(model, ins, enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=120)
            assert error is None, error
            resp = result.get_response()
            if resp.outputs:
                marks.setdefault(f"{key}_first", time.perf_counter())
                parts.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if resp.parameters["triton_final_response"].bool_param:
                marks[f"{key}_end"] = time.perf_counter()
                marks[f"{key}_text"] = "".join(parts)
                return
    finally:
        c.stop_stream()
        c.close()


def test_second_stream_gets_its_first_token_before_a_running_long_one_finishes(
    server: TritonServer, engine: Any
) -> None:
    """In-flight batching: the short request joins the long one's batch at the next step instead of waiting for the
    whole long generation (which is what the batch-at-a-time batcher did), and its greedy text is unchanged."""
    marks: dict[str, Any] = {}
    long_ins = inputs(PROMPT, LONG, stream=(True, "BOOL"), end_id=(-1, "INT32"))
    long = threading.Thread(target=_timed_stream, args=(server.grpc_url, long_ins, marks, "long"))
    long.start()
    deadline = time.time() + 60
    while "long_first" not in marks and time.time() < deadline:
        time.sleep(0.005)
    short_text = f"{PROMPT} too"
    # The BLS model detokenizes incrementally (the ensemble decodes each chunk alone), so its text is exact.
    _timed_stream(server.grpc_url, inputs(short_text, 6, stream=(True, "BOOL")), marks, "short", "tensorrt_llm_bls")
    long.join(120)
    assert "long_end" in marks and marks["short_first"] < marks["long_end"], marks
    ids, _ = engine_greedy(engine, short_text, 6)
    assert marks["short_text"] == engine.tokenizer.decode(ids, skip_special_tokens=True)
    print(f"short first token {marks['short_first'] - marks['long_first']:.3f}s after long's first token; long ended "
          f"{marks['long_end'] - marks['short_first']:.3f}s after the short's first token")


# ---- cancellation through the ensemble -----------------------------------------------------------------------------


def _wait_idle(server: TritonServer) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and metric(server, "eagle_llm_requests_in_flight") > 0:
        time.sleep(0.1)
    assert metric(server, "eagle_llm_requests_in_flight") == 0


def _stop_inputs() -> list[Any]:
    """tensorrtllm_backend's stop request to the tensorrt_llm model (input stop=true; the other required inputs are
    placeholders the model never reads)."""
    return [infer_input("input_ids", 1, "INT32"), infer_input("input_lengths", 1, "INT32"),
            infer_input("request_output_len", 1, "INT32"), infer_input("stop", True, "BOOL")]


def test_ensemble_stop_request_then_drain_frees_the_sequence(server: TritonServer, client: Any) -> None:
    """The way to cancel an ensemble request that works with every backend (the C++ one, whose responses carry no
    cancel handle) and for non-streaming requests: send tensorrtllm_backend's `stop` request to the
    tensorrt_llm model with the ensemble request's id (the ensemble gives its composing requests its own id:
    core r24.10 src/ensemble_scheduler/ensemble_scheduler.cc InitStep, irequest->SetId(request_id_)), then read the
    ensemble stream to its final response instead of cancelling it. The model drops the sequence at the next step
    and ends the request with a bare FINAL flag, which completes the ensemble normally (no leaked ensemble request,
    see the test below)."""
    import uuid

    _wait_idle(server)
    rid, key = f"stop-{uuid.uuid4().hex}", {"stop_key": uuid.uuid4().hex}  # a stop needs the request's stop_key
    before = {m: metric(server, m) for m in ("eagle_llm_requests_cancelled_total", "eagle_llm_generated_tokens_total")}
    ens_before = metric(server, "nv_inference_request_success", model="ensemble")
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    chunks = 0
    try:
        client.async_stream_infer("ensemble", inputs("stop me", LONG, stream=(True, "BOOL"), end_id=(-1, "INT32")),
                                  enable_empty_final_response=True, request_id=rid, parameters=key)
        while True:
            result, error = q.get(timeout=120)
            assert error is None, error
            resp = result.get_response()
            if resp.outputs:
                chunks += 1
                if chunks == 1:  # on a second client, as a cancelling caller would
                    stopper = tritonclient_grpc.InferenceServerClient(server.grpc_url)
                    assert stream_call(stopper, "tensorrt_llm", _stop_inputs(), request_id=rid, parameters=key) == []
                    stopper.close()
            if resp.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    _wait_idle(server)
    assert metric(server, "eagle_llm_requests_cancelled_total") == before["eagle_llm_requests_cancelled_total"] + 1
    made = metric(server, "eagle_llm_generated_tokens_total") - before["eagle_llm_generated_tokens_total"]
    assert chunks <= made < LONG  # stopped early
    assert metric(server, "nv_inference_request_success", model="ensemble") == ens_before + 1  # completed, not stuck


# ---- gRPC status codes on the stream (triton_grpc_error) -----------------------------------------------------------
