"""Cost of the perf bridge: requests/s of the same tiny build's ensemble with and without the C++ backend's bridge.

    python scripts/bench_perf_bridge.py [--work DIR] [--seconds 15] [--concurrency 4] [--rounds 2] [--max-tokens 16]

Builds a tiny target + EAGLE-1 head (tests/conftest.py's mimic pair: the head accepts 1-2 tokens per step) on the
reference engine (trtllm_version 1.1, topk-2-3 tree) and renders its repository twice from the same build:
"without" as the build renders it (the reference model counts its own metrics, perf outputs only when a client asks,
in the final response), "with" wired like the engine flow (builders/triton/render.py perf_bridge=True: preprocessing
asks for the perf outputs on every request, the reference model writes running totals and arrival_time_ns on every
response as the C++ backend does, and postprocessing counts them, triton_repo/models/perf_bridge.py). Each round
starts a fresh tritonserver per variant (ABBA order), sends 4 warm-up requests, then runs `concurrency` closed-loop
gRPC streaming clients on the ensemble (greedy, max_tokens, without return_perf_metrics) for `seconds` while a
scraper reads /metrics every second. Reported: completed requests/s per variant and round, and the ratio.
The reference engine's compute is the same in both; what differs is the bridge's work per response.

Inputs:  none (tiny random models)
Outputs: the figures on stdout
Guide:   docs/benchmarks.md ("Cost of the perf bridge")
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ["the quick brown fox", "hello world how are you", "one two three four", "a story about a cat"]


def build(work: Path) -> tuple[Path, Path]:
    """(repository as built, the bridged repository)."""
    from builders.build import main as build_main
    from builders.config import load_config
    from builders.triton.render import render
    from tests.conftest import _mimic_pair
    from tests.tiny_models import VOCAB

    target, head = _mimic_pair(work / "mimic", vocab=VOCAB, seed=5, block_scale=2.0)
    cfg = work / "bench.yaml"
    cfg.write_text(f"name: bench-bridge\ntrtllm_version: '1.1'\noutput_dir: {work / 'build'}\n"
                   f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle, model: {head}}}\n"
                   "tree: {choices: topk-2-3}\n"
                   "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, "
                   "max_seq_len: 128}\n")
    if build_main([str(cfg)]) != 0:
        raise SystemExit("build failed")
    bridged = work / "repo_bridged"
    render(load_config(cfg), work / "build", bridged, perf_bridge=True)
    return work / "build" / "triton_repo", bridged


def run_level(srv: Any, seconds: float, concurrency: int, max_tokens: int) -> float:
    import queue

    from tritonclient import grpc
    from tritonclient.utils import InferenceServerException

    from tests.triton_requests import inputs, stream_call

    stop, done, errors = threading.Event(), [0] * concurrency, []

    def one(c: Any, prompt: str) -> None:
        stream_call(c, "ensemble", inputs(prompt, max_tokens, stream=(True, "BOOL")))

    def client(k: int) -> None:
        c = grpc.InferenceServerClient(srv.grpc_url)
        i = k
        try:
            while not stop.is_set():
                one(c, PROMPTS[i % len(PROMPTS)])
                done[k] += 1
                i += 1
        except (InferenceServerException, OSError, queue.Empty) as e:  # reported below
            errors.append(e)
        finally:
            c.close()

    def scraper() -> None:
        while not stop.wait(1.0):
            urllib.request.urlopen(srv.metrics_url, timeout=10).read()

    warm = grpc.InferenceServerClient(srv.grpc_url)
    for p in PROMPTS:
        one(warm, p)
    warm.close()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    threads.append(threading.Thread(target=scraper))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    n0 = sum(done)
    elapsed = time.monotonic() - t0
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"request failed: {errors[0]}")
    return n0 / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  tiny random models (built into --work)\n"
               "Outputs: requests/s with and without the perf bridge, printed\nGuide:   docs/benchmarks.md")
    ap.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    from tests.triton_servers import with_without_rounds

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_bridge_"))
    plain, bridged = build(work)
    w, wo = with_without_rounds(plain, bridged, work, args.rounds,
                                lambda srv: run_level(srv, args.seconds, args.concurrency, args.max_tokens))
    print(f"mean: with {w:.2f} / without {wo:.2f} requests/s = {w / wo:.3f}x "
          f"(concurrency {args.concurrency}, {args.max_tokens} tokens, {args.seconds:.0f} s per run, streaming)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
