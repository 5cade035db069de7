r"""Load-test a served EAGLE deployment: throughput, latency, tau and acceptance per concurrency or request rate.

    python clients/loadtest.py --url localhost:8001 --prompts prompts.jsonl --out results/ \
        --concurrency 1,4,16 --requests 200 --max-tokens 128 --stream
    python clients/loadtest.py --url localhost:8001 --prompts mt_bench.jsonl --out results/ \
        --request-rate 2,8 --duration 60 --seed 0

Per level it reports request throughput, output tokens/s, TTFT / inter-token / end-to-end latency (mean, p50, p90,
p99), errors by status, and tau / acceptance rate from the server's speculative-decoding statistics. It writes
report.json, report.csv, requests.jsonl (one line per request) and PNG plots into --out, rewritten after every level;
Ctrl-C stops the run, ends the requests in flight on the server (through an ensemble: a stop request to its LLM
model, then the stream drained) and writes what was measured (exit code 130). Refused connections, timeouts and
server restarts are counted per status and the run carries on; a timed-out request is ended on the server the same
way.

Any build of this project is a target (the engine-flow ensemble and the current line's llmapi model): with --repo
BUILD/triton_repo the model name, request schema and tokenizer come from the build's client.json. An OpenAI-compatible
HTTP endpoint (`eagle-dynamo serve`, trtllm-serve) is one too: --openai-url http://host:port/v1 sends streamed
completions (chat completions with --chat) and counts output tokens from the server's usage.

Inputs:  a served deployment (--url host:grpc_port or --openai-url base URL), --prompts (JSONL)
Outputs: --out/report.json, report.csv, requests.jsonl and PNG plots
Guide:   docs/load-test.md
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import signal
import os
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

# Run as a file (`python clients/loadtest.py`), Python would put clients/ first on sys.path, where a
# module can shadow an installed package (builders/triton: `triton`): run as the module, as its command does.
if __name__ == "__main__" and not __package__:
    os.execv(sys.executable, [sys.executable, "-m", "clients.loadtest", *sys.argv[1:]])

from tqdm import tqdm

from clients import schema as sch
from clients.client import DEFAULT_TIMEOUT_S, AsyncLLMClient, sampling_of
from clients.load import LevelResult, LevelRunner, LevelSpec, LoadClient
from clients.openai_http import OpenAIClient, UsageCounter
from clients.plots import COMPARISON_FILE, plot_speculation_comparison, write_plots
from clients.prompts import PromptFileError, chat_template, load_prompts
from clients.stats import CSV_COLUMNS, LevelReport, Summary, acceptance_by_level, aggregate, csv_row
from clients.tokens import TokenCounter, make_counter

EXIT_INTERRUPTED = 130


def _numbers(text: str, kind: type[int] | type[float], flag: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected comma-separated numbers ({e})") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected positive values, e.g. 1,4,16")
    return values


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eagle-loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="Triton gRPC endpoint host:port (e.g. localhost:8001)")
    target.add_argument("--openai-url", help="base URL of an OpenAI-compatible HTTP API (e.g. http://127.0.0.1:8000/v1,"
                        " as `eagle-dynamo serve` prints): streamed /completions, /chat/completions with --chat")
    ap.add_argument("--model", default=None,
                    help="model to load (default: the one the build's client.json names with --repo, else the "
                    "server's `ensemble` or, for a current-line llmapi build, `tensorrt_llm`; with --openai-url the "
                    "one model GET /models lists)")
    ap.add_argument("--repo", type=Path, default=None,
                    help="rendered repository: read the schema from its client.json (default: ask the server)")
    ap.add_argument("--prompts", required=True, type=Path, help="JSONL file: `prompt` or MT-bench `turns` per line")
    ap.add_argument("--out", required=True, type=Path, help="output directory for report.json/csv and plots")
    load = ap.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=lambda t: _numbers(t, int, "--concurrency"),
                      help="closed-loop levels: requests in flight, e.g. 1,4,16")
    load.add_argument("--request-rate", type=lambda t: _numbers(t, float, "--request-rate"),
                      help="open-loop levels: Poisson arrivals per second, e.g. 2 or 2,8")
    bound = ap.add_mutually_exclusive_group(required=True)
    bound.add_argument("--requests", type=int, help="measured requests per level")
    bound.add_argument("--duration", type=float, help="seconds per level (no new request after it)")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (default 128)")
    ap.add_argument("--stream", action="store_true", help="stream responses (needed for TTFT / inter-token latency)")
    ap.add_argument("--warmup", type=int, default=0, help="unmeasured requests before each level (default 0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of prompt order and Poisson arrivals (default 0)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-request deadline in seconds")
    ap.add_argument("--tokenizer", default=None,
                    help="HF tokenizer dir or `whitespace` to count output tokens (default: the repository's; with "
                         "--openai-url the server's usage.completion_tokens)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: server's)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p (default: server's)")
    ap.add_argument("--top-k", type=int, default=None, help="top-k (default: server's)")
    ap.add_argument("--chat", action="store_true",
                    help="send every prompt inside the model's chat template (as a chat client does; the tokenizer is "
                         "--tokenizer or the repository's): an instruct model answers a bare question briefly or not "
                         "at all); with --openai-url: /chat/completions, the server applies its chat template")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--baseline-url", default=None,
                    help="gRPC endpoint of the same deployment with speculation off (e.g. the same build served with "
                         "the reference model's `speculative` parameter false): each level runs there too, right "
                         "after this one; its report goes to OUT/baseline/, and OUT/speculation_on_off.png plots both "
                         "throughput curves and their ratio (OUT/comparison.json the numbers); an OpenAI base URL "
                         "with --openai-url")
    return ap


def level_specs(args: argparse.Namespace) -> list[LevelSpec]:
    mode: Literal["concurrency", "rate"] = "concurrency" if args.concurrency else "rate"
    levels = args.concurrency or args.request_rate
    sampling = sampling_of({"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k})
    return [
        LevelSpec(mode=mode, level=lv, max_tokens=args.max_tokens, stream=args.stream, requests=args.requests,
                  duration_s=args.duration, warmup=args.warmup, seed=args.seed, sampling=sampling)
        for lv in levels
    ]


def write_reports(out: Path, results: list[LevelResult], meta: dict[str, Any]) -> list[LevelReport]:
    """report.json, report.csv, requests.jsonl and the plots for every level measured so far."""
    out.mkdir(parents=True, exist_ok=True)
    reports = [
        aggregate(r.records, mode=r.spec.mode, level=r.spec.level, duration_s=r.duration_s, interrupted=r.interrupted)
        for r in results
    ]
    doc = {"meta": meta, "levels": [rep.to_json() for rep in reports],
           "acceptance_by_level": acceptance_by_level(reports)}
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    with (out / "report.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS))
        w.writeheader()
        for rep in reports:
            w.writerow(csv_row(rep))
    with (out / "requests.jsonl").open("w") as f:
        for r in results:
            for rec in r.records:
                f.write(json.dumps({"mode": r.spec.mode, "level": r.spec.level, **asdict(rec)}) + "\n")
    ttfts = [[rec.ttft for rec in r.records if rec.ok and rec.ttft is not None] for r in results]
    write_plots(reports, ttfts, out)
    return reports


def acceptance_line(reports: list[LevelReport]) -> str | None:
    """Acceptance per level in one line (two levels or more with speculative stats), relative to the first."""
    rows = acceptance_by_level(reports)
    if len(rows) < 2:
        return None
    parts = [f"{r['mode']}={r['level']:g} {r['acceptance_rate']:.3f}"
             + ("" if r["tau"] is None else f" (tau {r['tau']:.2f})")
             + ("" if i == 0 or r["vs_first_level"] is None else f" {r['vs_first_level']:.2f}x")
             for i, r in enumerate(rows)]
    return ("acceptance by level: " + ", ".join(parts) + " -- acceptance can fall as batches grow (NVIDIA/"
            "TensorRT-LLM#9208): size for the level you serve at, not for one sequence")


def _summary_line(rep: LevelReport) -> str:

    def p50(s: Summary | None) -> str:
        return "-" if s is None else f"{s.p50 * 1e3:.1f}ms"

    spec = "" if rep.tau is None else f" tau={rep.tau:.2f} accept={rep.acceptance_rate or 0:.3f}"
    errs = ", ".join(f"{k}={v}" for k, v in rep.errors.items()) or "none"
    return (f"{rep.mode}={rep.level:g}: {rep.requests_ok}/{rep.requests_sent} ok, {rep.request_throughput:.2f} req/s, "
            f"{rep.output_tokens_per_s:.1f} tok/s, TTFT p50 {p50(rep.ttft_s)}, ITL p50 {p50(rep.itl_s)}, "
            f"e2e p50 {p50(rep.e2e_s)}{spec}; errors: {errs}")


async def run_level(
    client: LoadClient,
    prompts: list[str],
    counter: TokenCounter,
    spec: LevelSpec,
    stop: asyncio.Event,
    *,
    progress: bool,
    progress_file: TextIO | None = None,  # None: tqdm writes to sys.stderr
) -> LevelResult:
    """One level as the CLI runs it, progress bar included (one update per finished request, not per response);
    bench/bench_client.py measures exactly this."""
    bar = tqdm(total=spec.requests, desc=f"{spec.mode} {spec.level:g}", unit="req", disable=not progress,
               file=progress_file)
    with bar:
        return await LevelRunner(client, prompts, counter, spec, stop, on_done=lambda _r: bar.update(1)).run()


def write_comparison(out: Path, on: list[LevelReport], off: list[LevelReport]) -> None:
    """comparison.json and the plot: output tokens/s with and without speculation per level, and their ratio."""
    rows = [{"level": a.level, "on_tokens_per_s": a.output_tokens_per_s, "off_tokens_per_s": b.output_tokens_per_s,
             "ratio": a.output_tokens_per_s / b.output_tokens_per_s if b.output_tokens_per_s else None,
             "tau": a.tau} for a, b in zip(on, off, strict=True)]
    (out / "comparison.json").write_text(json.dumps({"mode": on[0].mode, "levels": rows}, indent=2) + "\n")
    plot_speculation_comparison(on, off, out / COMPARISON_FILE)


async def _connect(args: argparse.Namespace, url: str) -> AsyncLLMClient | OpenAIClient:
    if args.openai_url is not None:
        return await OpenAIClient.connect(url, args.model, chat=args.chat, timeout_s=args.timeout)
    if args.repo is not None:
        return AsyncLLMClient(url, sch.from_repository(args.repo, args.model), timeout_s=args.timeout)
    return await AsyncLLMClient.connect(url, args.model, timeout_s=args.timeout)


def _target(client: AsyncLLMClient | OpenAIClient) -> dict[str, Any]:
    """What the report's meta says of the target."""
    if isinstance(client, OpenAIClient):
        api = "chat/completions" if client.chat else "completions"
        return {"url": client.url, "model": client.model, "schema_source": f"OpenAI API: GET /models, POST /{api}"}
    return {"url": client.url, "model": client.schema.model, "schema_source": client.schema.source}


