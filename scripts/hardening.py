r"""Hostile-but-plausible requests on a served build, every figure measured in this run.

    .venv/bin/python scripts/hardening.py --repo build/demo/triton_repo --out results/hardening \
        [--runs ownership,retries,long_ids,sigterm] [--max-tokens 64] [--long-ids 60] [--drain-s 10]

1. ownership: victims stream through the ensemble with ids of their own choosing (ids full of hex digits, short
   ones, two sharing one id), each with its own `stop_key` request parameter, while an attacker who knows every id
   sends upstream's stop request for each, without a key and with keys of its own (models/ownership.py): tokens
   each victim got of the --max-tokens asked (end_id -1: no early end), requests counted cancelled, the answers.
2. retries: one request id (with 32 hex digits) streamed and abandoned 3 times (a fresh stop_key each, as our
   clients send; then one key for all three): requests left in the LLM model after each, and how many
   postprocessing stopped.
3. long_ids: --long-ids ensemble streams with 8 MB request ids, each abandoned: how each was answered, the mean time
   to that answer, and the server's memory (tritonserver + python-backend stubs, RSS) before and after.
4. sigterm: a fresh launcher (triton_repo/launch.py) on the same repository, one ensemble stream without a key
   abandoned in flight (nothing stops it), then SIGTERM: seconds until the launcher exits, with --drain-s and
   with --drain-s 30 (tritonserver's own default exit timeout).
Prints one summary line per run and writes <out>/hardening.json.

Inputs:  --repo, a rendered Triton repository of a reference build (served here by a real tritonserver)
Outputs: one summary line per run on stdout, <out>/hardening.json
Guide:   docs/deploy.md
"""

from __future__ import annotations

import argparse
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import tritonclient.grpc as grpcclient

from scripts.triton_suite import chosen_runs, ensemble_stream, llm_stop, run_suite
from triton_repo.launch import DRAIN_S, TritonServer, free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Explain speculative decoding in two sentences."
VICTIM_IDS = ["req-00000000000000000000000000000000000042", "00000000000000000000000000000001",
              "12345678901234567890123456789012", "1", "victim-2", "shared", "shared"]


def metric(srv: TritonServer, name: str) -> float:
    text = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M))


