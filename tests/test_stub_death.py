"""A dead model behind a ready server (triton_repo/supervise.py): after kill -9 of a model's python-backend stub (what
the OOM killer does) the launcher (`python triton_repo/launch.py`) stops the server, which turns unready, and exits 1;
a stub that ends because its model was unloaded is not a death. Real tritonserver on the shared tiny build."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from triton_repo import shm, supervise
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
    """`python -m triton_repo.launch` on `repo`; waits for its ready line unless `wait_ready` is False. `ports`
    (grpc, http, metrics): a restart's are its predecessor's, as a supervisor restarts it."""

    def __init__(self, repo: Path, log: Path, ports: tuple[int, int, int] | None = None,
                 wait_ready: bool = True) -> None:
        self.ports = ports or (free_port(), free_port(), free_port())
        self.http = self.ports[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_repo.launch", "--repo", str(repo), "--grpc-port", str(self.ports[0]),
             "--http-port", str(self.http), "--metrics-port", str(self.ports[2]), "--log", str(log),
             "--model-control", "explicit", "--drain-s", "5"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, ADMIN_KEY_ENV: KEY, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        if not wait_ready:
            return
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


def test_a_restart_after_a_stub_death_starts_cleanly_on_the_same_ports(launched: Launched, triton_build_dir: Path,
                                                                         tmp_path: Path) -> None:
    """What a supervisor does after the launcher exits 1: start it again at once, same ports, same log."""
    first_tag = f"{launched.proc.pid}_{launched.ports[0]}"
    os.kill(launched.stubs()["tensorrt_llm"], signal.SIGKILL)
    assert launched.proc.wait(timeout=120) == 1
    assert shm.own_regions(first_tag) == []  # the dead server's shared memory is gone with it
    again = Launched(triton_build_dir / "triton_repo", tmp_path / "tritonserver.log", ports=launched.ports)
    try:
        assert {"tensorrt_llm", "postprocessing", "preprocessing", "tensorrt_llm_bls"} <= set(again.stubs())
        assert _status(again.http, "/v2/health/ready") == 200
        assert _status(again.http, "/v2/models/tensorrt_llm/versions/1/ready") == 200
    finally:
        again.close()
    assert again.proc.returncode == 0


@pytest.mark.parametrize("held", ["grpc", "http", "metrics"])
def test_a_port_still_held_is_named_and_nothing_starts(triton_build_dir: Path, tmp_path: Path, held: str) -> None:
    """A restart whose predecessor (or anything else) still listens on one of its ports says which and exits 1
    before starting a server, instead of leaving the reason in the server's log."""
    ports = (free_port(), free_port(), free_port())
    port = ports[("grpc", "http", "metrics").index(held)]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        srv = Launched(triton_build_dir / "triton_repo", tmp_path / "tritonserver.log", ports=ports, wait_ready=False)
        out, err = srv.proc.communicate(timeout=60)
    assert srv.proc.returncode == 1, out + err
    assert f"error: {held} port {port} on 127.0.0.1 is not free (Address already in use)" in err, err
    assert f"give another --{held}-port" in err and "tritonserver ready" not in out
    assert not (tmp_path / "tritonserver.log").exists()  # no server was started


@pytest.mark.parametrize("twice", [(0, 2), (1, 0), (1, 2)])
def test_one_port_given_twice_is_named(triton_build_dir: Path, tmp_path: Path, twice: tuple[int, int]) -> None:
    names = ("grpc", "http", "metrics")
    ports = [free_port(), free_port(), free_port()]
    ports[twice[1]] = ports[twice[0]]
    srv = Launched(triton_build_dir / "triton_repo", tmp_path / "tritonserver.log",
                   ports=(ports[0], ports[1], ports[2]), wait_ready=False)
    out, err = srv.proc.communicate(timeout=60)
    first, second = sorted(twice)
    assert srv.proc.returncode == 1, out + err
    assert f"--{names[second]}-port {ports[first]} is also the --{names[first]}-port; give each its own port" in err


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_loading_stops_the_server_and_says_which(triton_build_dir: Path, tmp_path: Path,
                                                                 sig: signal.Signals) -> None:
    log = tmp_path / "tritonserver.log"
    srv = Launched(triton_build_dir / "triton_repo", log, wait_ready=False)
    deadline = time.monotonic() + 60
    while not (log.exists() and "$ " in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    srv.proc.send_signal(sig)  # the server was just started: its models are loading
    out, err = srv.proc.communicate(timeout=120)
    assert srv.proc.returncode == 0, out + err
    assert f"stopped before the server was ready ({sig.name} received)" in out and "tritonserver ready" not in out
    assert f"launcher stopped by {sig.name} while the server was loading" in err
    alive = subprocess.run(["pgrep", "-f", f"--grpc-port={srv.ports[0]}"], capture_output=True, text=True).stdout
    assert alive.strip() == "", f"server processes left running: {alive}"
