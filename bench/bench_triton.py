"""Serving overhead of Triton: the demo build through a real tritonserver (ensemble, gRPC streaming) vs the reference
engine called directly, at concurrency 1, 4 and 8.

    python bench/bench_triton.py [--config configs/demo.yaml] [--max-tokens 32] [--rounds 2]

Both sides run the same greedy requests (same prompts, end_id -1 so each generates exactly max_tokens) and batch
the same way, in flight: one engine session of engine.max_batch_size slots, a new request joins at the next step, a
finished one leaves. Each level has `concurrency` closed-loop clients, each sending its next request when the previous
one finished (Triton: one gRPC stream per client; direct: the same loop driving the session in this process); requests
beyond max_batch_size wait for a free slot on both sides. Reported per level: output tokens/s (all generated tokens
/ wall time) and mean TTFT (request sent -> first token, queueing included), and the overhead ratios direct/Triton
for throughput and Triton/direct for TTFT, all measured in this one run.

Inputs:  --config (default configs/demo.yaml), built if needed
Outputs: the figures on stdout
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

IGNORE_EOS = -1  # end_id no token has: every request generates exactly max_tokens (TRT-LLM benchmarks do the same)
PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about the sea.",
    "List three uses of a paperclip.",
    "What is the capital of France and why is it famous?",
    "Describe a cat to someone who has never seen one.",
    "Give me a recipe for a simple salad.",
    "Summarize the plot of a detective story.",
    "Why do computers use binary numbers?",
]


def direct_level(engine: Any, prompts: list[str], max_tokens: int, concurrency: int) -> dict[str, Any]:
    """`concurrency` closed-loop clients over one in-flight session (engine.max_batch_size slots), as the Triton
    model runs it."""
    from collections import deque

    from engines.api import GenerationRequest, SamplingParams

    tok = engine.tokenizer
    reqs = [
        GenerationRequest(prompt_ids=tok.encode(p, add_special_tokens=True), max_new_tokens=max_tokens,
                          sampling=SamplingParams(), stop_token_ids=[IGNORE_EOS])
        for p in prompts
    ]
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    slot_of: dict[int, int] = {}  # session slot -> request index

    def on_tokens(slot: int, new: list[int]) -> bool:
        first.setdefault(slot_of[slot], time.perf_counter())
        return True

    session = engine.session(on_tokens=on_tokens)
    todo, waiting = deque(range(len(reqs))), deque[int]()

    def send() -> None:  # a client sends its next request
        if todo:
            k = todo.popleft()
            sent[k] = time.perf_counter()
            waiting.append(k)

    tokens, done = 0, 0
    t0 = time.perf_counter()
    for _ in range(concurrency):
        send()
    while done < len(reqs):
        while waiting and session.free:
            k = waiting.popleft()
            slot_of[session.add(reqs[k])] = k
        session.step()
        for slot in session.finished:
            tokens += len(session.pop(slot).output_ids)
            done += 1
            send()
    wall = time.perf_counter() - t0
    ttft = statistics.mean(first[k] - sent[k] for k in sent)
    return {"tokens": tokens, "wall": wall, "tok_s": tokens / wall, "ttft": ttft}


def triton_level(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict[str, Any]:
    import numpy as np
    import tritonclient.grpc as grpc

    work: queue.Queue[str] = queue.Queue()
    for p in prompts:
        work.put(p)
    ttft: list[float] = []
    texts: list[str] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one_stream() -> None:
        client = grpc.InferenceServerClient(url)
        while True:
            try:
                prompt = work.get_nowait()
            except queue.Empty:
                break
            q: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error, q=q: q.put((result, error)))
            ins = []
            for name, arr, dt in (
                ("text_input", np.array([[prompt]], dtype=object), "BYTES"),
                ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
                ("stream", np.array([[True]]), "BOOL"),
                ("end_id", np.array([[IGNORE_EOS]], np.int32), "INT32"),
            ):
                i = grpc.InferInput(name, list(arr.shape), dt)
                i.set_data_from_numpy(arr)
                ins.append(i)
            sent = time.perf_counter()
            client.async_stream_infer("ensemble", ins, enable_empty_final_response=True)
            first, parts = None, []
            while True:
                result, error = q.get(timeout=600)
                if error is not None:
                    raise RuntimeError(error)
                resp = result.get_response()
                if resp.outputs:
                    first = first or time.perf_counter()
                    parts.append(result.as_numpy("text_output").reshape(-1)[0].decode("utf-8", "replace"))
                if resp.parameters["triton_final_response"].bool_param:
                    break
            client.stop_stream()
            with lock:
                # TTFT from the request's send, like the direct side (queueing for a free slot included)
                ttft.append((first or time.perf_counter()) - sent)
                texts.append("".join(parts))
        client.close()

    threads = [threading.Thread(target=one_stream) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall": wall, "ttft": statistics.mean(ttft), "n": len(texts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client stream at each level")
    ap.add_argument("--levels", default="1,4,8")
    args = ap.parse_args()

    from builders.build import main as build_main
    from builders.config import load_config
    from engines.api import ReferenceEngine
    from triton_repo.launch import TritonServer, free_port

    cfg = load_config(args.config)
    if cfg.engine.backend != "reference":
        print(f"error: {args.config} has engine.backend={cfg.engine.backend}; this benchmark needs reference")
        return 2
    build = Path(cfg.output_dir)
    if build_main([args.config]) != 0:  # unchanged stages are skipped
        return 1
    levels = [int(x) for x in args.levels.split(",")]
    prompts_for = {c: [PROMPTS[i % len(PROMPTS)] for i in range(c * args.rounds)] for c in levels}

    engine = ReferenceEngine.from_build(build)
    print("load average (1, 5, 15 min) at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"demo build {build} (device {engine.device}, random head: {engine.random_head}), "
          f"max_tokens={args.max_tokens}, max_batch_size={cfg.engine.max_batch_size}")
    direct_level(engine, PROMPTS[:1], 4, 1)  # warm-up
    direct = {}
    for c in levels:
        direct[c] = direct_level(engine, prompts_for[c], args.max_tokens, c)
        print(f"  direct  concurrency {c}: {direct[c]['tokens']} tokens in {direct[c]['wall']:.1f}s", flush=True)
    del engine

    log = build / "logs" / "bench_triton_server.log"
    with TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                      log_path=log) as srv:
        triton_level(srv.grpc_url, PROMPTS[:1], 4, 1)  # warm-up
        served = {}
        for c in levels:
            served[c] = triton_level(srv.grpc_url, prompts_for[c], args.max_tokens, c)
            print(f"  triton  concurrency {c}: {served[c]['n']} requests in {served[c]['wall']:.1f}s", flush=True)

    print(f"{'conc':>4} {'reqs':>4} {'tokens':>6} | {'direct tok/s':>12} {'triton tok/s':>12} {'ratio':>6} | "
          f"{'direct TTFT s':>13} {'triton TTFT s':>13} {'ratio':>6}")
    for c in levels:
        d, s = direct[c], served[c]
        assert s["n"] == len(prompts_for[c]), f"only {s['n']} of {len(prompts_for[c])} Triton requests finished"
        tok_s = d["tokens"] / s["wall"]  # same greedy requests -> same token count on both sides
        print(f"{c:>4} {len(prompts_for[c]):>4} {d['tokens']:>6} | {d['tok_s']:>12.1f} {tok_s:>12.1f} "
              f"{d['tok_s'] / tok_s:>6.2f} | {d['ttft']:>13.3f} {s['ttft']:>13.3f} {s['ttft'] / d['ttft']:>6.2f}")
    print("ratio = serving overhead: direct/Triton tokens/s, Triton/direct TTFT (1.00 = no overhead)")
    print("load average (1, 5, 15 min) at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
