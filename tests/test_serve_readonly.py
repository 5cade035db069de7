"""A current-line build serves from a read-only mount (docs/deploy.md, Kubernetes: the manifests mount the builds
volume read-only): `docker/serve.py` on the CPU path in a private mount namespace where the build directory is
bind-mounted read-only over itself, so any write the start path or the served model makes into the build fails.
The server becomes ready, answers, records captured requests into a store outside the build, and the build's files
are byte for byte what the build wrote."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from triton_repo.launch import free_port
from triton_repo.models import capture as C

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parent.parent


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def _serve_read_only(build: Path, cmd: list[str], out: Path,
                     env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`cmd` in a private mount namespace where `build` is bind-mounted read-only over itself (exit 9: it was not)."""
    b = shlex.quote(str(build))
    script = (f"mount --bind {b} {b} && mount -o remount,bind,ro {b} && touch {b}/probe 2>/dev/null && exit 9; "
              f"exec {shlex.join(cmd)}")
    with open(out, "w") as f:
        return subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=ROOT, start_new_session=True, stdout=f,
                                stderr=subprocess.STDOUT, env=env)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _ready(port: int, deadline: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):  # an exited server is never ready
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount namespace)")
def test_a_current_line_build_serves_from_a_read_only_mount(tmp_path: Path) -> None:
    from builders.build import main as build_main
    from testkit import tiny_models as tm

    target, head = tm.make_llmapi_pair(tmp_path)
    build, store = tmp_path / "build", tmp_path / "store"
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"name: ro\ntrtllm_version: '1.4'\noutput_dir: {build}\n"
                   f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-3}\n"
                   "engine: {backend: reference, device: cpu, max_batch_size: 2, max_input_len: 48, max_seq_len: 96}\n"
                   f"capture: {{enabled: true, dir: {store}, segment_records: 1}}\n")
    assert build_main([str(cfg)]) == 0
    before = _digest(build)
    http, grpc, metrics = free_port(), free_port(), free_port()
    serve = [sys.executable, str(ROOT / "docker" / "serve.py"), str(build), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log", str(tmp_path / "triton.log"),
             "--timeout", "240"]
    proc = _serve_read_only(build, serve, tmp_path / "serve.out")
    try:
        assert _ready(http, time.monotonic() + 240, proc), (tmp_path / "serve.out").read_text()[-3000:] + (
            (tmp_path / "triton.log").read_text()[-3000:] if (tmp_path / "triton.log").is_file() else "")
        for text in ("hello world", "the quick brown fox"):
            body = json.dumps({"text_input": text, "sampling_param_max_tokens": 6}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/tensorrt_llm/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            assert json.loads(urllib.request.urlopen(req, timeout=120).read())["text_output"]
        deadline = time.monotonic() + 30
        while len(list(C.read_records(store))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(C.read_records(store))) == 2  # capture writes outside the build
    finally:
        _stop(proc)
    assert proc.returncode != 9, "the bind mount was writable: the test proves nothing"
    assert not (build / "probe").exists() and _digest(build) == before


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount namespace)")
def test_the_pytorch_backend_bridge_imports_upstream_from_the_image_into_a_read_only_build(tmp_path: Path) -> None:
    """engine.backend pytorch: the metrics bridge loads upstream's model.py and helpers.py from
    $TRTLLM_LLMAPI_MODEL_DIR (here the test stand-in for TensorRT-LLM's model: no GPU), nothing copied into the
    build, which is read-only."""
    from builders.build import main as build_main
    from testkit import tiny_models as tm

    target, head = tm.make_llmapi_pair(tmp_path)
    build = tmp_path / "build"
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: rop\ntrtllm_version: '1.4'\noutput_dir: {build}\n"
                   f"target: {{model: {target}, dtype: float16}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-3}\nengine: {backend: pytorch, max_batch_size: 2, max_input_len: 48, "
                   "max_seq_len: 96}\n")
    assert build_main([str(cfg)]) == 0
    assert not (build / "triton_repo" / "tensorrt_llm" / "1" / "upstream_model.py").exists()
    before = _digest(build)
    http = free_port()
    env = {**os.environ, "TRTLLM_LLMAPI_MODEL_DIR": str(ROOT / "tests" / "fixtures" / "llmapi_upstream_standin")}
    cmd = [sys.executable, str(ROOT / "triton_repo" / "launch.py"), "--repo", str(build / "triton_repo"),
           "--http-port", str(http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
           "--log", str(tmp_path / "triton.log"), "--timeout", "240"]
    proc = _serve_read_only(build, cmd, tmp_path / "serve.out", env)
    try:
        assert _ready(http, time.monotonic() + 240, proc), (tmp_path / "serve.out").read_text()[-3000:]
        body = json.dumps({"text_input": "hello world"}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/tensorrt_llm/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=120).read())["text_output"] == "ok"  # the stand-in's
    finally:
        _stop(proc)
    assert proc.returncode != 9 and _digest(build) == before
