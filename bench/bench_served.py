"""Where served time goes: one build's decoding steps served by a real Triton server against the same steps in
process.

    python bench/bench_served.py --build build/demo --prompts FILE.jsonl --out OUT [--concurrency 1] \
        [--requests 4] [--max-tokens 64] [--rounds 2] [--threads 1]

Each round runs the requests twice, one after the other on the same machine: in process (a session of the build's
reference engine, `--concurrency` sequences in flight, no server) and through the server (clients/loadtest.py,
streaming, against the ensemble or the llmapi model), the server started once with $EAGLE_DEPLOY_STEP_PROFILE so that
its python models record every step (triton_repo/models/step_profile.py). The report (OUT/served_profile.json, and a
table on stdout) gives per decoding step at the chosen concurrency, medians over the steps of all rounds:

- in process: the step (Session.step) and its parts (draft levels, verify, walk, ...);
- served, inside the LLM model: the same step, of which the responses it sends (`send`), and the batcher's work
  around it (`join`, `finish`);
- served, outside the LLM model: preprocessing per request and postprocessing per streamed chunk (ensemble layout);
- end to end: output tokens/s of both, and what the client saw per step (the request's wall time / its steps), so
  the part no model records (gRPC, the ensemble scheduler, the python backend's IPC) is the remainder.

Inputs:  a finished reference build (either layout), a JSONL prompt file
Outputs: OUT/served_profile.json, OUT/served/ (the load test's report), OUT/profile/ (the raw step records)
Guide:   docs/benchmarks.md "Where served time goes"
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

REPO = Path(__file__).resolve().parent.parent

# the sweep's argument rules
from scripts.spec_sweep import (add_build_prompts_out, check_prompts_and_build, concurrency_levels, positive_int,
                                served_model)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench_served.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_prompts_out(ap, "output directory")
    ap.add_argument("--concurrency", type=concurrency_levels, default=[1],
                    help="sequences in flight (one level, default 1)")
    ap.add_argument("--requests", type=positive_int("--requests"), default=4, help="requests per round and side")
    ap.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=64, help="max_tokens per request")
    ap.add_argument("--rounds", type=positive_int("--rounds"), default=2, help="in process / served pairs (default 2)")
    ap.add_argument("--threads", type=positive_int("--threads"), default=1, help="torch / OpenMP threads (default 1)")
    args = ap.parse_args(argv)
    if len(args.concurrency) != 1:
        ap.error(f"--concurrency {','.join(map(str, args.concurrency))}: give one level")
    check_prompts_and_build(ap, args)
    return args


def in_process(engine: Any, prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The requests through one engine session, `concurrency` in flight (closed loop, as the load test); every
    decoding step timed with its parts."""
    from core.laps import Laps
    from engines.api import GenerationRequest, SamplingParams

    tok, c = engine.tokenizer, args.concurrency[0]
    reqs = [GenerationRequest(tok.encode(prompts[i % len(prompts)], add_special_tokens=True), args.max_tokens,
                              SamplingParams(), [tok.eos_token_id]) for i in range(args.requests)]
    session = engine.session(c, engine.limits.max_seq_len)
    session.laps = laps = Laps()
    steps: list[dict[str, Any]] = []
    nxt, tokens, t0 = 0, 0, time.perf_counter()
    while nxt < len(reqs) or not session.done:
        while nxt < len(reqs) and session.free:
            session.add(reqs[nxt])
            nxt += 1
        batch, prefill, before = len(session.active), bool(session.pending), dict(laps.parts)
        s0 = time.perf_counter()
        session.step()
        steps.append({"batch": batch, "prefill": prefill, "step_ms": 1e3 * (time.perf_counter() - s0),
                      "parts_ms": {k: 1e3 * (v - before.get(k, 0.0)) for k, v in laps.parts.items()
                                   if v - before.get(k, 0.0)}})
        for slot in session.finished:
            tokens += len(session.pop(slot).output_ids)
    return {"steps": steps, "tokens_per_s": tokens / (time.perf_counter() - t0)}


