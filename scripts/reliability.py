r"""Reliability runs on a served build: a soak and three faults, every figure measured in this run.

    .venv/bin/python scripts/reliability.py --repo build/demo/triton_repo --out results/reliability \
        [--soak-s 180] [--concurrency 4] [--max-tokens 64] [--abandon 20]

1. soak: clients/loadtest.py at --concurrency for --soak-s seconds through the ensemble; requests sent / ok /
   errors, the server's own count of successful ensemble requests (nothing lost or counted twice), and the server's
   memory (tritonserver + python-backend stubs, RSS) before and after.
2. SIGSTOP: the server is frozen for 5 s while requests are in flight (40 s load); requests lost.
3. abandoned ensemble streams: --abandon clients start ensemble streams and vanish after their first chunk (Triton
   2.51 does not pass the cancellation on to the LLM model; postprocessing does, triton_repo/models/cancel_channel.py);
   then the first-token time of a fresh request (nan: it got an error), how long until the LLM model holds no
   request, and how many were counted cancelled and how many ended by triton.request_deadline_s.
4. kill -9 while requests are in flight (40 s load): what the load tester counted, and that it wrote its report.
Prints one summary line per run and writes <out>/reliability.json.

Inputs:  --repo, a rendered Triton repository of a reference build (served here by a real tritonserver)
Outputs: one summary line per run on stdout, <out>/reliability.json
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from triton_repo.launch import TritonServer, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Explain speculative decoding in two sentences.", "Write a haiku about the sea.",
           "List three uses of a paperclip.", "What is the capital of France and why is it famous?",
           "Summarize the plot of Romeo and Juliet.", "Give me a recipe for pancakes.",
           "How do vaccines work?", "Describe a sunset to someone who cannot see."]  # fmt: skip


def metric(srv: TritonServer, name: str, model: str | None = None) -> float:
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    pat = rf'^{name}\{{[^}}]*{"" if model is None else f"model=.{model}."}[^}}]*\}} ([0-9.e+-]+)$'
    return sum(float(m.group(1)) for m in re.finditer(pat, text, re.M))


def rss_mb(pid: int) -> float:
    p = psutil.Process(pid)
    return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]) / 2**20


def loadtest(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace, seconds: float,
             during: Any = None) -> dict[str, Any]:  # fmt: skip
    """clients/loadtest.py for `seconds`; `during(proc)` runs while it does. Returns its level report + exit code."""
    argv = [sys.executable, str(ROOT / "clients" / "loadtest.py"), "--url", srv.grpc_url, "--repo", str(srv.repo),
            "--prompts", str(prompts), "--out", str(out), "--concurrency", str(args.concurrency), "--duration",
            str(seconds), "--max-tokens", str(args.max_tokens), "--stream", "--no-progress", "--timeout", "120"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if during is not None:
        during(proc)
    log, _ = proc.communicate(timeout=seconds + 600)
    report = json.loads((out / "report.json").read_text())["levels"][0] if (out / "report.json").is_file() else {}
    return {"exit": proc.returncode, "report": report, "log_tail": log[-600:]}


WARMUP_S = 15.0


def counts(rep: dict[str, Any]) -> str:
    return f"{rep.get('requests_ok')}/{rep.get('requests_sent')} ok, errors {rep.get('errors')}"


def soak(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    # Growth is read from after a warm-up run (first requests load kernels, caches and allocator pools), so it
    # measures what serving keeps, not what starting to serve costs.
    rss_cold = rss_mb(srv.pid)  # type: ignore[arg-type]
    loadtest(srv, out / "soak-warmup", prompts, args, WARMUP_S)
    rss0, ok0 = rss_mb(srv.pid), metric(srv, "nv_inference_request_success", "ensemble")  # type: ignore[arg-type]
    run = loadtest(srv, out / "soak", prompts, args, args.soak_s)
    rep = run["report"]
    res = {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
           "server_successes": metric(srv, "nv_inference_request_success", "ensemble") - ok0,
           "rss_cold_mb": round(rss_cold), "rss_before_mb": round(rss0),
           "rss_after_mb": round(rss_mb(srv.pid)),  # type: ignore[arg-type]
           "in_flight_after": metric(srv, "eagle_llm_requests_in_flight"), "tau": rep.get("tau")}  # fmt: skip
    print(f"soak c={args.concurrency} {args.soak_s:g}s: {counts(rep)}; server counted {res['server_successes']:.0f}; "
          f"RSS {res['rss_cold_mb']} before the {WARMUP_S:g} s warm-up, {res['rss_before_mb']} -> {res['rss_after_mb']} MB "
          f"over the soak; in flight after {res['in_flight_after']:.0f}")
    return res


def _when_loaded(srv: TritonServer) -> None:
    """Wait until the load tester has requests in flight on the server (its start-up takes a while), then 5 s."""
    while metric(srv, "eagle_llm_requests_in_flight") == 0:
        time.sleep(0.2)
    time.sleep(5)


def sigstop(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    def freeze(_proc: Any) -> None:
        _when_loaded(srv)
        os.kill(srv.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        time.sleep(5)
        os.kill(srv.pid, signal.SIGCONT)  # type: ignore[arg-type]

    ok0 = metric(srv, "nv_inference_request_success", "ensemble")
    rep = loadtest(srv, out / "sigstop", prompts, args, 40, freeze)["report"]
    served = metric(srv, "nv_inference_request_success", "ensemble") - ok0
    print(f"SIGSTOP 5 s mid-load: {counts(rep)}; server counted {served:.0f}")
    return {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
            "server_successes": served}  # fmt: skip


def _ensemble_inputs(text: str, max_tokens: int) -> list[Any]:
    ins = []
    for name, value, dt in (("text_input", text, "BYTES"), ("max_tokens", max_tokens, "INT32"), ("stream", True, "BOOL"),
                            ("end_id", -1, "INT32")):  # fmt: skip
        arr = np.array([[value]], dtype={"BYTES": object, "INT32": np.int32, "BOOL": bool}[dt])
        i = grpcclient.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        ins.append(i)
    return ins


def _first_token_s(url: str, text: str, max_tokens: int, abandon: bool) -> float:
    """Seconds to the first chunk of one ensemble stream; abandon=True closes the client right after it."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    t0 = time.perf_counter()
    c.async_stream_infer("ensemble", _ensemble_inputs(text, max_tokens), enable_empty_final_response=True)
    result, error = q.get(timeout=1200)
    first = time.perf_counter() - t0
    if error is not None:  # e.g. an abandoned request that reached its deadline before its first token
        c.stop_stream()
        c.close()
        return float("nan")
    if abandon:
        c.stop_stream(cancel_requests=True)
    else:
        while not q.get(timeout=1200)[0].get_response().parameters["triton_final_response"].bool_param:
            pass
        c.stop_stream()
    c.close()
    return first


