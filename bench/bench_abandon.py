r"""Abandoned streams on a served build: clients that open a stream, read one chunk and go away.

    .venv/bin/python bench/bench_abandon.py --repo build/demo/triton_repo [--abandons 5] [--max-tokens 900] \
        [--models ensemble,tensorrt_llm_bls] [--ways cancel,kill,http] [--stop-key]

For each model and way of leaving, --abandons clients one after the other send a stream request with a fresh
request id (and no stop_key unless --stop-key), read its first chunk and leave: `cancel` cancels the gRPC stream,
`kill` kills the client process (SIGKILL: its connection drops with no goodbye), `http` drops the connection of an
HTTP generate_stream request. Measured: the
seconds from leaving until the LLM model holds no request (eagle_llm_requests_in_flight 0; "never" after
--wait-s), and how many it counted cancelled (eagle_llm_requests_cancelled_total). Then as many clients leave at
once: the requests still held right after, and the seconds until none is. The server is started here (a real
tritonserver on free loopback ports) on --repo.

Inputs:  --repo, a rendered Triton repository of a reference build (ensemble layout or llmapi layout)
Outputs: one line per model and way on stdout; --json writes them all
Guide:   docs/deploy.md ("Abandoned streams")
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from scripts.triton_suite import ensemble_stream, grpc_inputs
from triton_repo.launch import TritonServer, free_port

PROMPT = "Count: 1, 2, 3, 4,"  # a long answer even where no end_id can be set (the llmapi model)


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _inputs(model: str, max_tokens: int) -> list[Any]:
    if model == "tensorrt_llm":  # the llmapi layout: text in, text out as well (triton_repo/llmapi_contract.py)
        return grpc_inputs([("text_input", np.array([PROMPT.encode()], dtype=object), "BYTES"),
                            ("sampling_param_max_tokens", np.array([max_tokens], np.int32), "INT32"),
                            ("streaming", np.array([True]), "BOOL")])
    return ensemble_stream(PROMPT.encode(), max_tokens)


def leave_grpc(srv: TritonServer, model: str, max_tokens: int, stop_key: bool, request_id: str | None = None) -> None:
    """Open a stream (a fresh request id unless given), wait for its first chunk, cancel it."""
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    got, errors = threading.Event(), []

    def first(result: Any, error: Any) -> None:
        if error is not None:
            errors.append(error)
        got.set()

    c.start_stream(callback=first)
    params = {"stop_key": secrets.token_hex(16)} if stop_key else None
    rid = secrets.token_hex(8) if request_id is None else request_id
    c.async_stream_infer(model, _inputs(model, max_tokens), request_id=rid, parameters=params)
    if not got.wait(120):
        raise SystemExit(f"{model}: no first chunk in 120 s")
    if errors:
        raise SystemExit(f"{model}: the request failed: {errors[0]}")
    c.stop_stream(cancel_requests=True)
    c.close()


KILLED = r"""
import threading, time
import bench.bench_abandon as b
c = b.grpcclient.InferenceServerClient({url!r})
got, errors = threading.Event(), []
c.start_stream(callback=lambda result, error: (errors.append(error) if error is not None else None, got.set()))
c.async_stream_infer({model!r}, b._inputs({model!r}, {max_tokens}), request_id=b.secrets.token_hex(8),
                     parameters={params!r})
