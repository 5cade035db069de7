"""What the postprocessing model can take: requests per second of one instance, with and without a dynamic batcher.

    python bench/bench_postprocessing.py --repo build/demo/triton_repo [--concurrency 16] [--seconds 20] [--rounds 2]

Every streamed chunk of an ensemble request is one postprocessing request. The rendered postprocessing model has no
dynamic batcher, so that the steps of cancelled ensemble streams are answered rather than refused in its queue
(on Triton 2.51 a refused step leaves the ensemble request in flight: docs/triton.md, "Cancellation"); upstream's
template has one. This measures what that costs: --concurrency gRPC clients send one-token
postprocessing requests for --seconds on a copy of the repository as rendered, then on a copy with `dynamic_batching
{}` added, alternating --rounds times; it prints requests/s, requests per execution, and the ratio. Compare
requests/s with (concurrent streams x decoding steps per second) to size `triton.postprocessing_instances`.

Inputs:  --repo, a rendered Triton repository of a finished build (served here by a real tritonserver)
Outputs: one line per run and the ratio, on stdout
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _copy(repo: Path, out: Path, batching: bool) -> Path:
    shutil.copytree(repo, out)
    if batching:
        f = out / "postprocessing" / "config.pbtxt"
        f.write_text(f.read_text() + "\ndynamic_batching {\n}\n")
    return out


def _load(url: str, concurrency: int, seconds: float) -> float:
    """Requests per second of `concurrency` closed-loop clients."""
    import tritonclient.grpc as grpcclient

    done, stop = [0] * concurrency, time.time() + seconds

    def client(i: int) -> None:
        c = grpcclient.InferenceServerClient(url)
        tokens = grpcclient.InferInput("TOKENS_BATCH", [1, 1, 1], "INT32")
        tokens.set_data_from_numpy(np.array([[[1234]]], np.int32))
        length = grpcclient.InferInput("SEQUENCE_LENGTH", [1, 1], "INT32")
        length.set_data_from_numpy(np.array([[1]], np.int32))
        while time.time() < stop:
            c.infer("postprocessing", [tokens, length])
            done[i] += 1
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.time() - t0)


def run(repo: Path, batching: bool, args: argparse.Namespace) -> float:
    from testkit.triton_servers import metric, server_on

    with tempfile.TemporaryDirectory() as tmp:
        srv = server_on(_copy(repo, Path(tmp) / "repo", batching), Path(tmp) / "server.log").start(timeout_s=300)
        try:
            rate = _load(srv.grpc_url, args.concurrency, args.seconds)
            reqs = metric(srv, "nv_inference_request_success", model="postprocessing")
            execs = metric(srv, "nv_inference_exec_count", model="postprocessing")
        finally:
            srv.stop(timeout_s=20)
    label = "with a dynamic batcher" if batching else "as rendered (no dynamic batcher)"
    print(f"postprocessing {label}: {rate:.0f} requests/s, {reqs / execs:.2f} requests per execution", flush=True)
    return rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, type=Path, help="rendered Triton repository (<build>/triton_repo)")
    ap.add_argument("--concurrency", type=int, default=16, help="closed-loop clients (default 16)")
    ap.add_argument("--seconds", type=float, default=20, help="seconds per run (default 20)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of both variants (default 2)")
    args = ap.parse_args(argv)
    if not (args.repo / "postprocessing" / "config.pbtxt").is_file():
        ap.error(f"--repo {args.repo}: no postprocessing/config.pbtxt; render the repository first (build.py)")
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for batching in (False, True):
            rates[batching].append(run(args.repo, batching, args))
    plain, batched = (sum(rates[b]) / len(rates[b]) for b in (False, True))
    print(f"as rendered / with a dynamic batcher: {plain / batched:.2f}x ({plain:.0f} vs {batched:.0f} requests/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
