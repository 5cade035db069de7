"""Serving defaults on the real tritonserver (CPU, nvidia-pytriton 2.51) and the launcher: admin endpoints behind
a key, oversized prompts refused by their byte length before tokenizing, paths the python backend cannot start
stubs under refused up front, and `launch.py` stopping promptly on SIGTERM while models are still loading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException

from triton_repo.launch import ADMIN_GRPC_HEADER, LaunchError, TritonServer, free_port
from tests import test_triton_server
from tests.test_triton_server import start_server

build_dir = test_triton_server.build_dir  # the module fixture its tests request by name
from testkit.triton_requests import PROMPT, infer_input, inputs, stream_call

pytestmark = pytest.mark.server
REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_INPUT = 48  # tests/test_triton_server.py build_dir


@pytest.fixture(scope="module")
def server(build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    srv, log = start_server(build_dir, tmp_path_factory, "triton_security_log")
    yield srv
    assert srv.stop() == 0, f"tritonserver did not stop cleanly; log {log}"


@pytest.fixture(scope="module")
def client(server: TritonServer) -> Any:
    return tritonclient_grpc.InferenceServerClient(server.grpc_url)


def http(server: TritonServer, method: str, path: str, body: dict | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ---- restricted admin APIs ----------------------------------------------------------------------------------------


def test_admin_grpc_apis_need_the_key(server: TritonServer, client: Any) -> None:
    for call in (client.get_model_repository_index, client.get_log_settings, client.get_trace_settings,
                 client.get_system_shared_memory_status):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-eagle-admin-key'"
            in err.value.message()
        ), call
        with pytest.raises(InferenceServerException):
            call(headers={ADMIN_GRPC_HEADER: "wrong"})
        call(headers=server.admin_headers)  # answers with the key
    index = client.get_model_repository_index(headers=server.admin_headers)
    assert {m.name for m in index.models} >= {"ensemble", "preprocessing", "tensorrt_llm"}
    # Inference, health and metadata stay open.
    assert client.is_server_ready() and client.get_model_metadata("ensemble").name == "ensemble"
    [ok] = stream_call(client, "ensemble", inputs(PROMPT, 2))
    assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)


def test_admin_http_apis_need_the_key(server: TritonServer) -> None:
    calls = [("POST", "/v2/repository/index", {}), ("GET", "/v2/logging", None), ("GET", "/v2/trace/setting", None),
             ("GET", "/v2/systemsharedmemory/status", None)]
    for method, path, body in calls:
        code, text = http(server, method, path, body)
        assert code == 403 and "This API is restricted, expecting header 'eagle-admin-key'" in text, (path, code, text)
        code, text = http(server, method, path, body, headers=server.admin_headers)
        assert code == 200, (path, code, text)
    code, text = http(server, "POST", "/v2/logging", {"log_verbose_level": 1})
    assert code == 403, "changing the log level needs the key"
    assert http(server, "GET", "/v2/health/ready")[0] == 200
    assert http(server, "GET", "/v2/models/ensemble/config")[0] == 200


# ---- bounded input cost -------------------------------------------------------------------------------------------


def _byte_bound(build_dir: Path) -> tuple[int, int]:
    sys.path.insert(0, str(REPO_ROOT))
    from transformers import AutoTokenizer

    from triton_repo.models.common import max_text_bytes

    tok = AutoTokenizer.from_pretrained(build_dir / "checkpoint" / "tokenizer", local_files_only=True)
    return max_text_bytes(tok, MAX_INPUT)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_oversized_prompt_refused_by_byte_length_before_tokenizing(client: Any, build_dir: Path, model: str) -> None:
    limit, per_token = _byte_bound(build_dir)
    assert limit == MAX_INPUT * per_token
    for size in (limit + 1, 8 << 20):
        text = ("fox " * (size // 4 + 1))[:size]
        t0 = time.perf_counter()
        with pytest.raises(InferenceServerException) as err:
            stream_call(client, model, inputs(text, 4))
        seconds = time.perf_counter() - t0
        assert (f"text_input has {size} bytes > {limit} = max_input_len {MAX_INPUT} x {per_token} bytes "
                "(the longest token)") in err.value.message()
        print(f"{model}: {size} bytes refused in {seconds * 1e3:.1f} ms (round trip)")
    # At the bound the byte check passes and the token check decides, as before.
    with pytest.raises(InferenceServerException) as err:
        stream_call(client, model, inputs(("fox " * limit)[:limit], 4))
    assert f"exceeds engine.max_input_len={MAX_INPUT}" in err.value.message()
    [ok] = stream_call(client, model, inputs(PROMPT, 2))
    assert ok["text_output"].reshape(-1)[0].decode().startswith(PROMPT)


def test_oversized_prompt_status_is_invalid_argument(client: Any, build_dir: Path) -> None:
    limit, _ = _byte_bound(build_dir)
    ins = [infer_input("QUERY", "x" * (limit + 1), "BYTES"), infer_input("REQUEST_OUTPUT_LEN", 4, "INT32")]
    with pytest.raises(InferenceServerException) as err:
        client.infer("preprocessing", ins)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "bytes >" in err.value.message()


# ---- launcher -----------------------------------------------------------------------------------------------------


def test_repository_path_the_python_backend_cannot_use_is_refused_at_once(tmp_path: Path) -> None:
    repo = tmp_path / "my models" / "triton_repo"
    repo.mkdir(parents=True)
    srv = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())
    with pytest.raises(LaunchError, match=r"model repository '.*my models/triton_repo' contains ' ': .*std::invalid"):
        srv.start(timeout_s=600)
    assert srv.pid is None, "no server was started"


def test_launch_cli_stops_promptly_on_sigterm_while_models_load(build_dir: Path, tmp_path: Path) -> None:
    log, grpc_port = tmp_path / "server.log", free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "triton_repo" / "launch.py"), "--repo", str(build_dir / "triton_repo"),
         "--grpc-port", str(grpc_port), "--http-port", str(free_port()), "--metrics-port", str(free_port()),
         "--log", str(log), "--timeout", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "$ " in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "eagle-admin-key=***" in log.read_text(), "the command is logged with the admin key masked"
        proc.send_signal(signal.SIGTERM)  # models are still loading: the server is not ready yet
        out, _ = proc.communicate(timeout=60)  # before the fix: ignored until ready (up to --timeout, 600 s)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "admin APIs (logging, model-repository, trace, shared-memory) closed: set TRITON_ADMIN_KEY" in out
    assert "stopped before the server was ready" in out and "tritonserver ready" not in out
    alive = subprocess.run(["pgrep", "-f", f"--grpc-port={grpc_port}"], capture_output=True, text=True).stdout
    assert alive.strip() == "", f"server processes left running: {alive}"
