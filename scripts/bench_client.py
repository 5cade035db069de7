"""Client overhead: the load tester's maximum requests/s vs a bare tritonclient loop, in the same run, against the
trivial echo model (tests/fixtures/echo_repo), so the server does almost nothing and client cost dominates.

    python scripts/bench_client.py                       # starts its own echo server on free loopback ports
    python scripts/bench_client.py --concurrency 1,8,32 --requests 200 --rounds 5

Both sides use tritonclient.grpc.aio with one gRPC stream per request and the same concurrency, prompt and
max_tokens, streamed. The bare loop prebuilds its inputs once and only drains responses; the load tester
(clients.load.LevelRunner) builds and validates each request, times every response, counts tokens and records
speculative stats. Rounds alternate bare/tester so drift on a shared machine hits both; per concurrency it prints
the ratio of the medians, the median of the per-round (adjacent, paired) ratios, and the client process's CPU time
per request of each side, which a busy machine disturbs far less than requests/s (target: tester >= 0.8x bare).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.grpc.aio as aiogrpc  # noqa: E402

from clients import schema as sch  # noqa: E402
from clients.client import AsyncLLMClient  # noqa: E402
from clients.load import LevelRunner, LevelSpec  # noqa: E402
from clients.tokens import WhitespaceCounter  # noqa: E402
from tests.fixtures.echo_repo import render_echo_repo  # noqa: E402
from triton_repo.launch import TritonServer, free_port  # noqa: E402

PROMPT = "the quick brown fox jumps over the lazy dog"


async def bare_loop(url: str, concurrency: int, requests: int, max_tokens: int) -> tuple[float, float]:
    """(requests/s, client CPU s per request) of the plainest tritonclient aio loop: fixed inputs, drain each
    request's stream."""
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
        async def it():  # type: ignore[no-untyped-def]
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
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await client.close()
    if errors[0]:
        raise RuntimeError(f"bare loop: {errors[0]} errors")
    return requests / dt, cpu / requests


async def tester_loop(
    url: str, schema: sch.Schema, concurrency: int, requests: int, max_tokens: int
) -> tuple[float, float]:
    """(requests/s the load tester measures for the same load, client CPU s per request)."""
    client = AsyncLLMClient(url, schema)
    spec = LevelSpec(mode="concurrency", level=concurrency, max_tokens=max_tokens, stream=True, requests=requests)
    cpu0 = time.process_time()
    result = await LevelRunner(client, [PROMPT], WhitespaceCounter(), spec, asyncio.Event()).run()
    cpu = time.process_time() - cpu0
    await client.close()
    bad = [r for r in result.records if not r.ok]
    if bad or sum(r.output_tokens for r in result.records) != requests * max_tokens:
        raise RuntimeError(f"load tester: {len(bad)} failed requests ({bad[:1]})")
    return len(result.records) / result.duration_s, cpu / requests


async def bench(
    url: str, levels: list[int], requests: int, max_tokens: int, rounds: int
) -> list[tuple[int, float, float]]:
    schema = sch.fetch_schema(url, "ensemble")
    await bare_loop(url, 4, 50, max_tokens)  # warm the server and the channel
    rows = []
    for c in levels:
        bare, tester = [], []
        for _ in range(rounds):
            bare.append(await bare_loop(url, c, requests, max_tokens))
            tester.append(await tester_loop(url, schema, c, requests, max_tokens))
        b, t = statistics.median(x[0] for x in bare), statistics.median(x[0] for x in tester)
        paired = statistics.median(tx[0] / bx[0] for bx, tx in zip(bare, tester, strict=True))
        bcpu, tcpu = statistics.median(x[1] for x in bare), statistics.median(x[1] for x in tester)
        rows.append((c, b, t))
        print(f"concurrency {c:3d}: bare {b:7.1f} req/s, load tester {t:7.1f} req/s, ratio {t / b:.2f} "
              f"(median of paired rounds {paired:.2f}) | client CPU "
              f"per request: bare {bcpu * 1e3:.2f} ms, tester {tcpu * 1e3:.2f} ms | rounds req/s bare "
              f"{[round(x[0]) for x in bare]}, tester {[round(x[0]) for x in tester]}", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="an echo server already running (default: start one)")
    ap.add_argument("--concurrency", default="1,8,32", help="levels (default 1,8,32)")
    ap.add_argument("--requests", type=int, default=200, help="requests per measurement (default 200)")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens per request (default 8: 3 streamed responses)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per level (default 5)")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    run = lambda url: asyncio.run(bench(url, levels, args.requests, args.max_tokens, args.rounds))  # noqa: E731
    if args.url:
        rows = run(args.url)
    else:
        with tempfile.TemporaryDirectory() as d:
            repo = render_echo_repo(Path(d) / "repo", tokens_per_step=3)
            srv = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                               log_path=Path(d) / "server.log")  # fmt: skip
            srv.start()
            try:
                rows = run(srv.grpc_url)
            finally:
                srv.stop(timeout_s=10)
    worst = min(t / b for _, b, t in rows)
    print(f"max requests/s: bare {max(b for _, b, _ in rows):.1f}, load tester {max(t for _, _, t in rows):.1f}; "
          f"worst ratio {worst:.2f} (target >= 0.80)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
