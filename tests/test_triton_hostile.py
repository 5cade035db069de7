"""Hostile requests on the real tritonserver (the shared tiny reference build, testkit/triton_build.py): every input is
bounded before any work (triton_repo/models/bounds.py), every malformed request gets INVALID_ARGUMENT naming what
was wrong and never a traceback, a stop request reaches only requests sent with its id and stop_key, and good
streams decoding meanwhile get exactly their solo output."""

from __future__ import annotations

import os
import queue
import secrets
import threading
import time
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from tests.test_triton_isolation import _call, llm_inputs, solo_ids
from tests.test_triton_server import _stop_inputs, _wait_idle
from testkit.triton_build import MAX_INPUT, MAX_SEQ
from testkit.triton_requests import PROMPT, infer_input, inputs, stream_call, text_of
from testkit.triton_servers import metric
from triton_repo.launch import TritonServer
from triton_repo.models import bounds, ownership

pytestmark = pytest.mark.server
N = 40
TRITON_SHAPE = "unexpected shape for input '{}'"
LEAKS = ("Traceback", 'File "', "site-packages", "/usr/", "line ")  # what a traceback would show


@pytest.fixture(scope="module")
def engine(triton_build_dir: Any) -> Any:
    from engines.api import ReferenceEngine

    return ReferenceEngine.from_build(triton_build_dir, device="cpu")


def arr_input(name: str, arr: np.ndarray, datatype: str) -> Any:
    i = tritonclient_grpc.InferInput(name, list(arr.shape), datatype)
    i.set_data_from_numpy(arr)
    return i


def words(values: list[bytes]) -> np.ndarray:
    return np.array([values], dtype=object)


def text_requests(vocab: int) -> dict[str, tuple[list[Any], str]]:
    """Requests of the ensemble contract (ensemble and BLS) that must be refused, with the message each gets."""
    ok = [infer_input("max_tokens", 4, "INT32")]
    two = arr_input("text_input", np.array([[PROMPT.encode(), b"another prompt"]], dtype=object), "BYTES")
    return {
        # Shapes the config declares [1] are refused by Triton itself (before any model runs).
        "two prompts": ([two, *ok], TRITON_SHAPE.format("text_input")),
        "two max_tokens": (
            [
                infer_input("text_input", PROMPT, "BYTES"),
                arr_input("max_tokens", np.array([[4, 5]], np.int32), "INT32"),
            ],
            TRITON_SHAPE.format("max_tokens"),
        ),
        "stop-word flood": (
            [
                infer_input("text_input", PROMPT, "BYTES"),
                *ok,
                arr_input("stop_words", words([b"w%d" % i for i in range(200_000)]), "BYTES"),
            ],
            f"stop_words has 200000 entries > {bounds.MAX_STOP_WORDS}",
        ),
        "long stop word": (
            [infer_input("text_input", PROMPT, "BYTES"), *ok, arr_input("stop_words", words([b"x" * 5000]), "BYTES")],
            f"stop_words[0] has 5000 bytes > {bounds.MAX_STOP_WORD_BYTES}",
        ),
        "stop bytes in all": (
            [
                infer_input("text_input", PROMPT, "BYTES"),
                *ok,
                arr_input("stop_words", words([b"y" * 1000] * 60), "BYTES"),
            ],
            f"stop_words holds 60000 bytes > {bounds.MAX_STOP_TOTAL_BYTES} in all",
        ),
        "stop word not UTF-8": (
            [
                infer_input("text_input", PROMPT, "BYTES"),
                *ok,
                arr_input("stop_words", words([b"ok", b"\xc3\x28"]), "BYTES"),
            ],
            "stop_words[1] is not valid UTF-8",
        ),
        "end_id past vocab": (
            inputs(PROMPT, 4, end_id=(vocab, "INT32")),
            f"end_id={vocab} is out of range: token ids must be in [0, ",
        ),
        "end_id negative": (inputs(PROMPT, 4, end_id=(-5, "INT32")), "end_id=-5 is out of range"),
        "pad_id huge": (inputs(PROMPT, 4, pad_id=(10**9, "INT32")), "pad_id=1000000000 is out of range"),
        "pad_id -1": (inputs(PROMPT, 4, pad_id=(-1, "INT32")), "pad_id=-1 is out of range"),
        "two temperatures": (
            inputs(PROMPT, 4) + [arr_input("temperature", np.array([[0.0, 1.0]], np.float32), "FP32")],
            TRITON_SHAPE.format("temperature"),
        ),
        "prompt bytes": (inputs("x" * 10**6, 4), "text_input has 1000000 bytes >"),
    }


