"""Direct requests to every model the tiny reference build serves, not only through the entry models (ensemble,
tensorrt_llm_bls): a client (or a custom BLS / ensemble) may call `preprocessing`, `tensorrt_llm` and
`postprocessing` by name, and the checks that guard the engine must hold there too. Each input limit is refused with
its own message, and requests running in the batch the bad one would have joined finish exactly as the reference
engine decodes them alone. Real tritonserver (the shared `triton_server` of tests/conftest.py).

Limits: triton_repo/models/llm_io.py `parse_request` (tensorrt_llm), triton_repo/models/preprocessing.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from testkit.triton_build import MAX_INPUT, MAX_SEQ
from testkit.triton_requests import infer_input, stream_call
from testkit.triton_servers import metric
from triton_repo.launch import TritonServer

pytestmark = pytest.mark.server

RUNNING_NEW = MAX_SEQ - 20  # tokens of the requests that run while the bad ones arrive (no end_id: they run them
# all); as long as the prompts (a few tokens) allow, so that a fast machine still has them in flight


@pytest.fixture(scope="module")
def engine(triton_build_dir: Path) -> Any:
    from engines.api import ReferenceEngine

    return ReferenceEngine.from_build(triton_build_dir, device="cpu")


def ids_input(name: str, ids: list[int] | np.ndarray) -> Any:
    arr = np.asarray(ids, dtype=np.int32)
    arr = arr.reshape(1, -1) if arr.ndim == 1 else arr
    i = tritonclient_grpc.InferInput(name, list(arr.shape), "INT32")
    i.set_data_from_numpy(arr)
    return i


def llm_inputs(ids: list[int], n_out: int, *, lengths: int | None = None, **extra: tuple[Any, str]) -> list[Any]:
    """A direct tensorrt_llm request (contract.LLM_INPUTS), greedy, not streamed, the prompt left out of the output."""
    ins = [ids_input("input_ids", ids), infer_input("input_lengths", len(ids) if lengths is None else lengths, "INT32"),
           infer_input("request_output_len", n_out, "INT32"),
           infer_input("temperature", 0.0, "FP32"), infer_input("exclude_input_in_output", True, "BOOL")]
    return ins + [infer_input(k, v, dt) for k, (v, dt) in extra.items()]


def llm_output(responses: list[dict[str, Any]]) -> list[int]:
    return [int(t) for r in responses for t in r["output_ids"].reshape(-1)]


def engine_greedy(engine: Any, ids: list[int], n: int, no_eos: bool = False) -> list[int]:
    from engines.api import GenerationRequest, SamplingParams

    stop = [] if no_eos else [engine.tokenizer.eos_token_id]
    [res] = engine.generate([GenerationRequest(ids, n, SamplingParams(), stop)])
    return res.output_ids


def good_prompts(engine: Any) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(t) for t in ("The quick brown fox", "Hello world! What is", "Paris is the capital of")]


def bad_llm_requests(engine: Any) -> list[tuple[str, list[Any], str]]:
    """(limit, inputs, the message that names it) for every check of parse_request."""
    vocab = engine.vocab_size
    ok = engine.tokenizer.encode("The quick brown fox")
    long = (ok * (MAX_INPUT // len(ok) + 2))[: MAX_INPUT + 1]
    return [
        ("max_input_len", llm_inputs(long, 4), f"input_ids holds {MAX_INPUT + 1} ids > max_input_len={MAX_INPUT}"),
        (
            "max_seq_len",
            llm_inputs(ok, MAX_SEQ),
            f"prompt {len(ok)} + request_output_len (max_tokens) {MAX_SEQ} exceeds engine.max_seq_len={MAX_SEQ}",
        ),
        ("request_output_len", llm_inputs(ok, 0), "request_output_len (max_tokens)=0 must be >= 1"),
        ("input_lengths=0", llm_inputs(ok, 4, lengths=0), f"input_lengths=0 must be in 1..{len(ok)}"),
        (
            "input_lengths>given",
            llm_inputs(ok, 4, lengths=len(ok) + 1),
            f"input_lengths={len(ok) + 1} must be in 1..{len(ok)}",
        ),
        ("token id >= vocab", llm_inputs([*ok[:2], vocab, *ok[2:]], 4), f"input_ids[2]={vocab} is out of range"),
        ("negative token id", llm_inputs([-5, *ok], 4), "input_ids[0]=-5 is out of range"),
        (
            "batch of prompts",
            [
                ids_input("input_ids", np.array([ok, ok])),
                ids_input("input_lengths", [[len(ok)]] * 2),
                ids_input("request_output_len", [[4], [4]]),
            ],
            f"input_ids shape [2, {len(ok)}]",
        ),
        ("beam_width", llm_inputs(ok, 4, beam_width=(2, "INT32")), "beam_width=2: only 1 is supported"),
        (
            "temperature",
            llm_inputs(ok, 4)[:3] + [infer_input("temperature", -1.0, "FP32")],
            "temperature=-1.0 must be a finite number >= 0",
        ),
        ("top_k", llm_inputs(ok, 4, runtime_top_k=(-2, "INT32")), "top_k=-2 must be >= 0"),
        ("top_p", llm_inputs(ok, 4, runtime_top_p=(1.5, "FP32")), "top_p=1.5 must be in (0, 1]"),
    ]


def _run_in_background(url: str, model: str, jobs: list[list[Any]], results: dict[int, Any]) -> list[threading.Thread]:
    def one(k: int, ins: list[Any]) -> None:
        client = tritonclient_grpc.InferenceServerClient(url)
        try:
            results[k] = stream_call(client, model, ins)
        except Exception as e:  # any failure of a running request is reported by the test
            results[k] = e
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(k, ins)) for k, ins in enumerate(jobs)]
    for t in threads:
        t.start()
    return threads


def _wait_in_flight(server: TritonServer, n: int) -> None:
    deadline = time.time() + 60
    while time.time() < deadline and metric(server, "eagle_llm_requests_in_flight") < n:
        time.sleep(0.05)


def test_tensorrt_llm_refuses_each_limit_and_the_running_batch_is_unaffected(
    triton_server: TritonServer, engine: Any
) -> None:
    prompts = good_prompts(engine)
    results: dict[int, Any] = {}
    threads = _run_in_background(triton_server.grpc_url, "tensorrt_llm",
                                 [llm_inputs(p, RUNNING_NEW, end_id=(-1, "INT32")) for p in prompts], results)
    _wait_in_flight(triton_server, len(prompts))
    client = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    refused, busy = [], 0.0
    try:
        for limit, ins, message in bad_llm_requests(engine):
            with pytest.raises(InferenceServerException) as err:
                stream_call(client, "tensorrt_llm", ins)
            assert message in err.value.message(), (
                f"a direct tensorrt_llm request past {limit} must be refused by llm_io.parse_request with "
                f"{message!r}; got {err.value.message()!r}"
            )
            if not refused:  # the first refusal came while the running requests were in flight
                busy = metric(triton_server, "eagle_llm_requests_in_flight")
            refused.append(limit)
    finally:
        for t in threads:
            t.join(timeout=300)
        client.close()
    assert busy > 0, "the running requests finished before the bad ones arrived; the test needs them in flight"
    want = [engine_greedy(engine, p, RUNNING_NEW, no_eos=True) for p in prompts]
    for k in range(len(prompts)):
        assert not isinstance(results[k], Exception), f"running request {k} failed next to refused ones: {results[k]}"
        assert llm_output(results[k]) == want[k], f"running request {k} changed when bad requests arrived"
    assert len(refused) == len(bad_llm_requests(engine))


def test_tensorrt_llm_direct_request_at_each_limit_is_served(triton_server: TritonServer, engine: Any) -> None:
    """The limits are inclusive: a prompt of exactly max_input_len tokens, and prompt + max_tokens = max_seq_len."""
    ok = engine.tokenizer.encode("The quick brown fox")
    longest = (ok * (MAX_INPUT // len(ok) + 2))[:MAX_INPUT]
    client = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    try:
        got = llm_output(stream_call(client, "tensorrt_llm", llm_inputs(longest, 3, end_id=(-1, "INT32"))))
        assert len(got) == 3
        n = 4
        short = ok[:2]
        ins = llm_inputs(short, MAX_SEQ - len(short), end_id=(-1, "INT32"))
        assert len(llm_output(stream_call(client, "tensorrt_llm", ins, timeout=300))) == MAX_SEQ - len(short)
        assert llm_output(stream_call(client, "tensorrt_llm", llm_inputs(ok, n))) == engine_greedy(engine, ok, n)
    finally:
        client.close()


def _pre_inputs(text: Any, n_out: int | None) -> list[Any]:
    ins = [infer_input("QUERY", text, "BYTES")]
    return ins if n_out is None else ins + [infer_input("REQUEST_OUTPUT_LEN", n_out, "INT32")]


def test_preprocessing_refuses_each_limit_and_concurrent_requests_are_unaffected(
    triton_server: TritonServer, engine: Any
) -> None:
    tok = engine.tokenizer
    too_many_bytes = "x" * 100_000
    bad = [
        (_pre_inputs(too_many_bytes, 4), "text_input has 100000 bytes > "),
        (_pre_inputs("fox " * 100, 4), f"exceeds engine.max_input_len={MAX_INPUT}"),
        (_pre_inputs("The quick", MAX_SEQ), f"exceeds engine.max_seq_len={MAX_SEQ}"),
        (_pre_inputs("The quick", 0), "max_tokens=0 must be >= 1"),
        (_pre_inputs("", 4), "text_input is empty"),
        (_pre_inputs(b"\xff bad", 4), "not valid UTF-8"),
        (_pre_inputs("The quick", None), "input max_tokens is required"),
        ([infer_input("REQUEST_OUTPUT_LEN", 4, "INT32")], "input text_input is required"),
    ]
    texts = ["The quick brown fox", "Hello world!", "What is the capital of France?"]
    results: dict[int, Any] = {}
    done = threading.Event()

    def good(k: int) -> None:
        c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
        outs = []
        try:
            while not done.is_set() or not outs:  # keep sending while the bad ones arrive
                r = c.infer("preprocessing", _pre_inputs(texts[k], 5))
                outs.append((r.as_numpy("INPUT_ID").reshape(-1).tolist(), r.as_numpy("REQUEST_INPUT_LEN").item()))
            results[k] = outs
        except Exception as e:  # reported by the test
            results[k] = e
        finally:
            c.close()

    threads = [threading.Thread(target=good, args=(k,)) for k in range(len(texts))]
    for t in threads:
        t.start()
    client = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    try:
        for ins, message in bad:
            with pytest.raises(InferenceServerException) as err:
                client.infer("preprocessing", ins)
            assert message in err.value.message(), (message, err.value.message())
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        done.set()
        for t in threads:
            t.join(timeout=120)
        client.close()
    for k, text in enumerate(texts):
        assert not isinstance(results[k], Exception), f"good preprocessing request {k} failed: {results[k]}"
        ids = tok.encode(text)
        assert all(got[: n] == ids and n == len(ids) for got, n in results[k]), (k, results[k][:2])


def _post_inputs(tokens: np.ndarray, lengths: np.ndarray) -> list[Any]:
    a = tritonclient_grpc.InferInput("TOKENS_BATCH", list(tokens.shape), "INT32")
    a.set_data_from_numpy(tokens.astype(np.int32))
    b = tritonclient_grpc.InferInput("SEQUENCE_LENGTH", list(lengths.shape), "INT32")
    b.set_data_from_numpy(lengths.astype(np.int32))
    return [a, b]


def test_postprocessing_decodes_direct_requests(triton_server: TritonServer, engine: Any) -> None:
    """postprocessing decodes [batch, beam, tokens] up to each sequence length; it has no limit of its own beyond
    the tensor shapes Triton checks (a length past the tokens decodes what is there)."""
    tok = engine.tokenizer
    ids = tok.encode("The quick brown fox")
    client = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    try:
        tokens = np.array([[ids + [0, 0]]])
        r = client.infer("postprocessing", _post_inputs(tokens, np.array([[len(ids)]])))
        assert r.as_numpy("OUTPUT").reshape(-1)[0].decode() == tok.decode(ids, skip_special_tokens=True)
        with pytest.raises(InferenceServerException) as err:
            client.infer("postprocessing", _post_inputs(tokens, np.array([len(ids)])))  # SEQUENCE_LENGTH without beam
        assert "SEQUENCE_LENGTH" in err.value.message()
    finally:
        client.close()