def abandoned(srv: TritonServer, _out: Path, _prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    quiet = _first_token_s(srv.grpc_url, PROMPTS[0], 8, abandon=False)
    expired0 = metric(srv, "eagle_llm_requests_expired_total")
    cancelled0 = metric(srv, "eagle_llm_requests_cancelled_total")
    threads = [threading.Thread(target=_first_token_s, args=(srv.grpc_url, PROMPTS[i % len(PROMPTS)], 512, True))
               for i in range(args.abandon)]  # fmt: skip
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(2)  # all admitted; the first ones hold the slots
    loaded = _first_token_s(srv.grpc_url, PROMPTS[1], 8, abandon=False)
    for t in threads:
        t.join(1200)
    while metric(srv, "eagle_llm_requests_in_flight") > 0 and time.perf_counter() - t0 < 1200:
        time.sleep(0.5)
    res = {"abandoned": args.abandon, "ttft_idle_s": round(quiet, 3), "ttft_after_abandon_s": round(loaded, 3),
           "slots_free_after_s": round(time.perf_counter() - t0, 1),
           "expired": metric(srv, "eagle_llm_requests_expired_total") - expired0,
           "cancelled": metric(srv, "eagle_llm_requests_cancelled_total") - cancelled0,
           "deadline_s": _deadline(srv.repo)}  # fmt: skip
    print(f"{args.abandon} abandoned ensemble streams (deadline {res['deadline_s']} s): next first token "
          f"{quiet:.2f} s idle -> {loaded:.2f} s; LLM model empty after {res['slots_free_after_s']} s; "
          f"{res['cancelled']:.0f} cancelled, {res['expired']:.0f} ended by the deadline")
    return res


def _deadline(repo: Path) -> str:
    m = re.search(r'key: "request_deadline_s"\s*value \{\s*string_value: "([^"]+)"', (repo / "tensorrt_llm" /
                                                                                     "config.pbtxt").read_text())
    return m.group(1) if m else "none"


def kill9(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    def kill(_proc: Any) -> None:
        _when_loaded(srv)
        os.kill(srv.pid, signal.SIGKILL)  # type: ignore[arg-type]

    run = loadtest(srv, out / "kill9", prompts, args, 40, kill)
    rep = run["report"]
    print(f"kill -9 mid-load: {counts(rep)}; load tester exit {run['exit']}, report written: {bool(rep)}")
    return {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
            "loadtest_exit": run["exit"], "report_written": bool(rep)}  # fmt: skip


RUNS = {"soak": soak, "sigstop": sigstop, "abandoned": abandoned, "kill9": kill9}  # kill9 last: it ends the server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  a rendered Triton repository of a finished build (--repo)\n"
               "Outputs: soak / SIGSTOP / abandoned-stream / kill -9 reports in --out\n"
               "Guide:   docs/deploy.md")
    ap.add_argument("--repo", required=True, type=Path, help="rendered Triton repository (<build>/triton_repo)")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--soak-s", type=float, default=180, help="soak duration in seconds (default 180)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request (default 64)")
    ap.add_argument("--abandon", type=int, default=20, help="abandoned ensemble streams (default 20)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs, in this order (default {','.join(RUNS)})")
    args = ap.parse_args(argv)
    if not set(args.runs.split(",")) <= set(RUNS):
        ap.error(f"--runs {args.runs}: choose from {', '.join(RUNS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = args.out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    srv = TritonServer(args.repo.resolve(), grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=args.out / "tritonserver.log")  # fmt: skip
    srv.start(timeout_s=600)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load_average": os.getloadavg(), "cpus": os.cpu_count()}  # fmt: skip
    try:
        for name in args.runs.split(","):
            results[name] = RUNS[name](srv, args.out, prompts, args)
    finally:
        results["load_average_end"] = os.getloadavg()
        srv.stop(timeout_s=10)
        (args.out / "reliability.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"load average {results['load_average'][0]:.1f} at start, {results['load_average_end'][0]:.1f} at end "
          f"({results['cpus']} CPUs); {args.out / 'reliability.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
