"""The python backend's /dev/shm regions of a server we launched are removed on every exit path the launcher
controls (stop, a crash of the server, a stop before readiness, a failed start) and, at the next start, those of
earlier launchers that are gone (killed with their server) - never a region some process still maps
(triton_repo/shm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.echo_repo import render_echo_repo
from triton_repo import shm
from triton_repo.launch import LaunchError, LaunchInterrupted, TritonServer, free_port

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parent.parent


def _server(repo: Path, tmp_path: Path) -> TritonServer:
    return TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                        log_path=tmp_path / f"server-{time.monotonic_ns()}.log")


def _wait(pred, timeout: float = 120) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_regions_are_removed_after_a_crash_a_stop_and_a_stop_before_readiness(tmp_path: Path) -> None:
    repo = render_echo_repo(tmp_path / "repo")
    srv = _server(repo, tmp_path)
    srv.start(timeout_s=120)
    regions = shm.own_regions(srv.shm_tag)
    assert regions, "the python backend made no regions: nothing under test"
    assert srv.pid is not None
    os.killpg(srv.pid, signal.SIGKILL)  # the server crashes (its stubs with it)
    assert _wait(lambda: not srv.is_running())
    assert all(p.exists() for p in regions)  # left behind by the crash ...
    srv.stop()
    assert shm.own_regions(srv.shm_tag) == []  # ... and removed by the launcher

    srv = _server(repo, tmp_path)
    srv.start(timeout_s=120)
    assert shm.own_regions(srv.shm_tag)
    assert srv.stop(timeout_s=8) is not None and shm.own_regions(srv.shm_tag) == []

    srv = _server(repo, tmp_path)
    polls = {"n": 0}

    def stop_once_regions_exist() -> bool:
        polls["n"] += 1
        return bool(shm.own_regions(srv.shm_tag))

    with pytest.raises(LaunchInterrupted):
        srv.start(timeout_s=120, stop_requested=stop_once_regions_exist)
    assert polls["n"] >= 1 and shm.own_regions(srv.shm_tag) == []


def test_a_start_that_fails_leaves_no_regions(tmp_path: Path) -> None:
    repo = render_echo_repo(tmp_path / "repo")
    broken = repo / "ensemble" / "1" / "model.py"
    broken.write_text(broken.read_text() + "\nraise RuntimeError('this model cannot load')\n")
    srv = _server(repo, tmp_path)
    with pytest.raises(LaunchError, match="exited with code"):
        srv.start(timeout_s=120)
    assert shm.own_regions(srv.shm_tag) == []


def test_the_next_start_removes_regions_of_killed_launchers_but_not_of_running_servers(tmp_path: Path) -> None:
    """Two launchers (the CLI) with their servers; one is killed with its server (SIGKILL: nothing of ours runs),
    the other launcher is killed while its server keeps running. A new server's start removes the first's regions
    and keeps the second's, which are still mapped."""
    repo = render_echo_repo(tmp_path / "repo")
    procs = []
    for i in range(2):
        ports = [str(free_port()) for _ in range(3)]
        procs.append((subprocess.Popen(
            [sys.executable, str(REPO / "triton_repo" / "launch.py"), "--repo", str(repo), "--grpc-port", ports[0],
             "--http-port", ports[1], "--metrics-port", ports[2], "--log", str(tmp_path / f"l{i}.log")],
            stdout=subprocess.PIPE, text=True, start_new_session=True), ports[0]))
    tags = [f"{p.pid}_{port}" for p, port in procs]
    for p, _ in procs:
        assert "tritonserver ready" in p.stdout.readline() + p.stdout.readline()
    regions = [shm.own_regions(t) for t in tags]
    assert all(regions)
    server_pids = [int(subprocess.check_output(["pgrep", "-P", str(p.pid), "-f", "tritonserver"]).split()[0])
                   for p, _ in procs]
    os.kill(procs[0][0].pid, signal.SIGKILL)
    os.killpg(server_pids[0], signal.SIGKILL)  # the first launcher and its server: gone
    os.kill(procs[1][0].pid, signal.SIGKILL)  # the second launcher only: its server keeps serving
    for p, _ in procs:
        p.wait(timeout=30)
    assert _wait(lambda: not os.path.exists(f"/proc/{server_pids[0]}"))
    srv = _server(repo, tmp_path)
    srv.start(timeout_s=120)
    try:
        assert not any(p.exists() for p in regions[0])  # removed at this start
        assert all(p.exists() for p in regions[1])  # in use: kept
    finally:
        srv.stop(timeout_s=8)
        os.killpg(server_pids[1], signal.SIGKILL)
        _wait(lambda: not os.path.exists(f"/proc/{server_pids[1]}"))
        shm.remove(shm.stale_regions())
