"""Internal models on the real tritonserver (CPU, nvidia-pytriton 2.51), default build (triton.expose_internal_models
false): a client's direct call to the python LLM model is refused, whatever it sends (a generate request without
a token, a forged token, a token preprocessing gave for other inputs), while ensemble and BLS streams keep working
and stay identical to solo runs; the per-start secret appears in no response, log line or repository file.
The exposed build (testkit/triton_build.py, the shared server) is called directly by tests/test_triton_direct.py."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from testkit import triton_build
from testkit.triton_requests import infer_input, inputs, stream_call, text_of
from testkit.triton_servers import tiny_reference_repo
from triton_repo.launch import INTERNAL_KEY_ENV, TritonServer

pytestmark = pytest.mark.server
REFUSED = ("model 'tensorrt_llm' is internal to this server and answers only its entry models; send the request to "
           "ensemble or tensorrt_llm_bls (a build with triton.expose_internal_models: true lets clients call it "
           "directly)")
PROMPTS = ("The quick brown fox", "Paris is the capital of")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Any:
    root = tmp_path_factory.mktemp("guard_build")
    repo = tiny_reference_repo(root, "tiny-guard", tiny_target, eagle_head, max_seq_len=triton_build.MAX_SEQ)
    srv = triton_build.start_server(repo, root)
    yield srv
    assert srv.stop() == 0, f"tritonserver did not stop cleanly; log {srv.log_path}"


@pytest.fixture(scope="module")
def client(server: TritonServer) -> Any:
    return tritonclient_grpc.InferenceServerClient(server.grpc_url)


def ids_input(name: str, arr: np.ndarray) -> Any:
    i = tritonclient_grpc.InferInput(name, list(arr.shape), "INT32")
    i.set_data_from_numpy(arr.astype(np.int32))
    return i


def token_input(value: bytes) -> Any:
    i = tritonclient_grpc.InferInput("INTERNAL_TOKEN", [1, 1], "BYTES")
    i.set_data_from_numpy(np.array([[value]], dtype=object))
    return i


def preprocess(client: Any, text: str, n: int) -> dict[str, np.ndarray]:
    """A client's direct call to preprocessing (allowed: models/guard.py says why), every output."""
    res = client.infer("preprocessing", [infer_input("QUERY", text, "BYTES"),
                                         infer_input("REQUEST_OUTPUT_LEN", n, "INT32")])
    return {o.name: res.as_numpy(o.name) for o in res.get_response().outputs}


def llm_inputs(pre: dict[str, np.ndarray], **extra: Any) -> list[Any]:
    """The LLM request the ensemble builds from preprocessing's outputs (contract.LLM_INPUT_MAP)."""
    names = {"input_ids": "INPUT_ID", "input_lengths": "REQUEST_INPUT_LEN", "request_output_len": "REQUEST_OUTPUT_LEN",
             "stop_words_list": "STOP_WORDS_IDS", "end_id": "OUT_END_ID", "pad_id": "OUT_PAD_ID"}
    ins = [ids_input(k, pre[v]) for k, v in names.items()]
    return ins + list(extra.values())


def refusal_of(client: Any, ins: list[Any], request_id: str = "") -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        stream_call(client, "tensorrt_llm", ins, request_id=request_id)
    return err.value


def test_direct_calls_to_the_llm_model_are_refused(server: TritonServer, client: Any) -> None:
    # (`stop` requests keep their own rule, an unguessable id: tests/test_triton_isolation.py)
    pre = preprocess(client, PROMPTS[0], 4)
    other = preprocess(client, PROMPTS[1], 4)
    real_token = pre["INTERNAL_TOKEN"].reshape(-1)[0]
    assert isinstance(real_token, bytes) and len(real_token) == 64
    longer = dict(pre, REQUEST_OUTPUT_LEN=pre["REQUEST_OUTPUT_LEN"] + 50)
    cases = {
        "no token": llm_inputs(pre),
        "forged token": llm_inputs(pre, t=token_input(secrets.token_hex(32).encode())),
        "empty token": llm_inputs(pre, t=token_input(b"")),
        "token of another prompt": llm_inputs(pre, t=token_input(other["INTERNAL_TOKEN"].reshape(-1)[0])),
        "token with more max_tokens": llm_inputs(longer, t=token_input(real_token)),
        "token with other ids": llm_inputs(dict(pre, INPUT_ID=pre["INPUT_ID"][:, ::-1].copy()),
                                           t=token_input(real_token)),
    }
    for what, ins in cases.items():
        err = refusal_of(client, ins, request_id=secrets.token_hex(16))
        assert err.message() == REFUSED, (what, err.message())
    # The token covers exactly the LLM request the ensemble would run for that text: that one is served.
    out = stream_call(client, "tensorrt_llm", llm_inputs(pre, t=token_input(real_token)))
    assert sum(r["output_ids"].size for r in out) > 0


def solo(client: Any) -> dict[tuple[str, str], str]:
    return {(m, p): text_of(stream_call(client, m, inputs(p, 12))) for m in ("ensemble", "tensorrt_llm_bls")
            for p in PROMPTS}


def test_entry_models_stay_identical_to_solo_runs_under_a_direct_call_flood(server: TritonServer,
                                                                               client: Any) -> None:
    alone = solo(client)
    assert all(text.startswith(p) and len(text) > len(p) for (_, p), text in alone.items())
    stop = threading.Event()
    refused: list[str] = []
    other: list[str] = []
    pre = preprocess(client, PROMPTS[0], 4)

    def flood() -> None:
        c = tritonclient_grpc.InferenceServerClient(server.grpc_url)
        while not stop.is_set():
            try:
                stream_call(c, "tensorrt_llm", llm_inputs(pre), request_id=secrets.token_hex(16))
                other.append("served")
            except InferenceServerException as e:
                (refused if e.message() == REFUSED else other).append(e.message())
        c.close()

    threads = [threading.Thread(target=flood) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(2):
            assert solo(client) == alone
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert refused and not other, other[:3]


def test_the_secret_never_leaves_the_server(server: TritonServer, client: Any) -> None:
    environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    [key] = [e.split(b"=", 1)[1] for e in environ if e.startswith(INTERNAL_KEY_ENV.encode() + b"=")]
    assert len(key) == 64
    streams = [stream_call(client, m, inputs(PROMPTS[0], 4)) for m in ("ensemble", "tensorrt_llm_bls")]
    assert all(set(r) == {"text_output"} for s in streams for r in s)  # the ensemble keeps the token to itself
    assert "INTERNAL_TOKEN" not in {o.name for o in client.get_model_metadata("ensemble").outputs}
    seen = [text_of(s).encode() for s in streams]
    seen += [a.tobytes() if a.dtype != object else b"".join(a.reshape(-1)) for a in preprocess(client, "x", 2).values()]
    seen.append(refusal_of(client, llm_inputs(preprocess(client, "x", 2))).message().encode())
    assert not any(key in s for s in seen)
    assert key not in server.log_path.read_bytes()
    for path in server.repo.rglob("*"):
        if path.is_file():
            assert key not in path.read_bytes(), path