def _counter_and_prompts(args: argparse.Namespace, client: AsyncLLMClient | OpenAIClient,
                         prompts: list[str]) -> tuple[TokenCounter, list[str]]:
    """How output tokens are counted, and the prompts as sent (an OpenAI server applies the chat template)."""
    if isinstance(client, OpenAIClient):
        return (make_counter(args.tokenizer) if args.tokenizer else UsageCounter()), prompts
    counter = make_counter(args.tokenizer or client.schema.tokenizer)
    if args.chat:
        wrap = chat_template(args.tokenizer or client.schema.tokenizer)
        prompts = [wrap(p) for p in prompts]
    return counter, prompts


async def run(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts)
    specs = level_specs(args)
    if args.openai_url is not None and args.repo is not None:
        raise ValueError("--repo reads a Triton repository's client.json; an OpenAI endpoint (--openai-url) needs none")
    client = await _connect(args, args.url or args.openai_url)
    try:
        baseline = None if args.baseline_url is None else await _connect(args, args.baseline_url)
    except BaseException:
        await client.close()
        raise
    counter, prompts = _counter_and_prompts(args, client, prompts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    meta = {
        "argv": sys.argv, **_target(client),
        "prompts_file": str(args.prompts), "prompts": len(prompts), "chat": args.chat, "tokenizer": counter.name,
        "max_tokens": args.max_tokens, "stream": args.stream, "seed": args.seed, "warmup": args.warmup,
        "requests_per_level": args.requests, "duration_per_level_s": args.duration, "timeout_s": args.timeout,
        "sampling": specs[0].sampling, "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "interrupted": False,
    }
    results: list[LevelResult] = []
    base_results: list[LevelResult] = []
    reports: list[LevelReport] = []
    try:
        for spec in specs:
            if stop.is_set():
                break
            result = await run_level(client, prompts, counter, spec, stop, progress=not args.no_progress)
            results.append(result)
            meta["interrupted"] = result.interrupted
            reports = write_reports(args.out, results, meta)
            print(_summary_line(reports[-1]), flush=True)
            if baseline is not None and not stop.is_set():
                b = await run_level(baseline, prompts, counter, spec, stop, progress=not args.no_progress)
                base_results.append(b)
                base_reports = write_reports(args.out / "baseline", base_results, {**meta, "url": args.baseline_url})
                print("speculation off: " + _summary_line(base_reports[-1]), flush=True)
                write_comparison(args.out, reports[: len(base_reports)], base_reports)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await client.close()
        if baseline is not None:
            await baseline.close()
    if stop.is_set():
        meta["interrupted"] = True
        write_reports(args.out, results, meta)
        print(f"interrupted: wrote what was measured to {args.out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if (line := acceptance_line(reports)) is not None:
        print(line, flush=True)
    print(f"wrote {args.out}/report.json, report.csv, requests.jsonl and plots", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests is not None and args.requests < 1:
        print(f"error: --requests {args.requests}: must be >= 1", file=sys.stderr)
        return 2
    if args.duration is not None and args.duration <= 0:
        print(f"error: --duration {args.duration}: must be > 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args))
    except (PromptFileError, sch.SchemaError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