def llm_requests(prompt_ids: list[int], vocab: int) -> dict[str, tuple[list[Any], str]]:
    """Requests to the tensorrt_llm model itself (token ids) that must be refused."""
    def swl(ids: list[int], offsets: list[int]) -> Any:
        return arr_input("stop_words_list", np.array([[ids, offsets]], np.int32), "INT32")

    return {
        "negative stop id": (llm_inputs(prompt_ids, 4) + [swl([5, -3, 7], [1, 3, -1])],
                             "stop_words_list[0][1]=-3 is out of range"),
        "stop id past vocab": (llm_inputs(prompt_ids, 4) + [swl([vocab + 1], [1])],
                               f"stop_words_list[0][0]={vocab + 1} is out of range"),
        "stop offsets": (llm_inputs(prompt_ids, 4) + [swl([5, 6, 7], [3, 1, -1])],
                         "stop_words_list: end offsets [3, 1] must increase"),
        "stop ids flood": (llm_inputs(prompt_ids, 4) + [swl([1] * 100_000, [100_000] + [-1] * 99_999)],
                           f"stop_words_list holds 100000 ids > {bounds.MAX_WORD_IDS}"),
        "end_id past vocab": (llm_inputs(prompt_ids, 4, end_id=(vocab, "INT32")), f"end_id={vocab} is out of range"),
        "pad_id negative": (llm_inputs(prompt_ids, 4, pad_id=(-2, "INT32")), "pad_id=-2 is out of range"),
        "ids flood": (llm_inputs([1] * 1_000_000, 4), f"input_ids holds 1000000 ids > max_input_len={MAX_INPUT}"),
        "two lengths": ([*llm_inputs(prompt_ids, 4)[:1],
                         arr_input("input_lengths", np.array([[2, 3]], np.int32), "INT32"),
                         *llm_inputs(prompt_ids, 4)[2:]], TRITON_SHAPE.format("input_lengths")),
    }


def _refused(results: dict[str, Any], expected: dict[str, str]) -> None:
    for k, message in expected.items():
        err = results[k]
        assert isinstance(err, InferenceServerException), (k, err)
        # On a stream without the triton_grpc_error header Triton sends errors without a status code
        # (tests/test_triton_grpc_status.py has the header and the codes); with it, INVALID_ARGUMENT.
        assert err.status() in (None, "StatusCode.INVALID_ARGUMENT"), (k, err.status(), err.message())
        assert message in err.message(), (k, err.message())
        assert not any(leak in err.message() for leak in LEAKS), (k, err.message())
        assert len(err.message()) < 1000, (k, len(err.message()))


