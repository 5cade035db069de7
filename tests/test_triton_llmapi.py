"""The current TensorRT-LLM line on the real CPU Triton server: configs/smollm2-eagle3-current.yaml (SmolLM2 + the
EAGLE-3 head under heads/, a dynamic tree, trtllm_version 1.4) built into the `llmapi` layout and served by the
reference engine's mirror of upstream's llmapi model. Our clients, the load tester and genai-perf's command work
against it; the streamed answer equals target-only greedy decoding. One server for the module."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from builders.build import main as build_main
from builders.config import load_config
from clients import genai_perf, loadtest
from clients import schema as sch
from clients.client import LLMClient
from triton_repo.launch import TritonServer, free_port

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "smollm2-eagle3-current.yaml"
PROMPT = "The capital of France is"
N = 24
DYNAMIC = ["tree.choices=null", "tree.dynamic={top_k: 2, depth: 3, total_draft_tokens: 6}", "tree.max_concurrency=null"]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("llmapi_build") / "build"
    # The config's own tree is a chain served at one sequence; the dynamic tree keeps this module on the tree path.
    sets = [f"output_dir={out}", "engine.device=cpu", "engine.max_seq_len=256", "engine.max_input_len=128", *DYNAMIC]
    assert build_main([str(CONFIG)] + [a for s in sets for a in ("--set", s)]) == 0
    return load_config(CONFIG, sets), out


@pytest.fixture(scope="module")
def server(build: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("llmapi_server") / "tritonserver.log"
    srv = TritonServer(build[1] / "triton_repo", grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log)
    srv.start(timeout_s=300)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def greedy_text(build: tuple[Any, Path]) -> str:
    """Target-only greedy decoding of PROMPT by the reference engine (no draft head involved)."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_build(build[1], device="cpu")
    tok = eng.tokenizer
    req = GenerationRequest(prompt_ids=tok.encode(PROMPT), max_new_tokens=N, sampling=SamplingParams(temperature=0.0),
                            stop_token_ids=[tok.eos_token_id])
    (res,) = eng.generate([req], speculative=False)
    return tok.decode(res.output_ids, skip_special_tokens=True)


def test_repository_is_the_llmapi_layout(build: tuple[Any, Path]) -> None:
    repo = build[1] / "triton_repo"
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        "client.json",
        "manifest.json",
        "prometheus-rules.yml",
        "tensorrt_llm/1/eagle_bootstrap.py",
        "tensorrt_llm/1/model.py",
        "tensorrt_llm/1/model.yaml",
        "tensorrt_llm/config.pbtxt",
    ]
    doc = yaml.safe_load((repo / "tensorrt_llm/1/model.yaml").read_text())
    assert doc["speculative_config"] == {
        "decoding_type": "Eagle3", "max_draft_len": 3,
        "speculative_model": "../checkpoint/eagle3",  # relative to the repository: the build moves
        "eagle3_layers_to_capture": [1, 14, 26],
        "max_total_draft_tokens": 6, "use_dynamic_tree": True, "dynamic_tree_max_topK": 2}
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    schema = sch.from_repository(repo)
    assert schema.dialect is sch.LLMAPI and schema.model == "tensorrt_llm" and schema.max_batch_size == 0


def test_streamed_answer_equals_target_only_greedy(server: Any, build: tuple[Any, Path], greedy_text: str) -> None:
    schema = sch.from_repository(build[1] / "triton_repo")
    with LLMClient(server.grpc_url, schema=schema) as c:
        chunks = [ch.text for ch in c.stream(PROMPT, max_tokens=N)]
        stats = c.last_stats
        whole = c.generate(PROMPT, max_tokens=N)
    assert "".join(chunks) == greedy_text and len(chunks) > 2
    assert whole.text == greedy_text
    assert stats.draft_tokens > 0 and 0 <= stats.accepted_draft_tokens <= stats.draft_tokens


