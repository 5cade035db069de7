r"""A build's Dynamo deployment on CPU (`eagle-dynamo serve`, reference-engine workers of one thread each): requests/s
of one vs two aggregated workers and of a disaggregated prefill/decode pair at a fixed concurrency, and the
time to first token through Dynamo's frontend against the engine called directly, at concurrency 1.

    python bench/bench_dynamo.py --build build/smollm2-eagle3-current --concurrency 4 --requests 12 \
        --max-tokens 32 --rounds 2 [--json OUT.json]

The deployments compared (--deployments) run at once, each in its own loopback-only network namespace (root:
testkit/dynamo.py), and are measured one after the other in a rotated order each round; each request is a
closed-loop completion of one of the prompts below, greedy, and every answer must equal the first deployment's.
TTFT: the first streamed chunk through the frontend (the first deployment) vs the first accepted token of the
engine's own session in this process (one thread).

Inputs:  a finished current-line build (trtllm_version '1.4') with dynamo/; the Dynamo venv (scripts/setup_dynamo.sh)
Outputs: the table on stdout (with the load average); --json every figure
Guide:   docs/benchmarks.md ("NVIDIA Dynamo on CPU")
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scripts.spec_sweep import positive_int
from testkit import dynamo as D

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):",
           "Explain photosynthesis in one sentence.", "The three primary colors are", "Once upon a time"]
DEPLOYMENTS = {"1 worker": ("--workers", "1"), "2 workers": ("--workers", "2"),
               "disaggregated 1+1": ("--disaggregated",)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[3:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, required=True, help="a current-line build directory")
    p.add_argument("--concurrency", type=positive_int("--concurrency"), default=4)
    p.add_argument("--requests", type=positive_int("--requests"), default=12, help="requests per deployment per round")
    p.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=32)
    p.add_argument("--rounds", type=positive_int("--rounds"), default=2)
    p.add_argument("--ttft-requests", type=positive_int("--ttft-requests"), default=6,
                   help="requests for the TTFT comparison")
    p.add_argument("--deployments", nargs="+", choices=list(DEPLOYMENTS), default=["1 worker", "2 workers"],
                   help="which deployments to compare (each running at once; the first is the baseline)")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def body(prompt: str, n: int) -> dict[str, Any]:
    return {"model": "", "prompt": prompt, "max_tokens": n, "temperature": 0}


def closed_loop(dep: D.Deployment, model: str, n_requests: int, n: int) -> tuple[float, list[str]]:
    """(requests/s, the answers in prompt order); the deployment's thread pool holds `--concurrency` in flight."""
    url = f"{dep.base}/completions"
    t0 = time.perf_counter()
    futures = [dep.submit(D.post, url, dict(body(PROMPTS[i % len(PROMPTS)], n), model=model))
               for i in range(n_requests)]
    answers = [f.result(timeout=600)["choices"][0]["text"] for f in futures]
    return n_requests / (time.perf_counter() - t0), answers


def frontend_ttft(dep: D.Deployment, model: str, n: int) -> float:
    def one(prompt: str) -> float:
        t0 = time.perf_counter()
        for event in D.stream(f"{dep.base}/completions", dict(body(prompt, n), model=model)):
            if event.get("choices") and event["choices"][0].get("text"):
                return time.perf_counter() - t0
        raise RuntimeError("no text streamed")

    return float(dep.run(one, PROMPTS[0]))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if (why := D.unavailable()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    model = json.loads((a.build / "dynamo" / "deployment.json").read_text())["served_model_name"]
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-dynamo-{os.getpid()}"
    deps = {name: D.Deployment(a.build, logs / str(i), *args, port=8100 + i, threads=a.concurrency)
            for i, (name, args) in enumerate((n, DEPLOYMENTS[n]) for n in a.deployments)}
    rps: dict[str, list[float]] = {k: [] for k in deps}
    ttft: dict[str, list[float]] = {"frontend (1 worker)": [], "engine direct": []}  # the first deployment's
    same = True
    try:
        for dep in deps.values():
            dep.wait_ready(600)
        direct = D.engine_ttft(a.build)
        reference: list[str] | None = None
        for r in range(a.rounds):
            names = list(deps)[r % len(deps):] + list(deps)[:r % len(deps)]
            for name in names:
                rate, answers = closed_loop(deps[name], model, a.requests, a.max_tokens)
                rps[name].append(rate)
                reference = reference or answers
                same = same and answers == reference
            for _ in range(a.ttft_requests):  # alternated, one at a time
                ttft["frontend (1 worker)"].append(frontend_ttft(deps[a.deployments[0]], model, a.max_tokens))
                ttft["engine direct"].append(direct(PROMPTS[0], a.max_tokens))
    finally:
        for dep in deps.values():
            dep.stop()
    load = os.getloadavg()
    med = {k: statistics.median(v) for k, v in rps.items()}
    t = {k: statistics.median(v) for k, v in ttft.items()}
    print(f"concurrency {a.concurrency}, {a.requests} requests x {a.rounds} rounds, max_tokens {a.max_tokens}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for k, v in med.items():
        print(f"  {k:>20}: {v:.3f} req/s ({v / med[a.deployments[0]]:.2f}x {a.deployments[0]})")
    print(f"  TTFT p50: frontend {t['frontend (1 worker)'] * 1e3:.1f} ms, engine direct "
          f"{t['engine direct'] * 1e3:.1f} ms ({t['frontend (1 worker)'] / t['engine direct'] - 1:+.1%})")
    print(f"  answers identical across deployments: {same}")
    if a.json is not None:
        a.json.write_text(json.dumps({"rps": rps, "ttft_s": ttft, "load": load, "same": same, "args": vars(a)},
                                     indent=2, default=str) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