def served(url: str, repo: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, str(REPO / "clients" / "loadtest.py"), "--url", url, "--model", served_model(repo),
            "--repo", str(repo), "--prompts", str(args.prompts), "--out", str(out), "--concurrency",
            str(args.concurrency[0]), "--requests", str(args.requests), "--max-tokens", str(args.max_tokens),
            "--stream", "--no-progress", "--timeout", "900"]
    print("$ " + " ".join(argv), flush=True)
    subprocess.run(argv, cwd=REPO, check=True)
    [level] = json.loads((out / "report.json").read_text())["levels"]
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return {"tokens_per_s": level["output_tokens_per_s"], "records": recs}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(inproc: list[dict[str, Any]], srv: list[dict[str, Any]], profile: Path, c: int) -> dict[str, Any]:
    """Medians per decoding step at batch size c (prefills and smaller batches left out)."""
    def decode_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in steps if not s["prefill"] and s["batch"] == c]

    ip = decode_steps([s for r in inproc for s in r["steps"]])
    llm, pre, post = [], [], []
    for f in sorted(profile.glob("*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if f.name.startswith("preprocessing-"):
            pre += [x["ms"] for x in lines]
        elif f.name.startswith("postprocessing-"):
            post += [x["ms"] for x in lines]
        elif lines and "step_ms" in lines[0]:
            llm += lines
    if not llm:
        raise SystemExit(f"error: the server wrote no step records to {profile}: its repository was rendered before "
                         "the step profile existed; re-render it (python builders/build.py CONFIG --only triton_repo "
                         "--force)")
    sv = decode_steps(llm)

    def parts(steps: list[dict[str, Any]]) -> dict[str, float | None]:
        names = sorted({k for s in steps for k in s["parts_ms"]})
        return {k: _median([s["parts_ms"].get(k, 0.0) for s in steps]) for k in names}

    client = [1e3 * (r["end"] - r["start"]) / max(r["responses"], 1) for s in srv for r in s["records"]
              if r["status"] == "OK"]
    return {
        "concurrency": c, "decode_steps": {"in_process": len(ip), "served": len(sv)},
        "in_process": {"step_ms": _median([s["step_ms"] for s in ip]), "parts_ms": parts(ip),
                       "tokens_per_s": [r["tokens_per_s"] for r in inproc]},
        "served": {"step_ms": _median([s["step_ms"] for s in sv]), "send_ms": _median([s["send_ms"] for s in sv]),
                   "join_ms": _median([s["join_ms"] for s in sv]), "finish_ms": _median([s["finish_ms"] for s in sv]),
                   "parts_ms": parts(sv), "preprocessing_ms_per_call": _median(pre),
                   "postprocessing_ms_per_call": _median(post), "postprocessing_calls": len(post),
                   "client_ms_per_response": _median(client),
                   "tokens_per_s": [r["tokens_per_s"] for r in srv]},
    }


def table(doc: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    ip, sv = doc["in_process"], doc["served"]
    rows = [("decoding step (Session.step)", f(ip["step_ms"]), f(sv["step_ms"]))]
    rows += [(f"  {k}", f(ip["parts_ms"].get(k)), f(sv["parts_ms"].get(k)))
             for k in sorted(set(ip["parts_ms"]) | set(sv["parts_ms"]))]
    rows += [("  responses sent from the step (send)", "-", f(sv["send_ms"])),
             ("batcher before the step (join)", "-", f(sv["join_ms"])),
             ("batcher after the step (finish)", "-", f(sv["finish_ms"])),
             ("postprocessing per call", "-", f(sv["postprocessing_ms_per_call"])),
             ("preprocessing per call", "-", f(sv["preprocessing_ms_per_call"])),
             ("client: request wall time / responses", "-", f(sv["client_ms_per_response"])),
             ("output tokens/s per round", " / ".join(f"{x:.1f}" for x in ip["tokens_per_s"]),
              " / ".join(f"{x:.1f}" for x in sv["tokens_per_s"]))]
    out = [f"| per decoding step at concurrency {doc['concurrency']} (ms, median) | in process | served |",
           "|---|---|---|"]
    return "\n".join(out + [f"| {a} | {b} | {c} |" for a, b, c in rows])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from clients.prompts import load_prompts
    from engines.api import ReferenceEngine
    from triton_repo.launch import TritonServer, free_port
    from triton_repo.models.step_profile import ENV

    torch.set_num_threads(args.threads)
    repo = args.build / "triton_repo"
    profile = args.out / "profile"
    if profile.exists():
        for f in profile.glob("*.jsonl"):
            f.unlink()
    os.environ[ENV] = str(profile.resolve())  # the server's python models inherit it
    prompts = load_prompts(args.prompts)
    engine = ReferenceEngine.from_build(args.build, device="cpu")
    inproc, srv = [], []
    server = TritonServer(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                          log_path=args.out / "tritonserver.log")
    args.out.mkdir(parents=True, exist_ok=True)
    with server:
        for k in range(args.rounds):
            inproc.append(in_process(engine, prompts, args))
            srv.append(served(server.grpc_url, repo, args.out / "served" / f"round-{k + 1}", args))
    doc = summarize(inproc, srv, profile, args.concurrency[0])
    (args.out / "served_profile.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
