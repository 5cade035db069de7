"""A dead model behind a ready server (triton_repo/supervise.py): after kill -9 of a model's python-backend stub (what
the OOM killer does) the launcher (`python triton_repo/launch.py`) stops the server, which turns unready, and exits 1;
a stub that ends because its model was unloaded is not a death. Real tritonserver on the shared tiny build."""

from __future__ import annotations

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

from triton_repo import supervise
from triton_repo.exposure import ADMIN_HEADER, ADMIN_KEY_ENV
from triton_repo.launch import free_port

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parent.parent
KEY = "k" * 40


def _status(port: int, path: str, method: str = "GET") -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers={ADMIN_HEADER: KEY},
                                 data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return 0  # nothing listens: not ready either


class Launched:
    def __init__(self, repo: Path, log: Path) -> None:
        self.http = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_repo.launch", "--repo", str(repo), "--grpc-port", str(free_port()),
             "--http-port", str(self.http), "--metrics-port", str(free_port()), "--log", str(log),
             "--model-control", "explicit", "--drain-s", "5"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, ADMIN_KEY_ENV: KEY, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("tritonserver ready (pid "), line + self.proc.stderr.read()  # type: ignore[union-attr]
        self.server_pid = int(line.split("pid ")[1].split(",")[0])

    def stubs(self) -> dict[str, int]:
        return {s.model: pid for pid, s in supervise.stubs_of(self.server_pid).items()}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)


@pytest.fixture
def launched(triton_build_dir: Path, tmp_path: Path) -> Any:
    srv = Launched(triton_build_dir / "triton_repo", tmp_path / "tritonserver.log")
    yield srv
    srv.close()


@pytest.mark.parametrize("model", ["tensorrt_llm", "postprocessing"])
def test_a_killed_stub_makes_the_server_unready_and_the_launcher_exit_1(launched: Launched, model: str) -> None:
    stubs = launched.stubs()
    assert {"tensorrt_llm", "postprocessing", "preprocessing", "tensorrt_llm_bls"} <= set(stubs), stubs
    if model == "tensorrt_llm":  # an unloaded model's stub ends too: not a death, the launcher carries on
        assert _status(launched.http, "/v2/repository/models/tensorrt_llm_bls/unload", "POST") == 200
        deadline = time.monotonic() + 60
        while supervise.alive(stubs["tensorrt_llm_bls"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not supervise.alive(stubs["tensorrt_llm_bls"])
        time.sleep(3 * supervise.POLL_S)
        assert launched.proc.poll() is None and _status(launched.http, "/v2/health/ready") == 200
    assert _status(launched.http, f"/v2/models/{model}/versions/1/ready") == 200
    os.kill(stubs[model], signal.SIGKILL)
    assert launched.proc.wait(timeout=120) == 1
    assert _status(launched.http, "/v2/health/ready") != 200
    err = launched.proc.stderr.read()  # type: ignore[union-attr]
    assert f"error: model {model!r} version 1: its python-backend stub (pid {stubs[model]}) died while the server " \
           "still reports the model ready" in err
