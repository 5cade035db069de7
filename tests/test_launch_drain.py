"""SIGTERM to triton_repo/launch.py while a request that will not end soon is in flight (an ensemble stream whose client
went away without a stop_key: nothing stops it): tritonserver waits `--drain-s` (its exit timeout, which also
bounds the unload) and then exits anyway, and the launcher ends with exit code 0 (it used to wait Triton's 30 s
default)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.triton_requests import inputs
from testkit.triton_servers import tiny_reference_repo
from triton_repo import launch

pytestmark = pytest.mark.server
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
ROOT = Path(__file__).resolve().parent.parent


def _abandon(url: str) -> None:
    """An ensemble stream of 1,000 tokens without a stop_key, gone after its first chunk."""
    c = tritonclient_grpc.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer("ensemble", inputs("hold on", 1000, stream=(True, "BOOL"), end_id=(-1, "INT32")),
                         enable_empty_final_response=True)
    result, error = q.get(timeout=120)
    assert error is None and result.get_response().outputs
    c.stop_stream(cancel_requests=True)
    c.close()


@pytest.mark.parametrize("drain_s", [1, 3])
def test_sigterm_drains_for_drain_s_then_stops(drain_s: int, tmp_path: Path, tiny_target: Path,
                                               eagle_head: Path) -> None:
    repo = tiny_reference_repo(tmp_path, "tiny-drain", tiny_target, eagle_head, max_seq_len=1100)
    ports = [launch.free_port() for _ in range(3)]
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "triton_repo" / "launch.py"), "--repo", str(repo), "--grpc-port", str(ports[0]),
         "--http-port", str(ports[1]), "--metrics-port", str(ports[2]), "--log", str(log), "--drain-s",
         str(drain_s)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("tritonserver ready")
        _abandon(f"127.0.0.1:{ports[0]}")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=drain_s + launch.STOP_GRACE_S + 60)
        print(f"drain_s={drain_s}: stopped {time.monotonic() - t0:.1f} s after SIGTERM")  # docs/deploy.md
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "tritonserver stopped (exit code" in out, out
    text = log.read_text()
    assert f"--exit-timeout-secs={drain_s}" in text
    assert "in-flight" in text  # it had a request to wait for


def test_drain_s_out_of_range_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    for bad in ("-1", "601"):
        p = subprocess.run([sys.executable, str(ROOT / "triton_repo" / "launch.py"), "--repo", str(tmp_path / "repo"),
                            "--drain-s", bad, "--print-argv"], capture_output=True, text=True)
        assert p.returncode == 2 and f"--drain-s {bad}: give whole seconds in [0, 600]" in p.stderr