def test_raw_wire_is_upstreams(server: Any) -> None:
    """Each streamed response holds the text so far; perf outputs are strings; the `kserve` names are refused."""
    import queue

    c = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))

    def inp(name: str, arr: np.ndarray, dt: str) -> Any:
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    base = [inp("text_input", np.array([PROMPT.encode()], dtype=object), "BYTES"),
            inp("streaming", np.array([True]), "BOOL")]
    c.async_stream_infer("tensorrt_llm", base + [inp("sampling_param_max_tokens", np.array([6], np.int32), "INT32"),
                         inp("sampling_param_return_perf_metrics", np.array([True]), "BOOL")], request_id="1")
    texts, last = [], None
    while True:
        result, error = got.get(timeout=120)
        assert error is None, error
        texts.append(result.as_numpy("text_output")[0].decode())
        last = result
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert last.as_numpy("total_draft_tokens").dtype == np.object_ and int(last.as_numpy("total_draft_tokens")[0]) > 0
    c.async_stream_infer("tensorrt_llm", base + [inp("max_tokens", np.array([6], np.int32), "INT32")], request_id="2")
    _result, error = got.get(timeout=60)
    assert isinstance(error, InferenceServerException) and "unexpected inference input 'max_tokens'" in str(error)
    c.stop_stream()


def test_upstreams_lora_inputs_are_refused_by_name_and_image_url_by_triton(server: Any) -> None:
    """Upstream's config.pbtxt declares lora_* and image_url: the reference engine serves neither. lora_* are declared
    here to be refused naming them (INVALID_ARGUMENT, models/llmapi_refusals.py); image_url is not declared
    (ledger/llmapi.py NOT_DECLARED), so Triton refuses it, as the named logits post-processor input
    of newer upstream helpers. Either way no text comes back."""
    import queue

    c = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))

    def inp(name: str, arr: np.ndarray, dt: str) -> Any:
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    def error_of(extra: list[Any], rid: str) -> str:
        c.async_stream_infer("tensorrt_llm", [inp("text_input", np.array([PROMPT.encode()], dtype=object), "BYTES"),
                                              inp("streaming", np.array([True]), "BOOL")] + extra, request_id=rid)
        result, error = got.get(timeout=60)
        assert result is None or result.as_numpy("text_output")[0] == b"N/A", result
        assert isinstance(error, InferenceServerException), (result, error)
        return str(error)

    lora = {"lora_id": (np.array([7], np.uint64), "UINT64"),
            "lora_name": (np.array([b"adapter"], dtype=object), "BYTES"),
            "lora_path": (np.array([b"/adapters/a"], dtype=object), "BYTES"),
            "lora_ckpt_source": (np.array([b"hf"], dtype=object), "BYTES")}
    for i, sent in enumerate((["lora_id"], ["lora_name", "lora_path"], list(lora))):
        msg = error_of([inp(n, *lora[n]) for n in sent], f"lora{i}")
        assert f"{', '.join(sent)}: LoRA adapters are not served by this deployment" in msg
    msg = error_of([inp("image_url", np.array([b"https://example.com/a.jpg"], dtype=object), "BYTES")], "img")
    assert "unexpected inference input 'image_url'" in msg
    name = np.array([b"biaser"], dtype=object)  # upstream's named logits post-processors: none configured here
    msg = error_of([inp("sampling_param_logits_post_processor_name", name, "BYTES")], "logits")
    assert "unexpected inference input 'sampling_param_logits_post_processor_name'" in msg
    c.stop_stream()