def test_hostile_requests_are_refused_by_name_while_good_streams_get_their_solo_output(
    triton_server: TritonServer, engine: Any
) -> None:
    """Each hostile request through ensemble, BLS and the tensorrt_llm model itself, sent while three good greedy
    streams decode: each is refused with INVALID_ARGUMENT and its message (no traceback), and each good stream's
    output equals the engine's solo output."""
    _wait_idle(triton_server)
    tok, vocab = engine.tokenizer, len(engine.tokenizer)
    prompt_ids = tok.encode(PROMPT, add_special_tokens=True)
    good = {
        "good ensemble": ("ensemble", inputs(PROMPT, N, end_id=(-1, "INT32"), stream=(True, "BOOL"))),
        "good bls": ("tensorrt_llm_bls", inputs(PROMPT, N, end_id=(-1, "INT32"), stream=(True, "BOOL"))),
        "good llm": ("tensorrt_llm", llm_inputs(prompt_ids, N, end_id=(-1, "INT32"))),
    }
    bad: dict[str, tuple[str, list[Any]]] = {}
    expected: dict[str, str] = {}
    for model in ("ensemble", "tensorrt_llm_bls"):
        for k, (ins, msg) in text_requests(vocab).items():
            bad[f"{model}: {k}"], expected[f"{model}: {k}"] = (model, ins), msg
    for k, (ins, msg) in llm_requests(prompt_ids, engine.vocab_size).items():
        bad[f"llm: {k}"], expected[f"llm: {k}"] = ("tensorrt_llm", ins), msg
    results: dict[str, Any] = {}
    threads = {k: threading.Thread(target=_call, args=(triton_server.grpc_url, m, ins, results, k))
               for k, (m, ins) in {**good, **bad}.items()}
    for k in good:
        threads[k].start()
    deadline = time.time() + 60
    while metric(triton_server, "eagle_llm_requests_in_flight") < len(good) and time.time() < deadline:
        time.sleep(0.01)
    for k in bad:  # a few at a time: the server's queue bound is not under test here
        threads[k].start()
        threads[k].join(timeout=120)
    for t in threads.values():
        t.join(timeout=300)
    _refused(results, expected)
    ids = solo_ids(engine, prompt_ids, N)
    assert text_of(results["good ensemble"]) == tok.decode(ids, skip_special_tokens=True)
    assert text_of(results["good bls"]) == tok.decode(ids, skip_special_tokens=True)
    assert [int(x) for r in results["good llm"] for x in r["output_ids"].reshape(-1)] == ids
    _wait_idle(triton_server)


def _stopper(url: str, stops: list[tuple[str, str | None]], answers: dict[Any, Any], done: threading.Event) -> None:
    """Sends upstream's stop request for each (id, stop_key) of `stops` (None: no key) until `done`."""
    c = tritonclient_grpc.InferenceServerClient(url)
    try:
        while not done.is_set():
            for rid, key in stops:
                try:
                    answers[(rid, key)] = stream_call(c, "tensorrt_llm", _stop_inputs(), request_id=rid,
                                                      parameters=None if key is None else {ownership.STOP_KEY: key})
                except InferenceServerException as e:
                    answers[(rid, key)] = e
    finally:
        c.close()


# ids that merely hold 32 hex-class characters (a stop by id alone reached each), short ones, a shared one
VICTIM_IDS = ["req-00000000000000000000000000000000000042", "00000000000000000000000000000001",
              "12345678901234567890123456789012", "1", "victim-2", "shared", "shared", ""]


