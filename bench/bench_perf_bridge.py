"""Cost of the perf bridge: requests/s of the same tiny build's ensemble with and without the C++ backend's bridge.

    python bench/bench_perf_bridge.py [--work DIR] [--seconds 15] [--concurrency 4] [--rounds 2] [--max-tokens 16]

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent

PROMPTS = ["the quick brown fox", "hello world how are you", "one two three four", "a story about a cat"]


def build(work: Path) -> tuple[Path, Path]:
    """(repository as built, the bridged repository)."""
    from builders.build import main as build_main
    from builders.config import load_config
    from builders.triton.render import render
    from testkit.tiny_models import VOCAB, mimic_pair

    target, head = mimic_pair(work / "mimic", vocab=VOCAB, seed=5, block_scale=2.0)
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
    """Closed-loop streaming gRPC clients through the ensemble (one client connection each): requests/s."""
    from tritonclient import grpc

    from testkit.triton_requests import inputs, stream_call
    from testkit.triton_servers import closed_loop_rps

    def open_client() -> tuple[Callable[[str], None], Callable[[], None]]:
        c = grpc.InferenceServerClient(srv.grpc_url)

        def send(prompt: str) -> None:
            stream_call(c, "ensemble", inputs(prompt, max_tokens, stream=(True, "BOOL")))

        return send, c.close

    return closed_loop_rps(srv, seconds, concurrency, PROMPTS, open_client)


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
    from testkit.triton_servers import with_without_rounds

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_bridge_"))
    plain, bridged = build(work)
    w, wo = with_without_rounds(plain, bridged, work, args.rounds,
                                lambda srv: run_level(srv, args.seconds, args.concurrency, args.max_tokens))
    print(f"mean: with {w:.2f} / without {wo:.2f} requests/s = {w / wo:.3f}x "
          f"(concurrency {args.concurrency}, {args.max_tokens} tokens, {args.seconds:.0f} s per run, streaming)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