def test_http_generate_endpoint_takes_sampling_param_max_tokens(server: Any, greedy_text: str) -> None:
    """genai-perf's `generate` endpoint type: JSON keys naming model inputs become inputs."""
    body = json.dumps({"text_input": [PROMPT], "sampling_param_max_tokens": N}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/tensorrt_llm/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert json.loads(r.read())["text_output"] == greedy_text


def test_load_tester_runs_against_it(server: Any, build: tuple[Any, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (PROMPT, "One, two, three,")))
    rc = loadtest.main(["--url", server.grpc_url, "--model", "tensorrt_llm", "--repo", str(build[1] / "triton_repo"),
                        "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--concurrency", "2",
                        "--requests", "4", "--max-tokens", "8", "--stream", "--no-progress"])
    assert rc == 0
    level = json.loads((tmp_path / "out" / "report.json").read_text())["levels"][0]
    assert (level["requests_sent"], level["requests_ok"], level["errors"]) == (4, 4, {})
    assert level["draft_tokens"] > 0 and level["output_tokens"] > 0


def test_genai_perf_command(build: tuple[Any, Path]) -> None:
    """The argv that genai-perf 0.0.16 (perf_analyzer 2.51) ran against this repository on the CPU server with
    output token counts equal to the generated ones (scripts/genai_perf_run.sh, docs/deploy.md)."""
    schema = sch.from_repository(build[1] / "triton_repo")
    assert schema.tokenizer == str(build[1] / "checkpoint" / "tokenizer")
    argv = genai_perf.genai_perf_argv(schema, grpc_url="127.0.0.1:8001", http_url="127.0.0.1:8000",
                                      tokenizer=schema.tokenizer, max_tokens=16, concurrency=1, requests=4)
    assert argv == [
        "genai-perf", "profile", "-m", "tensorrt_llm", "--tokenizer", schema.tokenizer, "--concurrency", "1",
        "--request-count", "4", "--synthetic-input-tokens-mean", "128", "--endpoint-type", "generate",
        "-u", "127.0.0.1:8000", "--extra-inputs", "sampling_param_max_tokens:16",
        "--extra-inputs", "sampling_param_exclude_input_from_output:true"]


# ---- hostile requests: bounded before the prompt is tokenized, INVALID_ARGUMENT by name, no traceback ----------------

LEAKS = ("Traceback", 'File "', "site-packages", "/usr/", "line ")


def _llmapi_inputs(prompts: list[bytes], **extra: tuple[np.ndarray, str]) -> list[Any]:
    def inp(name: str, arr: np.ndarray, dt: str) -> Any:
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    ins = [inp("text_input", np.array(prompts, dtype=object), "BYTES"), inp("streaming", np.array([True]), "BOOL"),
           inp("sampling_param_max_tokens", np.array([N], np.int32), "INT32")]
    return ins + [inp(k, v, dt) for k, (v, dt) in extra.items()]


def _stream(url: str, ins: list[Any], request_id: str = "") -> Any:
    """The text of one llmapi stream (cumulative: the last response), or the error it ended with."""
    import queue

    c = grpcclient.InferenceServerClient(url)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        c.async_stream_infer("tensorrt_llm", ins, request_id=request_id, enable_empty_final_response=True)
        text = ""
        while True:
            result, error = got.get(timeout=300)
            if error is not None:
                return error
            resp = result.get_response()
            if resp.outputs:
                text = result.as_numpy("text_output")[0].decode()
            if resp.parameters["triton_final_response"].bool_param:
                return text
    finally:
        c.stop_stream()
        c.close()


def test_hostile_requests_are_refused_before_tokenizing_and_a_concurrent_stream_is_unchanged(
    server: Any, greedy_text: str
) -> None:
    """Each of these, sent while a good stream decodes, gets INVALID_ARGUMENT naming what was wrong (no traceback,
    no install path): a 5 MB prompt (refused by its bytes before it is tokenized), an empty prompt, a prompt that is
    not UTF-8, 64 prompts in one request (upstream answers the first and drops the rest), stop strings that are not
    UTF-8, too many or too long, upstream's stop request without the request's stop_key, and a 10,000-byte request
    id. The good stream's text equals target-only greedy decoding."""
    import threading

    bad = {
        "5 MB prompt": (_llmapi_inputs([b"a" * 5_000_000]), "text_input has 5000000 bytes >"),
        "empty prompt": (_llmapi_inputs([b""]), "text_input is empty"),
        "not UTF-8": (_llmapi_inputs([b"caf\xe9 au lait"]), "text_input is not valid UTF-8"),
        "64 prompts": (_llmapi_inputs([PROMPT.encode()] * 64), "text_input holds 64 prompts"),
        "stop not UTF-8": (_llmapi_inputs([PROMPT.encode()], sampling_param_stop=(
            np.array([b"\xff\xfe"], dtype=object), "BYTES")), "sampling_param_stop[0] is not valid UTF-8"),
        "stop flood": (_llmapi_inputs([PROMPT.encode()], sampling_param_stop=(
            np.array([b"w%d" % i for i in range(200_000)], dtype=object), "BYTES")),
            "sampling_param_stop has 200000 entries > 64"),
        "long stop": (_llmapi_inputs([PROMPT.encode()], sampling_param_stop=(
            np.array([b"z" * 4000], dtype=object), "BYTES")), "sampling_param_stop[0] has 4000 bytes > 1024"),
        "stop by guess": (_llmapi_inputs([b"x"], stop=(np.array([True]), "BOOL")),
                          "stop: no stop_key parameter; a stop reaches only a request sent with the same request id"),
        "long id": (_llmapi_inputs([b"x"]), "request id has 10000 bytes > 128"),
    }
    results: dict[str, Any] = {}
    good = threading.Thread(target=lambda: results.update(good=_stream(server.grpc_url,
                                                                       _llmapi_inputs([PROMPT.encode()]), "1")))
    good.start()
    for k, (ins, _msg) in bad.items():
        results[k] = _stream(server.grpc_url, ins, "x" * 10_000 if k == "long id" else "1")
    good.join(timeout=600)
    for k, (_ins, msg) in bad.items():
        err = results[k]
        assert isinstance(err, InferenceServerException), (k, err)
        assert msg in err.message() and not any(leak in err.message() for leak in LEAKS), (k, err.message())
        assert len(err.message()) < 1000, k
    assert results["good"] == greedy_text


def test_each_limit_is_refused_by_name_and_a_running_stream_is_unaffected(
    server: Any, build: tuple[Any, Path], greedy_text: str
) -> None:
    """The llmapi `tensorrt_llm` model called directly (triton_repo/models/llmapi_io.py `parse`): every input limit
    answers with its own message while a stream that was already running goes on to the target-only greedy text."""
    import queue

    from testkit.triton_requests import stream_call

    def inp(name: str, value: Any, dt: str) -> Any:
        arr = np.array([value], dtype={"BYTES": object, "INT32": np.int32, "BOOL": bool, "FP32": np.float32}[dt])
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    def req(text: str, n: int, **extra: tuple[Any, str]) -> list[Any]:
        return [inp("text_input", text.encode(), "BYTES"), inp("sampling_param_max_tokens", n, "INT32"),
                *(inp(k, v, dt) for k, (v, dt) in extra.items())]

    from builders.layout import CHECKPOINT, TOKENIZER
    from engines.runtime import load_tokenizer

    tok = load_tokenizer(build[1] / CHECKPOINT / TOKENIZER)
    long_text = "fox " * 200
    n_long = len(tok.encode(long_text))
    n_prompt = len(tok.encode(PROMPT))
    bad = [
        (req(long_text, 4), f"prompt of {n_long} tokens exceeds engine.max_input_len=128; shorten it"),
        (req(PROMPT, 256), f"prompt {n_prompt} + sampling_param_max_tokens 256 exceeds engine.max_seq_len=256"),
        (req(PROMPT, 0), "sampling_param_max_tokens=0 must be >= 1"),
        (req(PROMPT, 4, sampling_param_best_of=(2, "INT32")), "sampling_param_best_of=2"),
        # TensorRT-LLM's one-model rule (models/llmapi_refusals.py), the switch named: the mirror follows it too
        # (this build drafts a dynamic tree, under which upstream applies no penalty even with enable_penalty)
        (req(PROMPT, 4, sampling_param_frequency_penalty=(0.5, "FP32")), "sampling_param_frequency_penalty=0.5: "
         "TensorRT-LLM does not apply penalties under tree speculation (this deployment drafts a tree); send the "
         "request without them, or serve a chain built with tree.enable_penalty"),
        (req(PROMPT, 4, sampling_param_presence_penalty=(-0.25, "FP32"),
             sampling_param_frequency_penalty=(0.0, "FP32")),
         "sampling_param_presence_penalty=-0.25: TensorRT-LLM"),
        (req(PROMPT, 4, return_cumulative_logprob=(True, "BOOL")), "return_cumulative_logprob: speculative decoding "
         "computes no log probabilities"),
        (req(PROMPT, 4, sampling_param_temperature=(-1.0, "FP32")), "temperature=-1.0 must be a finite number >= 0"),
        (req(PROMPT, 4, sampling_param_top_p=(1.5, "FP32")), "top_p=1.5 must be in (0, 1]"),
    ]
    running = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    running.start_stream(callback=lambda result, error: got.put((result, error)))
    texts: list[str] = []
    try:
        running.async_stream_infer("tensorrt_llm", req(PROMPT, N, streaming=(True, "BOOL")), request_id="running")
        result, error = got.get(timeout=120)
        assert error is None, error
        final = result.get_response().parameters["triton_final_response"].bool_param
        assert not final, "the running stream must still be running when the bad requests arrive"
        texts.append(result.as_numpy("text_output")[0].decode())
        other = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for ins, message in bad:
                with pytest.raises(InferenceServerException) as err:
                    stream_call(other, "tensorrt_llm", ins)
                assert message in err.value.message(), (message, err.value.message())
        finally:
            other.close()
        while not final:
            result, error = got.get(timeout=120)
            assert error is None, f"the running stream failed next to the refused requests: {error}"
            texts.append(result.as_numpy("text_output")[0].decode())
            final = result.get_response().parameters["triton_final_response"].bool_param
    finally:
        running.stop_stream()
        running.close()
    assert texts[-1] == greedy_text


# ---- cancellation: a plain gRPC cancel, the llmapi entry model's one path (docs/triton.md, "Cancellation") ----------


def test_a_plain_grpc_cancel_frees_the_llmapi_request_and_the_next_request_is_served(server: Any) -> None:
    """A stream cancelled after its first response (tritonclient's cancel, no stop request): the model sees the
    cancellation and ends the request, counted cancelled, long before its 200 tokens; nothing stays in flight and
    the next request is served."""
    import queue
    import time

    from testkit.triton_servers import metric

    def wait_in_flight(n: int) -> None:
        deadline = time.time() + 120
        while metric(server, "eagle_llm_requests_in_flight", model="tensorrt_llm") != n:
            assert time.time() < deadline, f"never {n} in flight"
            time.sleep(0.05)

    wait_in_flight(0)
    names = ("eagle_llm_requests_cancelled_total", "eagle_llm_generated_tokens_total")
    before = {n: metric(server, n, model="tensorrt_llm") for n in names}
    ins = _llmapi_inputs([PROMPT.encode()])
    ins[2].set_data_from_numpy(np.array([200], np.int32))  # sampling_param_max_tokens
    c = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer("tensorrt_llm", ins, enable_empty_final_response=True)
    result, error = got.get(timeout=300)
    assert error is None and result.get_response().outputs
    c.stop_stream(cancel_requests=True)
    c.close()
    wait_in_flight(0)
    assert metric(server, names[0], model="tensorrt_llm") == before[names[0]] + 1
    assert metric(server, names[1], model="tensorrt_llm") - before[names[1]] < 200
    assert isinstance(_stream(server.grpc_url, _llmapi_inputs([PROMPT.encode()])), str)  # served


def test_clients_find_the_model_a_current_line_build_serves(server: Any, build: tuple[Any, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Without --model the client calls the served entry model (here `tensorrt_llm`, not `ensemble`); a model that
    is not loaded is an error naming the ready ones and the two ways to name it; --repo takes the build directory
    too and reads the model name and tokenizer from its client.json."""
    from clients import generate

    from_server = sch.fetch_schema(server.grpc_url, None)
    assert from_server.model == "tensorrt_llm" and from_server.dialect is sch.LLMAPI
    for asked in ("ensemble", "no_such_model"):
        with pytest.raises(sch.SchemaError) as err:
            sch.fetch_schema(server.grpc_url, asked)
        assert str(err.value).startswith(f"model {asked!r} is not loaded at {server.grpc_url} (")
        assert "of the default entry models, ready: tensorrt_llm" in str(err.value)  # the index is admin-only
        assert "pass --model NAME, or --repo BUILD/triton_repo" in str(err.value)
    for repo in (build[1], build[1] / "triton_repo"):
        s = sch.from_repository(repo)
        assert (s.model, s.tokenizer) == ("tensorrt_llm", str(build[1] / "checkpoint" / "tokenizer"))
    with pytest.raises(sch.SchemaError, match=r"--model ensemble: the build at .* serves 'tensorrt_llm'"):
        sch.from_repository(build[1], "ensemble")
    assert generate.main(["--url", server.grpc_url, "--repo", str(build[1]), "--prompt", PROMPT,
                          "--max-tokens", "8"]) == 0
    err_text = capsys.readouterr().err
    assert "output tokens: " in err_text and "not counted" not in err_text
    assert generate.main(["--url", server.grpc_url, "--model", "ensemble", "--prompt", PROMPT]) == 2
    assert "of the default entry models, ready: tensorrt_llm" in capsys.readouterr().err


def test_eagle_check_on_the_smollm2_build_accepts_drafts_and_stays_lossless(build: tuple[Any, Path],
                                                                            tmp_path: Path) -> None:
    """`eagle-check` (doctor/eagle_check.py; the rest of its tests: tests/test_eagle_check.py) on this build: no
    TensorRT-LLM here, so the reference engine runs it and says so; the trained head's drafts are accepted."""
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in (PROMPT, "Write a haiku about the sea.")))
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), TQDM_DISABLE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "doctor.eagle_check", str(build[1]), "--prompts", str(prompts),
                        "--max-new-tokens", "12", "--json", str(out)], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=600)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "Every step below runs on the REFERENCE ENGINE" in p.stdout
    assert "options: triton_repo/tensorrt_llm/1/model.yaml (checked against the contract ledger only)" in p.stdout
    assert "with speculation = without: 2/2 prompts identical" in p.stdout
    r = json.loads(out.read_text())
    assert r["identical"] and r["stats"]["accepted_draft_tokens"] > 0 and r["stats"]["tau"] > 1.0, r["stats"]


@pytest.mark.parametrize("way", ["kill", "http"])
def test_a_killed_or_dropped_llmapi_client_is_cancelled(server: Any, way: str) -> None:
    """A client killed after its first chunk (its connection drops with no goodbye) or an HTTP generate_stream
    connection dropped, with and without a stop_key (bench/bench_abandon.py): each request is counted cancelled and
    nothing stays in flight."""
    import time

    from bench import bench_abandon
    from testkit.triton_servers import metric

    def idle() -> float:
        deadline = time.time() + 120
        while metric(server, "eagle_llm_requests_in_flight", model="tensorrt_llm") > 0 and time.time() < deadline:
            time.sleep(0.05)
        return metric(server, "eagle_llm_requests_in_flight", model="tensorrt_llm")

    assert idle() == 0
    before = metric(server, "eagle_llm_requests_cancelled_total", model="tensorrt_llm")
    for stop_key in (False, True):
        bench_abandon.leave(server, "tensorrt_llm", 200, way, stop_key)
    assert idle() == 0
    assert metric(server, "eagle_llm_requests_cancelled_total", model="tensorrt_llm") == before + 2
