"""A real tritonserver (the CPU server bundled in nvidia-pytriton) on a repository rendered by the build's
triton_repo stage for the tiny reference build (2-layer Llama + EAGLE-1 head, topk-2-2 tree). One server start for
the whole module. Contract: tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt."""

from __future__ import annotations

import os
import queue
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from builders.build import main as build_main  # noqa: E402
from triton_repo.launch import TritonServer, free_port  # noqa: E402

pytestmark = pytest.mark.server
MAX_BATCH, MAX_QUEUE, MAX_INPUT, MAX_SEQ = 4, 48, 48, 96
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("triton_build")
    cfg = root / "tiny.yaml"
    cfg.write_text(
        f"name: tiny-triton\noutput_dir: {root / 'build'}\n"
        f"target: {{model: {tiny_target}, dtype: float32}}\n"
        f"draft: {{type: eagle, model: {eagle_head}}}\n"
        "tree: {choices: topk-2-2}\n"
        f"engine: {{backend: reference, device: cpu, max_batch_size: {MAX_BATCH}, max_input_len: {MAX_INPUT}, "
        f"max_seq_len: {MAX_SEQ}}}\n"
        f"triton: {{max_queue_size: {MAX_QUEUE}}}\n"
    )
    assert build_main([str(cfg)]) == 0
    return root / "build"


@pytest.fixture(scope="module")
def server(build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("triton_log") / "tritonserver.log"
    srv = TritonServer(
        build_dir / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log_path=log
    )
    srv.start(timeout_s=240)
    yield srv
    code = srv.stop()
    assert code == 0, f"tritonserver did not stop cleanly (exit {code}); log {log}"


@pytest.fixture(scope="module")
def client(server: TritonServer) -> Any:
    return tritonclient_grpc.InferenceServerClient(server.grpc_url)


@pytest.fixture(scope="module")
def engine(build_dir: Path) -> Any:
    from engines.api import ReferenceEngine

    return ReferenceEngine.from_build(build_dir, device="cpu")


# ---- request helpers ----------------------------------------------------------------------------------------------


def _input(name: str, value: Any, datatype: str) -> Any:
    np_type = {"BYTES": object, "INT32": np.int32, "BOOL": bool, "FP32": np.float32, "UINT64": np.uint64}[datatype]
    arr = np.array([[value]], dtype=np_type)
    i = tritonclient_grpc.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr)
    return i


def inputs(text: str | bytes, max_tokens: int, **extra: tuple[Any, str]) -> list[Any]:
    ins = [_input("text_input", text, "BYTES"), _input("max_tokens", max_tokens, "INT32")]
    ins += [_input(k, v, dt) for k, (v, dt) in extra.items()]
    return ins


def stream_call(
    client: Any, model: str, ins: list[Any], cancel_after: int | None = None, timeout: float = 120
) -> list[dict[str, Any]]:
    """All responses of one request on a gRPC stream, as {output: array}; raises the first error."""
    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer(model, ins, enable_empty_final_response=True)
        out: list[dict[str, Any]] = []
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                raise error
            resp = result.get_response()
            if resp.outputs:
                out.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
            if cancel_after is not None and len(out) >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return out
            if resp.parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()


def text_of(responses: list[dict[str, Any]]) -> str:
    return "".join(r["text_output"].reshape(-1)[0].decode("utf-8") for r in responses)


def metric(server: TritonServer, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def engine_greedy(engine: Any, text: str, n: int) -> tuple[list[int], Any]:
    from engines.api import GenerationRequest, SamplingParams

    tok = engine.tokenizer
    ids = tok.encode(text, add_special_tokens=True)
    [res] = engine.generate(
        [GenerationRequest(prompt_ids=ids, max_new_tokens=n, sampling=SamplingParams(), stop_token_ids=[tok.eos_token_id])]
    )
    return res.output_ids, res.stats


# ---- tests --------------------------------------------------------------------------------------------------------


def test_server_ready_with_every_model_and_client_json_ignored(server: TritonServer, client: Any) -> None:
    models = {m.name: m.state for m in client.get_model_repository_index().models}
    assert models == {n: "READY" for n in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm",
                                            "tensorrt_llm_bls")}  # fmt: skip
    assert (server.repo / "client.json").is_file() and (server.repo / "manifest.json").is_file()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_unary_greedy_equals_reference_engine_and_perf_metrics_match(client: Any, engine: Any, model: str) -> None:
    n = 12
    [resp] = stream_call(client, model, inputs(PROMPT, n, exclude_input_in_output=(True, "BOOL"),
                                               return_perf_metrics=(True, "BOOL")))  # fmt: skip
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
    assert resp["text_output"].reshape(-1)[0].decode() == engine.tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    assert set(resp) == {"text_output"}


