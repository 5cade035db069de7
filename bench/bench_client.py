"""Client overhead: the load tester's maximum requests/s vs a bare tritonclient loop, in the same run,
against the trivial echo model (testkit/echo_repo), so the server does almost nothing and client cost
dominates. Target: load tester >= 0.8x the bare loop.

    .venv/bin/python bench/bench_client.py                   # starts its own echo server on free loopback ports
    .venv/bin/python bench/bench_client.py --concurrency 1,8,32 --requests 400 --rounds 9 --max-tokens 8

Both sides use tritonclient.grpc.aio with one gRPC stream per request, the same concurrency, prompt and
max_tokens, streamed (max_tokens 8 at 3 tokens per step: 3 responses per request).
  * bare loop: builds its 4 inputs once, then each worker sends a request and drains its responses; nothing else.
  * load tester: clients.loadtest.run_level, the CLI's own path (LevelRunner + progress bar, written to /dev/null
    here): it validates and builds each prompt's request once per level, sets a deadline on every request, times
    every response, counts output tokens, reads the speculative stats and keeps a RequestRecord per request. Its
    request and token counts are checked after every round.
Both are timed the same way: wall clock and this process's CPU time (all threads, gRPC's included) around the
whole level. A round runs both sides back to back, in ABBA order (bare first in even rounds, tester first in odd
ones), so drift on a shared machine hits both equally. Per concurrency it prints:
  * ratio: median tester req/s / median bare req/s (the headline figure), and the median of the per-round
    ratios with their range (how noisy the run was);
  * client CPU per request of each side: what the client itself costs, which a busy machine disturbs far less
    than requests/s; "tester/bare" > 1 means the tester spends more CPU per request;
  * the load average before the level: on a machine with other work, wall-clock rates are shared with it.
The summary compares the maximum requests/s of each side over the levels (the issue's wording).

Inputs:  none: starts its own echo server (testkit/echo_repo)
Outputs: the figures on stdout
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc

from clients import schema as sch
from clients.client import AsyncLLMClient
from clients.load import LevelSpec
from clients.loadtest import run_level
from clients.tokens import WhitespaceCounter
from testkit.echo_repo import render_echo_repo
from triton_repo.launch import TritonServer, free_port

PROMPT = "the quick brown fox jumps over the lazy dog"
TARGET = 0.8
ECHO_TOKENS_PER_STEP = 3


@dataclass(frozen=True)
class Measured:
    """One side of one round: requests completed, wall seconds, client-process CPU seconds."""

    requests: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_s / self.requests


async def bare_loop(url: str, concurrency: int, requests: int, max_tokens: int) -> Measured:
    """The plainest tritonclient aio loop: fixed inputs, drain each request's stream."""
    client = aiogrpc.InferenceServerClient(url)
    inputs = []
    for name, arr, dt in (
        ("text_input", np.array([[PROMPT.encode()]], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        ("stream", np.array([[True]]), "BOOL"),
        ("return_perf_metrics", np.array([[True]]), "BOOL"),
    ):
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    remaining = [requests]
    errors = [0]

    async def one() -> None:
        async def it() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "ensemble", "inputs": inputs}

        async for _result, error in client.stream_infer(it()):
            if error is not None:
                errors[0] += 1

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await one()

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await client.close()
    if errors[0]:
        raise RuntimeError(f"bare loop: {errors[0]} errors")
    return Measured(requests, wall, cpu)


async def tester_loop(url: str, schema: sch.Schema, concurrency: int, requests: int, max_tokens: int) -> Measured:
    """The load tester's level (clients.loadtest.run_level) for the same load, timed like the bare loop."""
    client = AsyncLLMClient(url, schema)
    spec = LevelSpec(mode="concurrency", level=concurrency, max_tokens=max_tokens, stream=True, requests=requests)
    with open(os.devnull, "w") as devnull:
        t0, cpu0 = time.perf_counter(), time.process_time()
        result = await run_level(client, [PROMPT], WhitespaceCounter(), spec, asyncio.Event(), progress=True,
                                 progress_file=devnull)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await client.close()
    bad = [r for r in result.records if not r.ok]
    tokens = sum(r.output_tokens for r in result.records)
    if bad or len(result.records) != requests or tokens != requests * max_tokens:
        raise RuntimeError(f"load tester: {len(result.records)} records, {len(bad)} failed ({bad[:1]}), {tokens} "
                           f"tokens (expected {requests} x {max_tokens})")
    return Measured(requests, wall, cpu)


@dataclass(frozen=True)
class LevelFigures:
    concurrency: int
    bare: list[Measured]
    tester: list[Measured]
    loadavg: tuple[float, float, float]

    @property
    def bare_rate(self) -> float:
        return statistics.median(m.rate for m in self.bare)

    @property
    def tester_rate(self) -> float:
        return statistics.median(m.rate for m in self.tester)

    @property
    def ratio(self) -> float:
        return self.tester_rate / self.bare_rate

    @property
    def paired(self) -> list[float]:
        return [t.rate / b.rate for b, t in zip(self.bare, self.tester, strict=True)]

    @property
    def bare_cpu(self) -> float:
        return statistics.median(m.cpu_per_request for m in self.bare)

    @property
    def tester_cpu(self) -> float:
        return statistics.median(m.cpu_per_request for m in self.tester)

    def line(self) -> str:
        p = self.paired
        return (
            f"concurrency {self.concurrency:3d}: bare {self.bare_rate:7.1f} req/s, load tester {self.tester_rate:7.1f} "
            f"req/s -> ratio {self.ratio:.2f} (per-round ratios: median {statistics.median(p):.2f}, range "
            f"{min(p):.2f}-{max(p):.2f})\n"
            f"                 client CPU per request: bare {self.bare_cpu * 1e3:.3f} ms, load tester "
            f"{self.tester_cpu * 1e3:.3f} ms (tester/bare {self.tester_cpu / self.bare_cpu:.2f}); load average "
            f"before: {self.loadavg[0]:.2f}\n"
            f"                 req/s per round: bare {[round(m.rate) for m in self.bare]}, "
            f"tester {[round(m.rate) for m in self.tester]}"
        )


async def bench(url: str, levels: list[int], requests: int, max_tokens: int, rounds: int) -> list[LevelFigures]:
    schema = sch.fetch_schema(url, "ensemble")
    await bare_loop(url, 4, 50, max_tokens)  # warm the server and both code paths before anything is measured
    await tester_loop(url, schema, 4, 50, max_tokens)
    figures = []
    for c in levels:
        loadavg = os.getloadavg()
        bare: list[Measured] = []
        tester: list[Measured] = []
        for r in range(rounds):
            if r % 2 == 0:  # ABBA: neither side always goes first
                bare.append(await bare_loop(url, c, requests, max_tokens))
                tester.append(await tester_loop(url, schema, c, requests, max_tokens))
            else:
                tester.append(await tester_loop(url, schema, c, requests, max_tokens))
                bare.append(await bare_loop(url, c, requests, max_tokens))
        figures.append(LevelFigures(c, bare, tester, loadavg))
        print(figures[-1].line(), flush=True)
    return figures


def summary(figures: list[LevelFigures]) -> str:
    best_bare = max(figures, key=lambda f: f.bare_rate)
    best_tester = max(figures, key=lambda f: f.tester_rate)
    ratio = best_tester.tester_rate / best_bare.bare_rate
    worst = min(figures, key=lambda f: f.ratio)
    verdict = "meets" if ratio >= TARGET else "BELOW"
    per_level = ", ".join(f"c={f.concurrency} {f.ratio:.2f}" for f in figures)
    paired = ", ".join(f"c={f.concurrency} {statistics.median(f.paired):.2f}" for f in figures)
    cpu = ", ".join(f"c={f.concurrency} {f.tester_cpu / f.bare_cpu:.2f}" for f in figures)
    return (
        f"max requests/s: bare {best_bare.bare_rate:.1f} (concurrency {best_bare.concurrency}), load tester "
        f"{best_tester.tester_rate:.1f} (concurrency {best_tester.concurrency}) -> ratio {ratio:.2f}, {verdict} the "
        f"target >= {TARGET:.2f}; lowest per-level ratio {worst.ratio:.2f} (concurrency {worst.concurrency})\n"
        f"ratio of medians per level: {per_level}; median per-round ratio: {paired}; client CPU per request "
        f"tester/bare: {cpu}"
    )


def command_line(args: argparse.Namespace) -> str:
    """The exact command, every option spelled out, to rerun this measurement."""
    script = os.path.relpath(Path(__file__).resolve(), Path.cwd())
    exe = Path(sys.executable)
    python = os.path.relpath(exe, Path.cwd()) if exe.is_relative_to(Path.cwd()) else str(exe)
    argv = [python, script, "--concurrency", args.concurrency, "--requests", str(args.requests),
            "--max-tokens", str(args.max_tokens), "--rounds", str(args.rounds)]
    if args.url:
        argv += ["--url", args.url]
    return " ".join(shlex.quote(a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="an echo server already running (default: start one)")
    ap.add_argument("--concurrency", default="1,8,32", help="levels (default 1,8,32)")
    ap.add_argument("--requests", type=int, default=400, help="requests per side per round (default 400)")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per request (default 8: 3 streamed responses)")
    ap.add_argument("--rounds", type=int, default=9, help="rounds per level, each runs both sides (default 9)")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.requests < 1 or args.rounds < 1 or args.max_tokens < 1 or any(c < 1 for c in levels):
        ap.error("--requests, --rounds, --max-tokens and every concurrency must be >= 1")
    print(f"client overhead: load tester vs bare tritonclient loop, echo model ({ECHO_TOKENS_PER_STEP} tokens per "
          f"step), streamed, {args.max_tokens} tokens per request, {args.requests} requests per side per round, "
          f"{args.rounds} rounds per level in ABBA order", flush=True)
    print(f"command: {command_line(args)}", flush=True)
    la = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (1/5/15 min) at start",
          flush=True)

    def run(url: str) -> list[LevelFigures]:
        return asyncio.run(bench(url, levels, args.requests, args.max_tokens, args.rounds))

    if args.url:
        figures = run(args.url)
    else:
        with tempfile.TemporaryDirectory() as d:
            repo = render_echo_repo(Path(d) / "repo", tokens_per_step=ECHO_TOKENS_PER_STEP)
            srv = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                               log_path=Path(d) / "server.log")
            srv.start()
            try:
                figures = run(srv.grpc_url)
            finally:
                srv.stop(timeout_s=10)
    la = os.getloadavg()
    print(summary(figures))
    print(f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (1/5/15 min) at the end; a load average near or above "
          f"the CPU count means other work shared the CPUs: rerun on a quiet machine for publishable figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