def test_a_stop_request_never_reaches_another_clients_request(triton_server: TritonServer, engine: Any) -> None:
    """Victims stream through the ensemble with ids of their own choosing (ids full of hex digits, short ones, two
    sharing one id, none) and their own stop_key, one without a key, and one through BLS (whose ids and keys the
    server mints), while an attacker who knows every id floods the tensorrt_llm model with upstream's stop request
    for each: without a key, with keys of its own. Every victim gets its whole solo output; a stop without a key is
    refused by name, one with a wrong key gets the same empty answer as any other."""
    _wait_idle(triton_server)
    tok = engine.tokenizer
    prompt_ids = tok.encode(PROMPT, add_special_tokens=True)
    want = tok.decode(solo_ids(engine, prompt_ids, N), skip_special_tokens=True)
    victims = [(rid, "ensemble", secrets.token_hex(16)) for rid in VICTIM_IDS]
    victims += [("keyless", "ensemble", None), ("", "tensorrt_llm_bls", None)]
    guessed_keys = [None, secrets.token_hex(16), "0" * 32, "1" * 16]
    stops = [(rid, key) for rid in {*VICTIM_IDS, "keyless", "bls-1", "bls-2"} for key in guessed_keys]
    results: dict[int, Any] = {}
    answers: dict[Any, Any] = {}
    done = threading.Event()
    attacker = threading.Thread(target=_stopper, args=(triton_server.grpc_url, stops, answers, done))
    attacker.start()

    def victim(i: int, rid: str, model: str, key: str | None) -> None:
        c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
        try:
            results[i] = stream_call(c, model, inputs(PROMPT, N, end_id=(-1, "INT32"), stream=(True, "BOOL")),
                                     request_id=rid, parameters=None if key is None else {ownership.STOP_KEY: key})
        except InferenceServerException as e:
            results[i] = e
        finally:
            c.close()

    threads = [threading.Thread(target=victim, args=(i, *v)) for i, v in enumerate(victims)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    done.set()
    attacker.join(timeout=120)
    for i, v in enumerate(victims):
        assert not isinstance(results[i], Exception), (v, results[i])
        assert text_of(results[i]) == want, v
    for rid in ("1", "shared", "keyless", VICTIM_IDS[0]):
        err = answers[(rid, None)]
        assert isinstance(err, InferenceServerException) and err.status() in (None, "StatusCode.INVALID_ARGUMENT"), err
        said = err.message()
        assert "stop: no stop_key parameter; a stop reaches only a request sent with the same request id" in said
        assert answers[(rid, guessed_keys[1])] == []  # a wrong key: the same empty answer, found or not
    _wait_idle(triton_server)


def _streaming(server: TritonServer, rid: str, key: str, n: int, results: dict[str, Any], name: str
               ) -> tuple[threading.Thread, threading.Event]:
    """An ensemble stream of `n` tokens under id `rid` and stop_key `key` on a thread of its own; the event is set at
    its first chunk (the request is then running in the LLM model), its chunks land in results[name]."""
    first = threading.Event()

    def run() -> None:
        c = tritonclient_grpc.InferenceServerClient(server.grpc_url)
        q: queue.Queue[tuple[Any, Any]] = queue.Queue()
        out: list[dict[str, Any]] = []
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        try:
            c.async_stream_infer("ensemble", inputs(PROMPT, n, end_id=(-1, "INT32"), stream=(True, "BOOL")),
                                 request_id=rid, parameters={ownership.STOP_KEY: key}, enable_empty_final_response=True)
            while True:
                result, error = q.get(timeout=120)
                if error is not None:
                    results[name + " error"] = error
                    return
                resp = result.get_response()
                if resp.outputs:
                    out.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
                    first.set()
                if resp.parameters["triton_final_response"].bool_param:
                    return
        finally:
            results[name] = out
            first.set()
            c.stop_stream()
            c.close()

    t = threading.Thread(target=run)
    t.start()
    return t, first


def test_the_owner_stops_its_own_request_and_no_other_sharing_its_id(triton_server: TritonServer, engine: Any) -> None:
    """Two clients pick the same id; the first stops its request with its own stop_key: its request is cancelled,
    the other request with that id gets its whole solo output. The stop goes out only once both requests are
    running (each has streamed its first chunk; the one stopped asks for the most tokens the build allows, so it is
    still running then), whatever the machine's load: no fixed wait."""
    _wait_idle(triton_server)
    tok = engine.tokenizer
    prompt_ids = tok.encode(PROMPT, add_special_tokens=True)
    want = tok.decode(solo_ids(engine, prompt_ids, N), skip_special_tokens=True)
    longest = MAX_SEQ - MAX_INPUT  # within every limit, far more than N
    rid, mine, theirs = "same-id", secrets.token_hex(16), secrets.token_hex(16)
    before = metric(triton_server, "eagle_llm_requests_cancelled_total")
    results: dict[str, Any] = {}
    t_mine, first_mine = _streaming(triton_server, rid, mine, longest, results, "mine")
    assert first_mine.wait(120) and "mine error" not in results
    t_theirs, first_theirs = _streaming(triton_server, rid, theirs, N, results, "theirs")
    assert first_theirs.wait(120) and "theirs error" not in results
    c = tritonclient_grpc.InferenceServerClient(triton_server.grpc_url)
    assert stream_call(c, "tensorrt_llm", _stop_inputs(), request_id=rid, parameters={ownership.STOP_KEY: mine}) == []
    c.close()
    for t in (t_mine, t_theirs):
        t.join(timeout=120)
    _wait_idle(triton_server)
    assert metric(triton_server, "eagle_llm_requests_cancelled_total") == before + 1
    assert text_of(results["theirs"]) == want
    assert len(tok.encode(text_of(results["mine"]), add_special_tokens=False)) < longest  # cut short by its stop

