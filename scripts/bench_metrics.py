"""Cost of the production metrics: requests/s of the same tiny build served with and without them.

    python scripts/bench_metrics.py [--work DIR] [--seconds 20] [--concurrency 4] [--rounds 2] [--max-tokens 16]

Builds a tiny target + EAGLE-3 head (tests/tiny_models.py) into the `llmapi` layout on the reference engine
(trtllm_version 1.4, engine.backend reference, chain-3), whose model exported no metric before
triton_repo/models/spec_metrics.py existed. "without" serves the same repository with that model's model.py taken
from git at --without-rev (default: the commit before spec_metrics.py was added); "with" serves it as rendered.
Each round starts a fresh tritonserver per variant (ABBA order: load drifts and going first hit both), sends
4 warm-up requests, then runs `concurrency` closed-loop HTTP clients (POST /v2/models/tensorrt_llm/generate, greedy,
max_tokens) for `seconds` while a scraper reads /metrics every second, as Prometheus would. Reported: completed
requests/s per variant and round, and the ratio with/without of the per-variant means.

Inputs:  none (tiny random models)
Outputs: the figures on stdout
Guide:   docs/benchmarks.md ("Cost of the production metrics")
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from triton_repo.launch import TritonServer

PROMPTS = ["the quick brown fox", "hello world how are you", "one two three four", "a story about a cat"]


def default_rev() -> str:
    first = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h", "--", "triton_repo/models/spec_metrics.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not first:
        raise SystemExit("spec_metrics.py has no commit yet: pass --without-rev")
    return f"{first[-1]}^"


def build(work: Path) -> Path:
    from builders.build import main as build_main
    from tests import tiny_models as tm

    target = tm.make_target(work / "target", layers=4)
    head = tm.make_eagle3_head(work / "eagle3", target)
    cfg_h = json.loads((head / "config.json").read_text())
    cfg_h["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg_h))
    cfg = work / "bench.yaml"
    cfg.write_text(
        f"name: bench-metrics\ntrtllm_version: '1.4'\noutput_dir: {work / 'build'}\n"
        f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
        "tree: {choices: chain-3}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n"
    )
    if build_main([str(cfg)]) != 0:
        raise SystemExit("build failed")
    return work / "build" / "triton_repo"


def run_level(srv: TritonServer, seconds: float, concurrency: int, max_tokens: int) -> float:
    url = f"http://{srv.http_url}/v2/models/tensorrt_llm/generate"
    stop, done, errors = threading.Event(), [0] * concurrency, []

    def post(prompt: str) -> None:
        body = json.dumps({"text_input": prompt, "sampling_param_max_tokens": max_tokens}).encode()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            try:
                post(PROMPTS[i % len(PROMPTS)])
            except Exception as e:  # reported below
                errors.append(e)
                return
            done[k] += 1
            i += 1

    def scraper() -> None:
        while not stop.wait(1.0):
            urllib.request.urlopen(srv.metrics_url, timeout=10).read()

    for p in PROMPTS:
        post(p)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    threads.append(threading.Thread(target=scraper))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    n0 = sum(done)
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"request failed: {errors[0]}")
    return n0 / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Inputs:  the demo target and head (built into --work)\n"
               "Outputs: requests/s with and without the production metrics, printed\nGuide:   docs/benchmarks.md")
    ap.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--without-rev", default=None, help="git revision whose llmapi_reference.py has no metrics")
    args = ap.parse_args(argv)
    from tests.triton_servers import with_without_rounds

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_metrics_"))
    rev = args.without_rev or default_rev()
    repo = build(work)
    bare = work / "repo_without"
    shutil.copytree(repo, bare)
    old = subprocess.run(["git", "show", f"{rev}:triton_repo/models/llmapi_reference.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    (bare / "tensorrt_llm" / "1" / "model.py").write_text(old)
    w, wo = with_without_rounds(bare, repo, work, args.rounds,
                                lambda srv: run_level(srv, args.seconds, args.concurrency, args.max_tokens))
    print(f"mean: with {w:.2f} / without {wo:.2f} requests/s = {w / wo:.3f}x "
          f"(concurrency {args.concurrency}, {args.max_tokens} tokens, {args.seconds:.0f} s per run, without = {rev})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