def rss_mb(pid: int) -> dict[str, float]:
    """RSS in MB of tritonserver and of each python-backend stub (by model), and their total."""
    p = psutil.Process(pid)
    out = {"tritonserver": p.memory_info().rss / 2**20}
    for c in p.children(recursive=True):
        model = next((Path(a).parent.parent.name for a in c.cmdline()[1:2]), str(c.pid))  # <model>/1/model.py
        out[model] = out.get(model, 0.0) + c.memory_info().rss / 2**20
    out = {k: round(v) for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def _stream(url: str, model: str, ins: list[Any], rid: str = "", key: str | None = None,
            abandon: bool = False) -> tuple[int, str | None, float]:
    """(chunks received, error message or None, seconds to the first answer) of one stream; abandon=True closes the
    client (a plain gRPC cancel, no stop request) after the first chunk."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    t0, first, chunks = time.perf_counter(), float("nan"), 0
    try:
        c.async_stream_infer(model, ins, enable_empty_final_response=True, request_id=rid,
                             parameters=None if key is None else {"stop_key": key})
        while True:
            result, error = q.get(timeout=600)
            first = first if first == first else time.perf_counter() - t0
            if error is not None:
                return chunks, error.message(), first
            resp = result.get_response()
            chunks += bool(resp.outputs)
            if abandon and chunks:
                c.stop_stream(cancel_requests=True)
                return chunks, None, first
            if resp.parameters["triton_final_response"].bool_param:
                return chunks, None, first
    finally:
        c.stop_stream()
        c.close()


def _idle(srv: TritonServer, timeout_s: float = 600) -> float:
    t0 = time.perf_counter()
    while metric(srv, "eagle_llm_requests_in_flight") > 0 and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.1)
    return time.perf_counter() - t0


def ownership(srv: TritonServer, args: argparse.Namespace) -> dict[str, Any]:
    _idle(srv)
    victims = [(rid, secrets.token_hex(16)) for rid in VICTIM_IDS]
    stops = [(rid, key) for rid in sorted(set(VICTIM_IDS)) for key in (None, secrets.token_hex(16), "0" * 32)]
    answers: dict[str, int] = {}
    done = threading.Event()

    def attack() -> None:
        while not done.is_set():
            for rid, key in stops:
                err = _stream(srv.grpc_url, "tensorrt_llm", llm_stop(), rid, key)[1]
                k = "empty answer" if err is None else err.split(";")[0][:60]
                answers[k] = answers.get(k, 0) + 1

    tokens0, cancelled0 = metric(srv, "eagle_llm_generated_tokens_total"), metric(
        srv, "eagle_llm_requests_cancelled_total")
    got: dict[int, tuple[int, str | None, float]] = {}

    def victim(i: int, v: tuple[str, str]) -> None:
        got[i] = _stream(srv.grpc_url, "ensemble", ensemble_stream(PROMPT, args.max_tokens), *v)

    threads = [threading.Thread(target=victim, args=(i, v)) for i, v in enumerate(victims)]
    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(1200)
    done.set()
    attacker.join(120)
    _idle(srv)
    res = {"victims": len(victims), "max_tokens": args.max_tokens,
           "tokens_generated": metric(srv, "eagle_llm_generated_tokens_total") - tokens0,
           "cancelled": metric(srv, "eagle_llm_requests_cancelled_total") - cancelled0,
           "victim_errors": [e for _, e, _ in got.values() if e], "stop_answers": answers}
    print(f"ownership: {len(victims)} victims (ids {', '.join(repr(r) for r in VICTIM_IDS)}) got "
          f"{res['tokens_generated']:.0f} tokens of {len(victims) * args.max_tokens} asked, {res['cancelled']:.0f} "
          f"cancelled, errors {res['victim_errors']}, while {sum(answers.values())} foreign stops were answered "
          f"{answers}")
    return res


def retries(srv: TritonServer, args: argparse.Namespace) -> dict[str, Any]:
    _idle(srv)
    out: dict[str, Any] = {}
    rid = f"retry-{secrets.token_hex(16)}"  # 32 hex digits: an id postprocessing relayed by before the stop_key
    for mode in ("fresh key", "same key"):
        key, left, cancelled0 = secrets.token_hex(16), [], metric(srv, "eagle_llm_requests_cancelled_total")
        for _ in range(3):
            _stream(srv.grpc_url, "ensemble", ensemble_stream(PROMPT, 1000), rid,
                    secrets.token_hex(16) if mode == "fresh key" else key, abandon=True)
            waited = _idle(srv, 30)
            left.append((metric(srv, "eagle_llm_requests_in_flight"), round(waited, 1)))
        out[mode] = {"in_flight_after_each": [n for n, _ in left], "seconds_to_empty": [s for _, s in left],
                     "cancelled": metric(srv, "eagle_llm_requests_cancelled_total") - cancelled0}
        print(f"retries ({mode}): 3 abandons of id {rid!r}; in flight after each {out[mode]['in_flight_after_each']}"
              f" (empty after {out[mode]['seconds_to_empty']} s); {out[mode]['cancelled']:.0f} stopped by "
              "postprocessing")
    return out


def long_ids(srv: TritonServer, args: argparse.Namespace) -> dict[str, Any]:
    """Two rounds of --long-ids: memory that grows in the first round and not in the second is the allocators'
    high-water mark (freed, kept for reuse); growth in every round would be ids kept."""
    _idle(srv)
    assert srv.pid is not None
    rss = [rss_mb(srv.pid)]
    answers: dict[str, int] = {}
    seconds = []
    for _round in range(2):
        for i in range(args.long_ids):
            rid = f"{i}-" + "x" * (8 << 20)
            _chunks, err, first = _stream(srv.grpc_url, "ensemble", ensemble_stream(PROMPT, 512), rid,
                                          secrets.token_hex(16), abandon=True)
            seconds.append(first)
            k = "served" if err is None else re.sub(r"\d+ bytes", "N bytes", err.split(";")[0])[-70:]
            answers[k] = answers.get(k, 0) + 1
        _idle(srv)
        time.sleep(2)
        rss.append(rss_mb(srv.pid))
    res = {"requests": 2 * args.long_ids, "id_bytes": 8 << 20, "answers": answers,
           "mean_answer_s": round(sum(seconds) / len(seconds), 3), "rss_mb": rss}
    growth = {k: [r[k] - rss[0][k] for r in rss[1:]] for k in rss[0]}
    print(f"long_ids: 2 x {args.long_ids} abandoned streams with 8 MB ids answered {answers} in "
          f"{res['mean_answer_s']} s on average; RSS (MB) before {rss[0]}; growth after each round {growth}")
    return res


def _sigterm_once(repo: Path, drain_s: int, out: Path) -> float:
    ports = [free_port() for _ in range(3)]
    proc = subprocess.Popen([sys.executable, str(ROOT / "triton_repo" / "launch.py"), "--repo", str(repo),
                             "--grpc-port", str(ports[0]), "--http-port", str(ports[1]), "--metrics-port",
                             str(ports[2]), "--log", str(out / f"sigterm-{drain_s}.log"), "--drain-s", str(drain_s)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("tritonserver ready")
        _stream(f"127.0.0.1:{ports[0]}", "ensemble", ensemble_stream(PROMPT, 1000), abandon=True)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=drain_s + 120)
        return time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def sigterm(srv: TritonServer, args: argparse.Namespace) -> dict[str, Any]:
    res = {f"drain_s_{d}": round(_sigterm_once(srv.repo, d, args.out), 1) for d in (args.drain_s, 30)}
    print(f"sigterm with an abandoned keyless stream in flight: stopped after {res[f'drain_s_{args.drain_s}']} s "
          f"with --drain-s {args.drain_s}, {res['drain_s_30']} s with --drain-s 30")
    return res


RUNS = {"ownership": ownership, "retries": retries, "long_ids": long_ids, "sigterm": sigterm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle-hardening", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, type=Path, help="rendered Triton repository (<build>/triton_repo)")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs, in this order (default {','.join(RUNS)})")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens each ownership victim asks for (default 64)")
    ap.add_argument("--long-ids", type=int, default=60, help="abandoned streams with 8 MB ids (default 60)")
    ap.add_argument("--drain-s", type=int, default=DRAIN_S,
                    help=f"the launcher's --drain-s in the sigterm run (default {DRAIN_S}, the launcher's)")
    args = ap.parse_args(argv)
    runs = chosen_runs(ap, args.runs, RUNS)
    if args.max_tokens < 1 or args.long_ids < 1 or args.drain_s < 0:
        ap.error("--max-tokens and --long-ids must be >= 1, --drain-s >= 0")
    return run_suite(args.repo, args.out, runs, lambda srv, name: RUNS[name](srv, args), "hardening.json")


if __name__ == "__main__":
    sys.exit(main())
