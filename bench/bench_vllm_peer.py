"""Peer benchmark: our served EAGLE-3 against vLLM for CPU serving the same target and the same head, same prompts.

    scripts/setup_vllm_cpu.sh                      # vLLM for CPU in .venv-vllm (its own environment)
    python bench/bench_vllm_peer.py --build build/smollm2-eagle3-current --out build/vllm-peer \
        [--vllm-python .venv-vllm/bin/python] [--concurrency 1,2,4] [--questions 8] [--max-tokens 64] [--rounds 2]
        [--threads 1] [--vllm-draft-len 3]

Four servers on loopback: the build's Triton repository (ours, EAGLE-3), a copy of it without speculation
(scripts/spec_sweep.py `spec_off_copy`), and vLLM's OpenAI server on the build's target (the Hugging Face directory
the build converted) with and without `--speculative-config {"method": "eagle3", "model": HEAD, ...}`, HEAD being
the build's head exported by `eagle-doctor export --to speculators` (tensors unchanged). Each concurrency level sends
the first --questions MT-bench questions inside the target's chat template, greedy, --max-tokens tokens, to each of the
four in an order rotated every round (a change of load reaches them alike). Output tokens are counted with the
target's tokenizer for all four. Writes OUT/peer.json and prints, per level, the median over rounds of: ours EAGLE-3
/ ours off, vLLM EAGLE-3 / vLLM off, ours off / vLLM off, ours EAGLE-3 / vLLM EAGLE-3, and whether the four answered
every prompt with the same text. Not part of the tests (vLLM is not a dependency of the project).

Inputs:  a finished current-line build with engine.backend reference (llmapi layout); vLLM for CPU in --vllm-python
Outputs: OUT/peer.json, the servers' logs in OUT/
Guide:   docs/benchmarks.md ("vLLM for CPU on the same head")
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

Send = Callable[[str, int], str]  # (prompt text, max tokens) -> answer text
SYSTEMS = ("ours EAGLE-3", "ours off", "vLLM EAGLE-3", "vLLM off")


def vllm_argv(python: str, model: Path, port: int, head: Path | None, draft_len: int, max_len: int,
              dtype: str) -> list[str]:
    """vLLM's OpenAI server on loopback; with `head`, EAGLE-3 drafting `draft_len` tokens (a chain)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "m",
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_len),
            "--max-num-seqs", "4", "--seed", "0"]
    if head is not None:
        spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": draft_len}
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def vllm_env(threads: int) -> dict[str, str]:
    return {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
            "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def wait_http(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}; its log: {log}\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"vLLM did not answer on port {port} within {timeout_s:.0f} s; its log: {log}")


def vllm_send(port: int) -> Send:
    def send(text: str, n: int) -> str:
        body = json.dumps({"model": "m", "prompt": text, "max_tokens": n, "temperature": 0.0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            return str(json.loads(r.read())["choices"][0]["text"])

    return send


def ours_send(url: str, schema: Any) -> Send:
    import threading

    from clients.client import LLMClient

    local = threading.local()

    def send(text: str, n: int) -> str:
        if not hasattr(local, "client"):
            local.client = LLMClient(url, schema=schema, timeout_s=900)
        return local.client.generate(text, n).text

    return send


def level(send: Send, prompts: list[str], n: int, concurrency: int, count: Callable[[str], int]) -> dict[str, Any]:
    """All prompts through `send`, `concurrency` at a time: output tokens/s over the wall time, and the answers."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        texts = list(pool.map(lambda p: send(p, n), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(count(t) for t in texts)
    return {"tokens_per_s": tokens / wall, "tokens": tokens, "seconds": wall, "texts": texts}


RATIOS = {"ours EAGLE-3 / ours off": ("ours EAGLE-3", "ours off"),
          "vLLM EAGLE-3 / vLLM off": ("vLLM EAGLE-3", "vLLM off"),
          "ours off / vLLM off": ("ours off", "vLLM off"),
          "ours EAGLE-3 / vLLM EAGLE-3": ("ours EAGLE-3", "vLLM EAGLE-3")}


def summarize(rounds: list[dict[int, dict[str, dict[str, Any]]]], levels: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for c in levels:
        per = [r[c] for r in rounds]
        row: dict[str, Any] = {}
        for name, (a, b) in RATIOS.items():
            vals = [p[a]["tokens_per_s"] / p[b]["tokens_per_s"] for p in per]
            row[name] = {"rounds": vals, "median": statistics.median(vals)}
        row["tokens_per_s"] = {s: [p[s]["tokens_per_s"] for p in per] for s in SYSTEMS}
        ref = [p["ours off"]["texts"] for p in per]
        row["identical"] = sum(p[s]["texts"][i] == ref[k][i] for k, p in enumerate(per) for s in SYSTEMS
                               for i in range(len(ref[k])))
        row["answers"] = sum(len(r) for r in ref) * len(SYSTEMS)
        out[c] = row
    return out


def print_table(summary: dict[int, dict[str, Any]], load: list[float]) -> None:
    print("\n| concurrency | " + " | ".join(RATIOS) + " | answers identical |")
    print("|---" * (len(RATIOS) + 2) + "|")
    for c, row in summary.items():
        cells = [f"{row[k]['median']:.2f}x ({', '.join(f'{v:.2f}' for v in row[k]['rounds'])})" for k in RATIOS]
        print(f"| {c} | " + " | ".join(cells) + f" | {row['identical']}/{row['answers']} |")
    print(f"load average during the run: {min(load):.1f} to {max(load):.1f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="a finished current-line reference build")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every server")
    ap.add_argument("--vllm-draft-len", type=int, default=None,
                    help="vLLM's num_speculative_tokens (default: the build's max_draft_len)")
    ap.add_argument("--start-timeout", type=float, default=900)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import yaml

    from clients import schema as sch
    from clients.prompts import chat_template
    from core.spec import read_spec
    from scripts.spec_sweep import spec_off_copy
    from sources.data import mtbench_questions
    from triton_repo.launch import TritonServer, free_port
    from transformers import AutoTokenizer

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    build, out = args.build.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = read_spec(build)
    repo = build / "triton_repo"
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]
    draft_len = args.vllm_draft_len or int(options["max_draft_len"])
    hf = Path(str(spec.hf_target_dir))
    head = out / "head-speculators"
    subprocess.run([sys.executable, "-m", "doctor", "export", "--head", str(spec.path(build, str(
        spec.eagle3_head_dir))), "--to", "speculators", "--target", str(hf), str(head)], check=True, cwd=REPO)
    tok = AutoTokenizer.from_pretrained(spec.path(build, spec.tokenizer_dir))
    wrap = chat_template(str(spec.path(build, spec.tokenizer_dir)))
    prompts = [wrap(q.turns[0]) for q in mtbench_questions(args.questions)]

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    levels = [int(c) for c in args.concurrency.split(",")]
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[Any] = []
    try:
        sends: dict[str, Send] = {}
        for name, r in (("ours EAGLE-3", repo), ("ours off", spec_off_copy(repo, out / "triton_repo_spec_off"))):
            srv = TritonServer(r, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                               log_path=out / f"{name.replace(' ', '_')}.log")
            srv.start(timeout_s=args.start_timeout)
            servers.append(srv)
            sends[name] = ours_send(srv.grpc_url, sch.from_repository(r))
        for name, h in (("vLLM EAGLE-3", head), ("vLLM off", None)):
            port, log = free_port(), out / f"{name.replace(' ', '_')}.log"
            argv = vllm_argv(args.vllm_python, hf, port, h, draft_len, spec.max_seq_len, spec.dtype)
            print("$", " ".join(argv))
            with log.open("wb") as f:
                procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=vllm_env(args.threads)))
            wait_http(port, procs[-1], args.start_timeout, log)
            sends[name] = vllm_send(port)
        for s in SYSTEMS:  # warm-up, untimed
            sends[s](prompts[0], 4)
        rounds: list[dict[int, dict[str, dict[str, Any]]]] = []
        load: list[float] = []
        for r in range(args.rounds):
            res: dict[int, dict[str, dict[str, Any]]] = {}
            for c in levels:
                order = SYSTEMS[r % 4:] + SYSTEMS[:r % 4]
                res[c] = {s: level(sends[s], prompts, args.max_tokens, c, count) for s in order}
                load.append(os.getloadavg()[0])
                print(f"round {r + 1} concurrency {c}: " + ", ".join(
                    f"{s} {res[c][s]['tokens_per_s']:.1f} tok/s" for s in SYSTEMS) + f" (load {load[-1]:.1f})")
            rounds.append(res)
            summary = summarize(rounds, levels)  # written after every round: a cut-short run keeps its rounds
            (out / "peer.json").write_text(json.dumps({
                "summary": summary, "rounds": rounds, "load": load, "draft_len_vllm": draft_len,
                "speculative_config": options, "questions": args.questions, "max_tokens": args.max_tokens}, indent=1))
        print_table(summary, load)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        for srv in servers:
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
