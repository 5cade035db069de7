r"""Seconds from kill -9 of a model's python-backend stub until the server stops answering ready.

    .venv/bin/python bench/bench_stub_death.py --repo build/demo/triton_repo [--runs 3] [--model tensorrt_llm]

Each run starts the launcher (`python -m triton_repo.launch`) on --repo, waits until it is ready, kills the stub of
--model with SIGKILL (what the OOM killer does) and polls /v2/health/ready every 20 ms: prints the seconds until it
stopped answering 200 ("never" after --wait-s) and the launcher's exit code.

Inputs:  --repo, a rendered Triton repository
Outputs: one line per run and a summary (median, max) on stdout
Guide:   docs/deploy.md ("A dead model")
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from triton_repo import supervise
from triton_repo.launch import free_port

ROOT = Path(__file__).resolve().parent.parent


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def one(repo: Path, model: str, wait_s: float, log: Path) -> tuple[float | None, int | None]:
    http = free_port()
    p = subprocess.Popen([sys.executable, "-m", "triton_repo.launch", "--repo", str(repo), "--http-port", str(http),
                          "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), "--log", str(log)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=log.with_suffix(".launcher").open("w"), text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("tritonserver ready (pid "):
            p.wait(timeout=60)
            said = log.with_suffix(".launcher").read_text()[-2000:]
            raise SystemExit(f"the launcher did not start (exit code {p.returncode}): {said}")
        stubs = {s.model: pid for pid, s in supervise.stubs_of(int(line.split("pid ")[1].split(",")[0])).items()}
        if model not in stubs:
            raise SystemExit(f"no stub of model {model!r} (stubs: {sorted(stubs)})")
        os.kill(stubs[model], signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait_s:
            if not ready(http):
                took = time.monotonic() - t0
                break
            time.sleep(0.02)
        else:
            took = None
        try:
            code: int | None = p.wait(timeout=max(1.0, wait_s - (time.monotonic() - t0)) + 60)
        except subprocess.TimeoutExpired:
            code = None
        return took, code
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="the rendered Triton repository")
    ap.add_argument("--runs", type=int, default=3, help="servers started, one stub killed in each")
    ap.add_argument("--model", default="tensorrt_llm", help="the model whose stub is killed")
    ap.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the server to turn unready")
    args = ap.parse_args(argv)
    if not args.repo.is_dir():
        print(f"error: --repo {args.repo} is not a directory", file=sys.stderr)
        return 2
    took = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            t, code = one(args.repo, args.model, args.wait_s, Path(tmp) / f"server-{i}.log")
            took.append(t)
            shown = "never" if t is None else f"{t:.2f} s"
            print(f"run {i + 1}: unready after {shown}, launcher exit code {code}", flush=True)
    done = [t for t in took if t is not None]
    if done:
        print(f"{len(done)}/{len(took)} turned unready: median {statistics.median(done):.2f} s, max {max(done):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
