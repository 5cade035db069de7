"""A build's Dynamo deployment (`eagle-dynamo serve`) inside a private network namespace that has only loopback
(`unshare -n`, root), and an HTTP client whose threads enter that namespace (setns), for the tests and the benchmarks:
Dynamo's ZMQ publishers bind every interface on ports no setting pins, so nothing of it may listen beyond the
machine."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DYNAMO_PYTHON = REPO / ".venv-dynamo" / "bin" / "python"
CLONE_NEWNET = 0x40000000
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Dynamo's log lines are coloured


def _log(path: Path) -> str:
    return ANSI.sub("", path.read_text(errors="replace"))


def unavailable() -> str | None:
    """Why a deployment cannot run here (None: it can)."""
    if not DYNAMO_PYTHON.is_file():
        return f"{DYNAMO_PYTHON} not found: run scripts/setup_dynamo.sh (make setup does)"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "a loopback-only network namespace needs root, unshare and ip"
    return None


def _enter(pid: int) -> None:
    """Move the calling thread into the network namespace of process `pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
    finally:
        os.close(fd)


class Deployment:
    """`eagle-dynamo serve BUILD ARGS` in its own loopback-only network namespace."""

    def __init__(self, build: Path, log_dir: Path, *args: str, port: int = 8000, threads: int = 8) -> None:
        self.log_dir, self.port = log_dir, port
        inner = [sys.executable, "-m", "dynamo_serve.serve", "serve", str(build), "--http-port", str(port),
                 "--log-dir", str(log_dir), *args]
        env = dict(os.environ, PYTHONPATH=str(REPO), EAGLE_DYNAMO_PYTHON=str(DYNAMO_PYTHON))
        self.proc = subprocess.Popen(["unshare", "-n", "--", "bash", "-c", 'ip link set lo up && exec "$@"', "_",
                                      *inner], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self.pool = ThreadPoolExecutor(max_workers=threads, initializer=_enter, initargs=(self.proc.pid,))
        self.base = f"http://127.0.0.1:{port}/v1"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready: "):
                self.ready.set()

    def wait_ready(self, timeout_s: float = 300) -> Deployment:
        end = time.monotonic() + timeout_s
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError("eagle-dynamo serve did not become ready:\n" + "\n".join(self.lines))
        return self

    def pids(self) -> dict[str, int]:
        """{process name: pid} from the `started NAME pid PID` lines."""
        return {m[1]: int(m[2]) for line in self.lines if (m := re.match(r"started (\S+) pid (\d+)", line))}

    def worker_of(self, response_id: str) -> str:
        """The worker whose log received the request (the OpenAI id ends with Dynamo's request id)."""
        rid = response_id.split("-", 1)[1]
        hits = [p.stem for p in sorted(self.log_dir.glob("*.log")) if p.stem != "frontend"
                and f"request_id={rid}" in _log(p)]
        if len(hits) != 1:
            raise AssertionError(f"request {rid} found in worker logs {hits}")
        return hits[0]

    def finished(self, worker: str, response_id: str) -> str:
        """The reference engine's `finished:` log line of a request on `worker`."""
        rid = response_id.split("-", 1)[1]
        text = _log(self.log_dir / f"{worker}.log")
        found = re.findall(rf"request {re.escape(rid)} finished: (.*)", text)
        return found[-1] if found else ""

    def inside(self, *argv: str) -> list[str]:
        """`argv` as a command that runs inside the deployment's network namespace (nsenter, root)."""
        return ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", *argv]

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on a thread inside the namespace."""
        return self.pool.submit(fn, *args).result(timeout=300)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.pool.submit(fn, *args)

    def stop(self) -> list[str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.pool.shutdown(wait=False, cancel_futures=True)
        return self.lines


def post(url: str, body: dict[str, Any], timeout_s: float = 120) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return dict(json.loads(r.read()))


def stream(url: str, body: dict[str, Any], on_event: Callable[[dict[str, Any]], bool] = lambda e: True,
           timeout_s: float = 120) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streaming request; `on_event` returning False closes the connection."""
    req = urllib.request.Request(url, json.dumps(dict(body, stream=True)).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            yield event
            if not on_event(event):
                return


def engine_ttft(build: Path) -> Any:
    """A function (prompt, n) -> seconds to the first token of the build's reference engine called directly, one
    thread (what the Dynamo benchmarks compare the frontend against)."""
    import torch

    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    torch.set_num_threads(1)
    eng = ReferenceEngine.from_build(build, device="cpu")
    tok = eng.tokenizer

    def one(prompt: str, n: int) -> float:
        first: list[float] = []

        def on_tokens(slot: int, ids: list[int]) -> bool:
            first.append(time.perf_counter())
            return True

        session = eng.session(1, eng.limits.max_seq_len, speculative=eng.has_draft, on_tokens=on_tokens)
        t0 = time.perf_counter()
        session.add(GenerationRequest(prompt_ids=tok.encode(prompt), max_new_tokens=n,
                                      sampling=SamplingParams(temperature=0.0), stop_token_ids=[tok.eos_token_id]))
        while not first:
            session.step()
        return first[0] - t0

    return one
