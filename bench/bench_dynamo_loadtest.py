r"""The load tester (`eagle-loadtest --openai-url`) against a build's Dynamo deployments on CPU (`eagle-dynamo serve`,
reference-engine workers of one thread each): one vs two aggregated workers and a disaggregated prefill/decode pair,
per concurrency level, and the TTFT through Dynamo's frontend against the engine called directly (concurrency 1).

    python bench/bench_dynamo_loadtest.py --build BUILD --prompts PROMPTS.jsonl --out OUT --concurrency 1,4 \
        --requests 12 --max-tokens 32 --rounds 2

The deployments run at once, each in its own loopback-only network namespace (root: testkit/dynamo.py); every round
runs the load tester against each in a rotated order (the medians over rounds are reported). Each run's report.json,
plots and requests.jsonl go to OUT/<deployment>/c<level>/r<round>/; OUT/summary.json holds every figure.

Inputs:  a finished current-line build with dynamo/; the Dynamo venv (scripts/setup_dynamo.sh); a prompts JSONL
Outputs: the table on stdout (with the load average); OUT/summary.json
Guide:   docs/benchmarks.md ("NVIDIA Dynamo on CPU")
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.spec_sweep import positive_int
from testkit import dynamo as D

DEPLOYMENTS = {"1 worker": ("--workers", "1"), "2 workers": ("--workers", "2"),
               "disaggregated 1+1": ("--disaggregated",)}


def _levels(text: str) -> str:
    """Comma-separated positive integers, as the load tester's --concurrency takes them."""
    return ",".join(str(positive_int("--concurrency")(v)) for v in text.split(","))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, required=True, help="a current-line build directory with dynamo/")
    p.add_argument("--prompts", type=Path, required=True, help="JSONL, one {\"prompt\": ...} per line")
    p.add_argument("--out", type=Path, required=True, help="where the load tester's reports and summary.json go")
    p.add_argument("--concurrency", type=_levels, default="1,4", help="closed-loop levels, e.g. 1,4")
    p.add_argument("--requests", type=positive_int("--requests"), default=12, help="requests per run")
    p.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=32)
    p.add_argument("--rounds", type=positive_int("--rounds"), default=2)
    p.add_argument("--ttft-requests", type=positive_int("--ttft-requests"), default=6,
                   help="requests per round for the TTFT comparison with the engine called directly")
    return p.parse_args(argv)


def loadtest(dep: D.Deployment, a: argparse.Namespace, level: str, out: Path) -> dict[str, Any]:
    """One eagle-loadtest run inside the deployment's namespace; its report's only level."""
    argv = dep.inside(sys.executable, "-m", "clients.loadtest",
            "--openai-url", dep.base, "--prompts", str(a.prompts), "--out", str(out), "--concurrency", level,
            "--requests", str(a.requests), "--max-tokens", str(a.max_tokens), "--temperature", "0", "--stream",
            "--no-progress")
    subprocess.run(argv, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    return dict(json.loads((out / "report.json").read_text())["levels"][0])


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if (why := D.unavailable()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    levels = a.concurrency.split(",")
    deps = {name: D.Deployment(a.build, a.out / "logs" / str(i), *args, port=8100 + i)
            for i, (name, args) in enumerate(DEPLOYMENTS.items())}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {lv: [] for lv in levels} for n in deps}
    ttft: dict[str, list[float]] = {"frontend (1 worker)": [], "engine direct": []}
    prompt = json.loads(a.prompts.read_text().splitlines()[0])["prompt"]
    model = json.loads((a.build / "dynamo" / "deployment.json").read_text())["served_model_name"]
    try:
        for dep in deps.values():
            dep.wait_ready(900)
        direct = D.engine_ttft(a.build)
        for r in range(a.rounds):
            names = list(deps)[r % len(deps):] + list(deps)[:r % len(deps)]
            for lv in levels:
                for name in names:
                    out = a.out / name.replace(" ", "_") / f"c{lv}" / f"r{r}"
                    runs[name][lv].append(loadtest(deps[name], a, lv, out))
            for _ in range(a.ttft_requests):  # alternated, one request at a time
                ttft["frontend (1 worker)"].append(frontend_ttft(deps["1 worker"], model, prompt, a.max_tokens))
                ttft["engine direct"].append(direct(prompt, a.max_tokens))
    finally:
        for dep in deps.values():
            dep.stop()
    report(a, runs, ttft)
    return 0


def frontend_ttft(dep: D.Deployment, model: str, prompt: str, n: int) -> float:
    """The first streamed text through the frontend, one request (as the engine-direct figure is measured)."""
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0}

    def one() -> float:
        t0 = time.perf_counter()
        for event in D.stream(f"{dep.base}/completions", body):
            if event.get("choices") and event["choices"][0].get("text"):
                return time.perf_counter() - t0
        raise RuntimeError("no text streamed")

    return float(dep.run(one))


def report(a: argparse.Namespace, runs: dict[str, dict[str, list[dict[str, Any]]]],
           ttft: dict[str, list[float]]) -> None:
    load = os.getloadavg()
    print(f"{a.requests} requests per run x {a.rounds} rounds, max_tokens {a.max_tokens}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, per in runs.items():
        for lv, reps in per.items():
            row = {"req_s": statistics.median(r["request_throughput"] for r in reps),
                   "tok_s": statistics.median(r["output_tokens_per_s"] for r in reps),
                   "ttft_p50_ms": statistics.median(r["ttft_s"]["p50"] for r in reps) * 1e3,
                   "itl_p50_ms": statistics.median(r["itl_s"]["p50"] for r in reps) * 1e3,
                   "ok": sum(r["requests_ok"] for r in reps), "sent": sum(r["requests_sent"] for r in reps)}
            table.setdefault(name, {})[lv] = row
            base = table["1 worker"].get(lv, row)["req_s"]
            print(f"  {name:>18} c={lv}: {row['req_s']:.3f} req/s ({row['req_s'] / base:.2f}x 1 worker), "
                  f"{row['tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, ITL p50 "
                  f"{row['itl_p50_ms']:.0f} ms, {row['ok']}/{row['sent']} ok")
    t = {k: statistics.median(v) for k, v in ttft.items()}
    print(f"  TTFT p50 at concurrency 1: frontend {t['frontend (1 worker)'] * 1e3:.1f} ms, engine direct "
          f"{t['engine direct'] * 1e3:.1f} ms ({t['frontend (1 worker)'] / t['engine direct'] - 1:+.1%})")
    (a.out / "summary.json").write_text(json.dumps({"table": table, "ttft_s": ttft, "load": load,
                                                    "args": vars(a)}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