def test_greedy_matches_hugging_face(client: Any, tiny_target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    model = AutoModelForCausalLM.from_pretrained(tiny_target, torch_dtype=torch.float32)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
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
    bls = stream_call(client, "tensorrt_llm_bls", inputs(PROMPT, n, stream=(True, "BOOL"), return_perf_metrics=(True, "BOOL")))
    assert text_of(bls) == unary  # incremental detokenization: no chunk splits a character
    assert int(bls[-1]["total_draft_tokens"].reshape(-1)[0]) == stats.draft_tokens
    ens = stream_call(client, "ensemble", inputs(PROMPT, n, stream=(True, "BOOL")))
    # One response per engine step; each chunk decoded on its own (upstream postprocessing behaviour).
    chunks = engine_chunks(engine, PROMPT, n)
    assert sum(len(c) for c in chunks) == len(ids) and len(chunks) > 1
    assert [r["text_output"].reshape(-1)[0].decode() for r in ens] == [
        engine.tokenizer.decode(c, skip_special_tokens=True) for c in chunks
    ]


BAD_REQUESTS = [
    ("", 4, {}, "text_input is empty"),
    (b"\xff\xfe bad", 4, {}, "not valid UTF-8"),
    (PROMPT, 0, {}, "max_tokens=0 must be >= 1"),
    (PROMPT, -3, {}, "max_tokens=-3 must be >= 1"),
    (PROMPT, MAX_SEQ, {}, f"> max_seq_len={MAX_SEQ}"),
    ("fox " * 200, 4, {}, f"> max_input_len={MAX_INPUT}"),
    (PROMPT, 4, {"beam_width": (2, "INT32")}, "beam_width=2: only 1 is supported"),
    (PROMPT, 4, {"top_p": (1.5, "FP32")}, "top_p=1.5 must be in [0, 1]"),
    (PROMPT, 4, {"lora_task_id": (1, "UINT64")}, "unexpected inference input 'lora_task_id'"),
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
    ins = [_input("QUERY", text, "BYTES"), _input("REQUEST_OUTPUT_LEN", max_tokens, "INT32")]
    with pytest.raises(InferenceServerException) as err:
        client.infer("preprocessing", ins)
    assert message in err.value.message()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value.status()


def test_cancel_mid_stream_frees_the_sequence(server: TritonServer, client: Any) -> None:
    before_cancel = metric(server, "eagle_llm_requests_cancelled_total")
    before_tokens = metric(server, "eagle_llm_generated_tokens_total")
    got = stream_call(client, "tensorrt_llm_bls", inputs("cancel me", 60, stream=(True, "BOOL")), cancel_after=1)
    assert len(got) == 1
    deadline = time.time() + 60
    while time.time() < deadline and metric(server, "eagle_llm_requests_cancelled_total") == before_cancel:
        time.sleep(0.2)
    assert metric(server, "eagle_llm_requests_cancelled_total") == before_cancel + 1
    assert metric(server, "eagle_llm_generated_tokens_total") - before_tokens < 60  # stopped early
    assert metric(server, "eagle_llm_requests_in_flight") == 0
    [ok] = stream_call(client, "ensemble", inputs(PROMPT, 2))  # still serving
    assert ok["text_output"].size == 1


def _concurrent(
    server: TritonServer, n: int, max_tokens: int, model: str = "ensemble", **kw: Any
) -> list[Any]:
    """n requests at once, one gRPC stream each; per request its responses or its InferenceServerException."""
    results: list[Any] = [None] * n
    extra = {"stream": (True, "BOOL")} if "cancel_after" in kw else {}

    def one(i: int) -> None:
        c = tritonclient_grpc.InferenceServerClient(server.grpc_url)
        try:
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
    results = _concurrent(server, limit + 30, 16)
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    done = [r for r in results if isinstance(r, list)]
    assert len(refused) + len(done) == limit + 30  # every request answered: text or a refusal
    assert refused, "no request was refused although more than max_batch_size + max_queue_size were sent"
    assert len(done) >= limit
    for e in refused:
        assert "server busy" in e.message() and f"max_batch_size {MAX_BATCH}" in e.message(), e.message()
    assert metric(server, "eagle_llm_requests_refused_total") == before + len(refused)
    assert metric(server, "eagle_llm_requests_in_flight") == 0
