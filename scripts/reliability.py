r"""Reliability runs on a served build: a soak and three faults, every figure measured in this run.

    .venv/bin/python scripts/reliability.py --repo build/demo/triton_repo --out results/reliability \
        [--soak-s 180] [--concurrency 4] [--max-tokens 64] [--abandon 20] [--abandon-ids random|none]

1. soak: clients/loadtest.py at --concurrency for --soak-s seconds through the ensemble; requests sent / ok /
   errors, the server's own count of successful ensemble requests (nothing lost or counted twice), and the server's
   memory (tritonserver + python-backend stubs, RSS) before and after.
2. SIGSTOP: the server is frozen for 5 s while requests are in flight (40 s load); requests lost.
3. abandoned ensemble streams: --abandon clients start ensemble streams and vanish after their first chunk,
   without the stop request (Triton 2.51 does not pass the cancellation on to the LLM model; postprocessing sends
   the stop for them when they carry a 128-bit id, --abandon-ids random; none: no id, docs/triton.md
   "Cancellation"); then the first-token time of a fresh request (nan: it got an error), how long until the LLM
   model holds no request, and how many were counted cancelled and how many ended by triton.request_deadline_s.
4. hostile: every prompt solo, then all concurrently through the ensemble (short request ids) and BLS while one
   client floods the tensorrt_llm model with stop requests for every id it can guess, another sends requests
   with 200,000 stop words and a third calls the tensorrt_llm model directly with a prompt's ids (the internal
   models answer only the server's own models unless triton.expose_internal_models): concurrent outputs identical
   to their solo runs, the rates and the answers.
5. stop_flood: a fresh request's first-token time, idle and while 4 clients send 1,000,000-stop-word requests.
6. llmapi_prompt (an llmapi-layout repository only): a 5 MB prompt's time to refusal, and a concurrent stream's
   first-token time beside it.
7. kill -9 while requests are in flight (40 s load): what the load tester counted, and that it wrote its report.
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
import uuid
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

from scripts.triton_suite import chosen_runs, ensemble_stream, grpc_inputs, llm_stop, run_suite
from triton_repo.launch import TritonServer

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Explain speculative decoding in two sentences.", "Write a haiku about the sea.",
           "List three uses of a paperclip.", "What is the capital of France and why is it famous?",
           "Summarize the plot of Romeo and Juliet.", "Give me a recipe for pancakes.",
           "How do vaccines work?", "Describe a sunset to someone who cannot see."]


def _pid(srv: TritonServer) -> int:
    pid = srv.pid
    if pid is None:
        raise SystemExit("tritonserver is not running")
    return pid


def metric(srv: TritonServer, name: str, model: str | None = None) -> float:
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    pat = rf'^{name}\{{[^}}]*{"" if model is None else f"model=.{model}."}[^}}]*\}} ([0-9.e+-]+)$'
    return sum(float(m.group(1)) for m in re.finditer(pat, text, re.M))


def rss_mb(pid: int) -> float:
    p = psutil.Process(pid)
    return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]) / 2**20


def loadtest(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace, seconds: float,
             during: Any = None) -> dict[str, Any]:
    """clients/loadtest.py for `seconds`; `during(proc)` runs while it does. Returns its level report + exit code."""
    argv = [sys.executable, str(ROOT / "clients" / "loadtest.py"), "--url", srv.grpc_url, "--repo", str(srv.repo),
            "--prompts", str(prompts), "--out", str(out), "--concurrency", str(args.concurrency), "--duration",
            str(seconds), "--max-tokens", str(args.max_tokens), "--stream", "--no-progress", "--timeout", "120"]
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
    rss_cold = rss_mb(_pid(srv))
    loadtest(srv, out / "soak-warmup", prompts, args, WARMUP_S)
    rss0, ok0 = rss_mb(_pid(srv)), metric(srv, "nv_inference_request_success", "ensemble")
    run = loadtest(srv, out / "soak", prompts, args, args.soak_s)
    rep = run["report"]
    res = {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
           "server_successes": metric(srv, "nv_inference_request_success", "ensemble") - ok0,
           "rss_cold_mb": round(rss_cold), "rss_before_mb": round(rss0),
           "rss_after_mb": round(rss_mb(_pid(srv))),
           "in_flight_after": metric(srv, "eagle_llm_requests_in_flight"), "tau": rep.get("tau")}
    print(
        f"soak c={args.concurrency} {args.soak_s:g}s: {counts(rep)}; server counted {res['server_successes']:.0f}; "
        f"RSS {res['rss_cold_mb']} before the {WARMUP_S:g} s warm-up, "
        f"{res['rss_before_mb']} -> {res['rss_after_mb']} MB "
        f"over the soak; in flight after {res['in_flight_after']:.0f}"
    )
    return res


def _when_loaded(srv: TritonServer) -> None:
    """Wait until the load tester has requests in flight on the server (its start-up takes a while), then 5 s."""
    while metric(srv, "eagle_llm_requests_in_flight") == 0:
        time.sleep(0.2)
    time.sleep(5)


def sigstop(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    def freeze(_proc: Any) -> None:
        _when_loaded(srv)
        os.kill(_pid(srv), signal.SIGSTOP)
        time.sleep(5)
        os.kill(_pid(srv), signal.SIGCONT)

    ok0 = metric(srv, "nv_inference_request_success", "ensemble")
    rep = loadtest(srv, out / "sigstop", prompts, args, 40, freeze)["report"]
    served = metric(srv, "nv_inference_request_success", "ensemble") - ok0
    print(f"SIGSTOP 5 s mid-load: {counts(rep)}; server counted {served:.0f}")
    return {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
            "server_successes": served}


def _first_token_s(url: str, text: str, max_tokens: int, abandon: bool, request_id: str = "") -> float:
    """Seconds to the first chunk of one ensemble stream; abandon=True closes the client right after it. A stream
    with a request id also carries a stop_key (what postprocessing presents to stop it: models/ownership.py)."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    t0 = time.perf_counter()
    c.async_stream_infer("ensemble", ensemble_stream(text, max_tokens), request_id=request_id,
                         enable_empty_final_response=True,
                         parameters={"stop_key": uuid.uuid4().hex} if request_id else None)
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
    ids = [uuid.uuid4().hex if args.abandon_ids == "random" else "" for _ in range(args.abandon)]
    threads = [threading.Thread(target=_first_token_s, args=(srv.grpc_url, PROMPTS[i % len(PROMPTS)], 512, True,
                                                             ids[i]))
               for i in range(args.abandon)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(2)  # all admitted; the first ones hold the slots
    loaded = _first_token_s(srv.grpc_url, PROMPTS[1], 8, abandon=False)
    for t in threads:
        t.join(1200)
    while metric(srv, "eagle_llm_requests_in_flight") > 0 and time.perf_counter() - t0 < 1200:
        time.sleep(0.5)
    res = {
        "abandoned": args.abandon,
        "request_ids": args.abandon_ids,
        "ttft_idle_s": round(quiet, 3),
        "ttft_after_abandon_s": round(loaded, 3),
        "slots_free_after_s": round(time.perf_counter() - t0, 1),
        "expired": metric(srv, "eagle_llm_requests_expired_total") - expired0,
        "cancelled": metric(srv, "eagle_llm_requests_cancelled_total") - cancelled0,
        "deadline_s": _deadline(srv.repo),
    }
    print(
        f"{args.abandon} abandoned ensemble streams (request ids: {args.abandon_ids}; "
        f"deadline {res['deadline_s']} s): next first token "
        f"{quiet:.2f} s idle -> {loaded:.2f} s; LLM model empty after {res['slots_free_after_s']} s; "
        f"{res['cancelled']:.0f} cancelled, {res['expired']:.0f} ended by the deadline"
    )
    return res


def _deadline(repo: Path) -> str:
    m = re.search(r'key: "request_deadline_s"\s*value \{\s*string_value: "([^"]+)"', (repo / "tensorrt_llm" /
                                                                                     "config.pbtxt").read_text())
    return m.group(1) if m else "none"


def kill9(srv: TritonServer, out: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    def kill(_proc: Any) -> None:
        _when_loaded(srv)
        os.kill(_pid(srv), signal.SIGKILL)

    run = loadtest(srv, out / "kill9", prompts, args, 40, kill)
    rep = run["report"]
    print(f"kill -9 mid-load: {counts(rep)}; load tester exit {run['exit']}, report written: {bool(rep)}")
    return {"sent": rep.get("requests_sent"), "ok": rep.get("requests_ok"), "errors": rep.get("errors"),
            "loadtest_exit": run["exit"], "report_written": bool(rep)}


# ---- hostile clients (docs/deploy.md "Reliability") -----------------------------------------------------------------


def _stream_text(url: str, model: str, ins: list[Any], request_id: str = "") -> tuple[str, float, str | None]:
    """(text, seconds to the first chunk, error message or None) of one stream; text concatenates the chunks."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    t0, first = time.perf_counter(), float("nan")
    text: list[str] = []
    try:
        c.async_stream_infer(model, ins, enable_empty_final_response=True, request_id=request_id)
        while True:
            result, error = q.get(timeout=600)
            if error is not None:
                return "".join(text), time.perf_counter() - t0, error.message()
            resp = result.get_response()
            if resp.outputs:
                first = first if first == first else time.perf_counter() - t0
                text.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if resp.parameters["triton_final_response"].bool_param:
                return "".join(text), first, None
    finally:
        c.stop_stream()
        c.close()


def _good(text: str, max_tokens: int) -> list[Any]:
    return grpc_inputs([("text_input", np.array([[text]], dtype=object), "BYTES"),
                    ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
                    ("stream", np.array([[True]]), "BOOL")])


def _stop_flood_inputs(n: int) -> list[Any]:
    return _good(PROMPTS[0], 8) + grpc_inputs([("stop_words", np.array([[b"w%d" % i for i in range(n)]], dtype=object),
                                            "BYTES")])


def _llm_direct(url: str) -> str | None:
    """A client's direct generate request to the tensorrt_llm model (8 ids, 8 tokens): its error, None if served."""
    ids = np.arange(100, 108, dtype=np.int32).reshape(1, -1)
    ins = grpc_inputs([("input_ids", ids, "INT32"), ("input_lengths", np.array([[8]], np.int32), "INT32"),
                   ("request_output_len", np.array([[8]], np.int32), "INT32")])
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        c.async_stream_infer("tensorrt_llm", ins, enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=600)
            if error is not None:
                return str(error.message())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        c.stop_stream()
        c.close()


class _Repeat(threading.Thread):
    """Calls `fn()` until stopped; counts calls and the errors' first words."""

    def __init__(self, fn: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.done, self.calls, self.seconds = fn, threading.Event(), 0, 0.0
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        while not self.done.is_set():
            t0 = time.perf_counter()
            answers = self.fn()
            self.seconds += time.perf_counter() - t0
            for err in answers:
                self.calls += 1
                key = "ok" if err is None else err.split(";")[0][-70:]
                self.errors[key] = self.errors.get(key, 0) + 1


def hostile(srv: TritonServer, _out: Path, _prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Each prompt solo, then all of them concurrently (ensemble with short request ids "1".."8", and BLS) while one
    client floods the tensorrt_llm model with stop requests for every id it can guess and another sends requests
    with 200,000 stop words: how many concurrent outputs equal their solo runs, the stop and flood rates and how
    each was answered."""
    solo = {p: _stream_text(srv.grpc_url, "ensemble", _good(p, args.max_tokens)) for p in PROMPTS}
    guesses = [str(i) for i in range(1, 9)] + [f"bls-{i}" for i in range(1, 9)]
    stopper = _Repeat(lambda: [_stream_text(srv.grpc_url, "tensorrt_llm", llm_stop(), rid)[2] for rid in guesses])
    flooder = _Repeat(lambda: [_stream_text(srv.grpc_url, "ensemble", _stop_flood_inputs(200_000))[2]])
    direct = _Repeat(lambda: [_llm_direct(srv.grpc_url)])
    results: dict[str, tuple[str, float, str | None]] = {}

    def one(i: int, p: str, model: str) -> None:
        results[f"{model} {i}"] = _stream_text(srv.grpc_url, model, _good(p, args.max_tokens), str(i + 1))

    threads = [threading.Thread(target=one, args=(i, p, m)) for m in ("ensemble", "tensorrt_llm_bls")
               for i, p in enumerate(PROMPTS)]
    stopper.start()
    flooder.start()
    direct.start()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(1200)
    wall = time.perf_counter() - t0
    for r in (stopper, flooder, direct):
        r.done.set()
    for r in (stopper, flooder, direct):
        r.join(60)
    same = sum(results[f"{m} {i}"][0] == solo[p][0] for m in ("ensemble", "tensorrt_llm_bls")
               for i, p in enumerate(PROMPTS))
    res = {"streams": len(threads), "identical_to_solo": same, "seconds": round(wall, 1),
           "stop_requests": stopper.calls, "stop_rate_per_s": round(stopper.calls / wall, 1),
           "stop_answers": stopper.errors, "flood_requests": flooder.calls,
           "flood_mean_refusal_s": round(flooder.seconds / max(1, flooder.calls), 3), "flood_answers": flooder.errors,
           "direct_calls": direct.calls, "direct_rate_per_s": round(direct.calls / wall, 1),
           "direct_answers": direct.errors,
           "empty_solo_outputs": sum(not v[0] for v in solo.values()),
           "output_chars": sum(len(v[0]) for v in results.values())}
    print(f"hostile: {same}/{len(threads)} concurrent streams identical to their solo runs ({res['output_chars']} "
          f"characters, {res['empty_solo_outputs']} empty solo outputs) while {res['stop_requests']} "
          f"guessed stop requests ({res['stop_rate_per_s']}/s) and {flooder.calls} 200,000-stop-word requests "
          f"(refused in {res['flood_mean_refusal_s']} s each) and {direct.calls} direct tensorrt_llm requests "
          f"({res['direct_rate_per_s']}/s) were sent; answers {stopper.errors} / {flooder.errors} / {direct.errors}")
    return res


def stop_flood(srv: TritonServer, _out: Path, _prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    """First-token time of a fresh request, idle and while 4 clients send 1,000,000-stop-word requests (8.9 MB)."""
    idle = [_stream_text(srv.grpc_url, "ensemble", _good(PROMPTS[1], 8))[1] for _ in range(3)]
    flooders = [_Repeat(lambda: [_stream_text(srv.grpc_url, "ensemble", _stop_flood_inputs(1_000_000))[2]])
                for _ in range(4)]
    for f in flooders:
        f.start()
    time.sleep(3)
    loaded = [_stream_text(srv.grpc_url, "ensemble", _good(PROMPTS[1], 8))[1] for _ in range(3)]
    for f in flooders:
        f.done.set()
    for f in flooders:
        f.join(120)
    answers: dict[str, int] = {}
    for f in flooders:
        for k, v in f.errors.items():
            answers[k] = answers.get(k, 0) + v
    calls = sum(f.calls for f in flooders)
    res = {"ttft_idle_s": [round(x, 3) for x in idle], "ttft_flood_s": [round(x, 3) for x in loaded],
           "flood_requests": calls, "flood_mean_answer_s": round(sum(f.seconds for f in flooders) / max(1, calls), 3),
           "flood_answers": answers}
    print(f"stop-word flood (4 clients, 1,000,000 words each): first token {max(idle):.2f} s idle -> "
          f"{max(loaded):.2f} s (worst of 3); {calls} flood requests answered in {res['flood_mean_answer_s']} s each: "
          f"{answers}")
    return res


def llmapi_prompt(srv: TritonServer, _out: Path, _prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    """On an llmapi-layout repository: first-token time of a stream, idle and while another client sends a 5 MB
    prompt; how long the 5 MB prompt took to be refused, and with what."""
    def ins(text: bytes, n: int) -> list[Any]:
        return grpc_inputs(
            [
                ("text_input", np.array([text], dtype=object), "BYTES"),
                ("streaming", np.array([True]), "BOOL"),
                ("sampling_param_max_tokens", np.array([n], np.int32), "INT32"),
            ]
        )

    idle = _stream_text(srv.grpc_url, "tensorrt_llm", ins(PROMPTS[1].encode(), 8))[1]
    big: dict[str, Any] = {}

    def send_big() -> None:
        t0 = time.perf_counter()
        big["error"] = _stream_text(srv.grpc_url, "tensorrt_llm", ins(b"a" * 5_000_000, 8))[2]
        big["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=send_big)
    t.start()
    loaded = _stream_text(srv.grpc_url, "tensorrt_llm", ins(PROMPTS[1].encode(), 8))[1]
    t.join(600)
    res = {"ttft_idle_s": round(idle, 3), "ttft_beside_5mb_s": round(loaded, 3),
           "refused_after_s": round(big["seconds"], 3), "answer": big["error"]}
    print(f"llmapi 5 MB prompt: refused after {res['refused_after_s']} s ({big['error']!r}); a concurrent stream's "
          f"first token {idle:.2f} s idle -> {loaded:.2f} s")
    return res


RUNS = {"soak": soak, "sigstop": sigstop, "abandoned": abandoned, "hostile": hostile, "stop_flood": stop_flood,
        "llmapi_prompt": llmapi_prompt, "kill9": kill9}  # kill9 last: it ends the server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-reliability",
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
    ap.add_argument("--abandon-ids", choices=("random", "none"), default="random",
                    help="the abandoned streams' request ids: random ones with a stop_key (postprocessing stops "
                         "them), or none, no key (no stop may name them; the deadline bounds them) (default random)")
    default = ",".join(r for r in RUNS if r != "llmapi_prompt")
    ap.add_argument("--runs", default=default, help=f"which runs, in this order (default {default}; llmapi_prompt "
                    "needs an llmapi-layout repository)")
    args = ap.parse_args(argv)
    runs = chosen_runs(ap, args.runs, RUNS)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = args.out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return run_suite(args.repo, args.out, runs, lambda srv, name: RUNS[name](srv, args.out, prompts, args),
                     "reliability.json")


if __name__ == "__main__":
    sys.exit(main())