got.wait(120)
print("got" if not errors else f"error {{errors[0]}}".replace("\n", " "), flush=True)
time.sleep(600)
"""


def leave_killed(srv: TritonServer, model: str, max_tokens: int, stop_key: bool) -> None:
    """A client process killed (SIGKILL) after its first chunk: its connection drops with no goodbye."""
    params = {"stop_key": secrets.token_hex(16)} if stop_key else None
    code = KILLED.format(url=srv.grpc_url, model=model, max_tokens=max_tokens, params=params)
    # run from the project root: `python -c` puts the working directory first on sys.path (bench/ is not installed)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    try:
        said = "" if p.stdout is None else p.stdout.readline().strip()
        if said != "got":
            raise SystemExit(f"{model}: the client process got no first chunk: {said}")
    finally:
        p.kill()
        p.wait()


def leave_http(srv: TritonServer, model: str, max_tokens: int, stop_key: bool) -> None:
    """POST generate_stream, read the first event, drop the connection."""
    body: dict[str, Any] = {"text_input": PROMPT, "max_tokens": max_tokens, "stream": True, "end_id": -1,
                            "id": secrets.token_hex(8)}
    if model == "tensorrt_llm":
        body = {"text_input": [PROMPT], "sampling_param_max_tokens": max_tokens, "streaming": True, "id": body["id"]}
    if stop_key:
        body["stop_key"] = secrets.token_hex(16)
    data = json.dumps(body).encode()
    host, port = srv.http_url.split("//")[-1].split(":")
    s = socket.create_connection((host, int(port)), timeout=120)
    s.sendall(f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    buf = b""
    while b"data:" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit(f"{model}: the HTTP stream ended before its first event: {buf[:300]!r}")
        buf += chunk
    s.close()


def leave(srv: TritonServer, model: str, max_tokens: int, way: str, stop_key: bool) -> None:
    if way == "http":
        leave_http(srv, model, max_tokens, stop_key)
    elif way == "kill":
        leave_killed(srv, model, max_tokens, stop_key)
    else:
        leave_grpc(srv, model, max_tokens, stop_key)


def until_empty(srv: TritonServer, t0: float, wait_s: float) -> float | None:
    while time.monotonic() - t0 < wait_s:
        if metric(srv.metrics_url, "eagle_llm_requests_in_flight") == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def run(srv: TritonServer, model: str, way: str, n: int, max_tokens: int, wait_s: float, stop_key: bool
        ) -> dict[str, Any]:
    cancelled0 = metric(srv.metrics_url, "eagle_llm_requests_cancelled_total")
    times = []
    for _ in range(n):
        leave(srv, model, max_tokens, way, stop_key)
        times.append(until_empty(srv, time.monotonic(), wait_s))
    threads = [threading.Thread(target=leave, args=(srv, model, max_tokens, way, stop_key)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t0 = time.monotonic()
    held = metric(srv.metrics_url, "eagle_llm_requests_in_flight")
    together = until_empty(srv, t0, wait_s)
    freed = [t for t in times if t is not None]
    return {"model": model, "way": way, "abandons": n, "freed": len(freed),
            "median_s": statistics.median(freed) if freed else None, "max_s": max(freed) if freed else None,
            "held_right_after_together": held, "together_empty_s": together,
            "cancelled": metric(srv.metrics_url, "eagle_llm_requests_cancelled_total") - cancelled0}


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f} s"


def line(r: dict[str, Any]) -> str:
    f = _s
    return (f"{r['model']} {r['way']}: {r['freed']}/{r['abandons']} freed one by one (median {f(r['median_s'])}, max "
            f"{f(r['max_s'])}); {r['abandons']} at once: {r['held_right_after_together']:.0f} held right after, "
            f"none after {f(r['together_empty_s'])}; counted cancelled {r['cancelled']:.0f} of {2 * r['abandons']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repo", type=Path, required=True, help="the rendered Triton repository to serve")
    ap.add_argument("--abandons", type=int, default=5, help="clients per model and way (one by one, then at once)")
    ap.add_argument("--max-tokens", type=int, default=900, help="max_tokens of each abandoned request")
    ap.add_argument("--models", default="ensemble,tensorrt_llm_bls", help="comma-separated entry models")
    ap.add_argument("--ways", default="cancel,kill,http", help="comma-separated: cancel, kill, http")
    ap.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the LLM model to be empty")
    ap.add_argument("--stop-key", action="store_true", help="send a stop_key with each request (as our clients do)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    ways = args.ways.split(",")
    if bad := [w for w in ways if w not in ("cancel", "kill", "http")]:
        print(f"error: --ways {bad}: choose among cancel, kill, http", file=sys.stderr)
        return 2
    if not args.repo.is_dir():
        print(f"error: --repo {args.repo} is not a directory", file=sys.stderr)
        return 2
    srv = TritonServer(args.repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()
                       ).start(timeout_s=300)
    results = []
    try:
        for model in args.models.split(","):
            for way in ways:
                results.append(run(srv, model, way, args.abandons, args.max_tokens, args.wait_s, args.stop_key))
                print(line(results[-1]), flush=True)
    finally:
        srv.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
