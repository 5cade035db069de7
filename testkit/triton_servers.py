"""The bundled CPU tritonserver in the tests: a tiny reference build's repository, starting a server, reading its
Prometheus metrics."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from builders.build import main as build_main
from triton_repo.launch import TritonServer, free_port


# Teardown: SIGINT, then SIGKILL after this long. The bundled 2.51 server sometimes waits its whole 30 s exit timeout
# for the python backend to unload (seen once in ~10 runs, not reproducible in isolation); the echo model's graceful
# unload is not under test, so do not pay that.
STOP_TIMEOUT_S = 8.0


# Tests that assert a clean exit (stop() == 0) need tritonserver to finish unloading within its exit timeout: on the
# shared 2-core machine (load average ~10) unloading the python models took ~10 s, the launcher's default --drain-s.
TEST_DRAIN_S = 30


def server_on(repo: Path, log: Path) -> TritonServer:
    return TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), log_path=log,
                        drain_s=TEST_DRAIN_S)


@contextlib.contextmanager
def serve(repo: Path, log: Path) -> Iterator[TritonServer]:
    srv = server_on(repo, log).start()
    try:
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def metric(server: TritonServer, name: str, **labels: str) -> float:
    """Sum of a metric's samples with these labels on the server's metrics endpoint."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def with_without_rounds(without: Path, with_: Path, work: Path, rounds: int,
                        measure: Callable[[TritonServer], float]) -> tuple[float, float]:
    """Requests/s of two repositories, a fresh server per run, in ABBA order (load drifts and going first hit both);
    prints each run and returns the means (with, without)."""
    import statistics

    results: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(rounds):
        order = (("without", without), ("with", with_))
        for name, path in order if r % 2 == 0 else order[::-1]:
            srv = server_on(path, work / f"triton_{name}_{r}.log").start(timeout_s=240)
            try:
                rps = measure(srv)
            finally:
                srv.stop(timeout_s=STOP_TIMEOUT_S)
            results[name].append(rps)
            print(f"round {r + 1} {name:>7}: {rps:.2f} requests/s", flush=True)
    return statistics.mean(results["with"]), statistics.mean(results["without"])


def closed_loop_rps(srv: TritonServer, seconds: float, concurrency: int, prompts: list[str],
                    open_client: Callable[[], tuple[Callable[[str], None], Callable[[], None]]]) -> float:
    """Completed requests/s of `concurrency` closed-loop clients over `seconds`, while a scraper reads /metrics every
    second as Prometheus would. `open_client()` gives one client's (send one prompt, close); every prompt is sent
    once first (warm-up, not counted). Requests still running at the end are not counted; the first failure ends
    the run with its message."""
    stop, done, errors = threading.Event(), [0] * concurrency, []

    def client(k: int) -> None:
        send, close = open_client()
        try:
            i = k
            while not stop.is_set():
                send(prompts[i % len(prompts)])
                done[k] += 1
                i += 1
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            close()

    def scraper() -> None:
        while not stop.wait(1.0):
            urllib.request.urlopen(srv.metrics_url, timeout=10).read()

    send, close = open_client()
    try:
        for p in prompts:
            send(p)
    finally:
        close()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    threads.append(threading.Thread(target=scraper))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    n, elapsed = sum(done), time.monotonic() - t0
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"request failed: {errors[0]}")
    return n / elapsed


def tiny_reference_repo(root: Path, name: str, target: Path, head: Path, *, max_seq_len: int,
                        max_queue_size: int | None = None, expose_internal: bool = False) -> Path:
    """Build a tiny EAGLE target + head with engine.backend=reference (CLI, all stages); its Triton repository."""
    cfg = root / "tiny.yaml"
    fields = ([f"max_queue_size: {max_queue_size}"] if max_queue_size is not None else []) + (
        ["expose_internal_models: true"] if expose_internal else [])
    triton = f"triton: {{{', '.join(fields)}}}\n" if fields else ""
    cfg.write_text(
        f"name: {name}\ntrtllm_version: '1.1'\noutput_dir: {root / 'build'}\n"
        f"target: {{model: {target}, dtype: float32}}\n"
        f"draft: {{type: eagle, model: {head}}}\n"
        "tree: {choices: topk-2-2}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, "
        f"max_seq_len: {max_seq_len}}}\n"
        + triton
    )
    assert build_main([str(cfg)]) == 0
    return root / "build" / "triton_repo"
