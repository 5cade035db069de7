"""NVIDIA Dynamo 1.6.1 (the real frontend, router and runtime, scripts/setup_dynamo.sh) serving the current line's
SmolLM2 + EAGLE-3 build with the reference engine as the worker (`eagle-dynamo serve`), inside a loopback-only
network namespace (testkit/dynamo.py). One build; one deployment of two aggregated workers behind the KV-aware
router and one disaggregated prefill/decode pair."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from builders import layout
from builders.build import main as build_main
from testkit import dynamo as D

pytestmark = [pytest.mark.server, pytest.mark.skipif(D.unavailable() is not None, reason=str(D.unavailable()))]
REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "smollm2-eagle3-current.yaml"
MODEL = "smollm2-eagle3-current"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]
QUESTIONS = ["What is the capital of France?", "Name a primary color."]
N = 16
SETS = ["engine.device=cpu", "engine.max_seq_len=512", "engine.max_input_len=256"]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dynamo_build") / "build"
    sets = [f"output_dir={out}", *SETS]
    assert build_main([str(CONFIG)] + [a for s in sets for a in ("--set", s)]) == 0
    return out


@pytest.fixture(scope="module")
def hf_greedy(build: Path) -> Any:
    """Hugging Face transformers' greedy continuation of token ids (the oracle)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build / "dynamo" / "model")
    model = AutoModelForCausalLM.from_pretrained(layout.hf_target_dir(build), torch_dtype=torch.float32).eval()

    def run(ids: list[int], n: int = N) -> str:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        return str(tok.decode(out[0, len(ids):], skip_special_tokens=True))

    run.tokenizer = tok  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def agg(build: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    dep = D.Deployment(build, tmp_path_factory.mktemp("dyn_agg"), "--workers", "2", port=8000).wait_ready()
    yield dep
    dep.stop()


def completion(dep: D.Deployment, prompt: str, n: int = N, **extra: Any) -> dict[str, Any]:
    return dep.run(D.post, f"{dep.base}/completions",
                   {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0, **extra})


def metrics(dep: D.Deployment, port: int) -> dict[str, float]:
    """The eagle_* samples of a worker's /metrics."""
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            return str(r.read().decode())

    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in dep.run(get).splitlines()
            if line.startswith("eagle_")}


def test_build_writes_the_dynamo_deployment(build: Path) -> None:
    d = build / "dynamo"
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and p.parent.name != "model") == [
        "deploy-agg.yaml", "deploy-disagg.yaml", "deployment.json", "engine/agg.yaml", "engine/decode.yaml",
        "engine/prefill.yaml", "launch.sh", "manifest.json"]
    assert (d / "model" / "config.json").is_file() and (d / "model" / "tokenizer.json").is_file()
    agg_yaml = yaml.safe_load((d / "engine" / "agg.yaml").read_text())
    model_yaml = yaml.safe_load((build / "triton_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert agg_yaml["speculative_config"]["decoding_type"] == "Eagle3"
    assert {k: v for k, v in agg_yaml.items() if k != "speculative_config"} == {
        k: v for k, v in model_yaml.items() if k not in ("speculative_config", "model", "backend", "triton_config")}
    for role in ("prefill", "decode"):
        doc = yaml.safe_load((d / "engine" / f"{role}.yaml").read_text())
        assert doc["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 256}
        assert doc["disable_overlap_scheduler"] is True
        assert doc["speculative_config"] == agg_yaml["speculative_config"]
    # every key and flag of dynamo/ is cited, nothing required is missing (ledger/dynamo.py)
    from builders.config import load_config
    from ledger import check

    cfg = load_config(CONFIG, [f"output_dir={build}", *SETS])
    emitted = {k: v for k, v in check.build_names(cfg, build).items() if k.startswith("dynamo.")}
    assert set(emitted) == {"dynamo.engine_yaml", "dynamo.frontend.flag", "dynamo.graph", "dynamo.trtllm.flag"}
    assert check.check_emitted(emitted, "1.4", check.build_flags(cfg, build / "checkpoint")) == []


def test_completions_and_chat_equal_hf_greedy(agg: D.Deployment, hf_greedy: Any) -> None:
    tok = hf_greedy.tokenizer
    for p in PROMPTS:
        got = completion(agg, p)
        assert got["choices"][0]["text"] == hf_greedy(tok.encode(p)), p
        assert got["usage"]["completion_tokens"] <= N
    for q in QUESTIONS:
        msgs = [{"role": "user", "content": q}]
        got = agg.run(D.post, f"{agg.base}/chat/completions",
                      {"model": MODEL, "messages": msgs, "max_tokens": N, "temperature": 0})
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert got["choices"][0]["message"]["content"] == hf_greedy(list(ids)), q


def test_streaming_sends_the_same_text_in_steps(agg: D.Deployment, hf_greedy: Any) -> None:
    p = PROMPTS[0]
    events = agg.run(lambda: list(D.stream(f"{agg.base}/completions",
                                           {"model": MODEL, "prompt": p, "max_tokens": N, "temperature": 0})))
    texts = [e["choices"][0].get("text", "") for e in events if e.get("choices")]
    assert "".join(texts) == hf_greedy(hf_greedy.tokenizer.encode(p))
    assert len([t for t in texts if t]) > 1  # streamed, not one final chunk


def test_kv_router_keeps_shared_prefixes_together(agg: D.Deployment) -> None:
    """Requests sharing a long prefix (several KV blocks) go to the worker that served the prefix before."""
    prefixes = [" ".join(["The quick brown fox jumps over the lazy dog."] * 12),
                " ".join(["Lorem ipsum dolor sit amet, consectetur adipiscing elit."] * 6)]
    for prefix in prefixes:
        workers = {agg.worker_of(completion(agg, f"{prefix} Question {k}:", 2)["id"]) for k in range(4)}
        assert len(workers) == 1, (prefix[:20], workers)


def test_client_disconnect_frees_the_slot(agg: D.Deployment) -> None:
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    seen: list[dict[str, Any]] = []

    def first_chunks() -> None:
        for e in D.stream(f"{agg.base}/completions", body, on_event=lambda e: len(seen) < 3):
            seen.append(e)

    agg.run(first_chunks)
    rid = seen[0]["id"]
    worker = agg.worker_of(rid)
    end = time.monotonic() + 60
    while not (line := agg.finished(worker, rid)) and time.monotonic() < end:
        time.sleep(0.2)
    assert line.startswith("cancelled after "), line
    assert int(line.split()[2]) < 400
    # every slot of both workers (engine.max_batch_size 4 each) serves again
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    outs = [agg.submit(D.post, f"{agg.base}/completions", dict(body, prompt=p)) for p in (PROMPTS * 3)[:8]]
    assert all(f.result(timeout=300)["choices"][0]["finish_reason"] for f in outs)


def loadtest(dep: D.Deployment, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`eagle-loadtest --openai-url` inside the deployment's network namespace."""
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    argv = dep.inside(sys.executable, "-m", "clients.loadtest", "--prompts", str(prompts), "--no-progress", *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_loadtest_drives_the_openai_endpoint(agg: D.Deployment, hf_greedy: Any, tmp_path: Path) -> None:
    """The load tester's OpenAI mode: streamed completions at two levels, compared with a second run (the on/off
    comparison's path), and chat completions; answers equal HF greedy, tokens the server's usage count."""
    out, n = tmp_path / "out", 8
    r = loadtest(agg, tmp_path, "--openai-url", agg.base, "--out", str(out), "--concurrency", "1,2", "--requests",
                 "3", "--max-tokens", str(n), "--temperature", "0", "--stream", "--baseline-url", agg.base + "/")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["model"] == MODEL and doc["meta"]["tokenizer"].startswith("server usage")
    tok = hf_greedy.tokenizer
    for d in (out, out / "baseline"):
        levels = json.loads((d / "report.json").read_text())["levels"]
        assert [(lv["level"], lv["requests_ok"], lv["errors"]) for lv in levels] == [(1, 3, {}), (2, 3, {})]
        assert all(lv["ttft_s"]["count"] == 3 and lv["itl_s"] and lv["output_tokens_per_s"] > 0 for lv in levels)
        for rec in map(json.loads, (d / "requests.jsonl").read_text().splitlines()):
            want = hf_greedy(tok.encode(PROMPTS[rec["prompt_index"]]), n)
            assert rec["text"] == want and rec["output_tokens"] == len(tok.encode(want)), rec
    assert [row["level"] for row in json.loads((out / "comparison.json").read_text())["levels"]] == [1, 2]
    assert {p.name for p in out.glob("*.png")} >= {"speculation_on_off.png", "throughput.png"}
    r = loadtest(agg, tmp_path, "--openai-url", agg.base, "--out", str(tmp_path / "chat"), "--chat",
                 "--concurrency", "1", "--requests", "2", "--max-tokens", str(n), "--temperature", "0", "--stream")
    assert r.returncode == 0, r.stdout + r.stderr
    for rec in map(json.loads, (tmp_path / "chat" / "requests.jsonl").read_text().splitlines()):
        msgs = [{"role": "user", "content": PROMPTS[rec["prompt_index"]]}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert rec["text"] == hf_greedy(list(ids), n), rec


@pytest.mark.parametrize(("url", "extra", "says"), [
    ("BASE", ["--model", "nope"], "--model 'nope': BASE serves no such model (it serves: smollm2-eagle3-current)"),
    ("ROOT", [], "GET ROOT/models answered HTTP 404"),  # the frontend, but not its API's base URL
    ("http://127.0.0.1:9/v1", [], "cannot reach the server"),
    ("127.0.0.1:8000/v1", [], "expected the API's base URL, e.g. http://127.0.0.1:8000/v1"),
    ("BASE", ["--repo", "x"], "--repo reads a Triton repository's client.json"),
])
def test_loadtest_refuses_what_it_cannot_drive(agg: D.Deployment, tmp_path: Path, url: str, extra: list[str],
                                               says: str) -> None:
    root = agg.base.removesuffix("/v1")
    url, says = (t.replace("BASE", agg.base).replace("ROOT", root) for t in (url, says))
    r = loadtest(agg, tmp_path, "--openai-url", url, "--out", str(tmp_path / "o"), "--concurrency", "1",
                 "--requests", "1", *extra)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_killed_worker_fails_only_its_own_requests(agg: D.Deployment, hf_greedy: Any) -> None:
    """Runs last on the module's deployment: one of its two workers is killed mid-stream."""
    body = {"model": MODEL, "max_tokens": 96, "temperature": 0, "ignore_eos": True}
    started: list[str] = []

    def long_stream(prompt: str) -> tuple[str, str]:
        """(request id, how it ended: its finish reason, or `broken` when the stream failed)"""
        rid, reason = "", "none"
        try:
            for e in D.stream(f"{agg.base}/completions", dict(body, prompt=prompt)):
                if not rid:
                    rid = e["id"]
                    started.append(rid)
                if e.get("choices") and e["choices"][0].get("finish_reason"):
                    reason = str(e["choices"][0]["finish_reason"])
        except Exception as err:  # the stream broke: this request failed
            reason = f"broken: {type(err).__name__}"
        return rid, reason

    futures: list[Future[Any]] = [agg.submit(long_stream, p) for p in (PROMPTS[0], PROMPTS[2])]
    end = time.monotonic() + 120
    while len(started) < 2 and time.monotonic() < end:
        time.sleep(0.1)
    owners = {agg.worker_of(rid) for rid in started}
    assert len(owners) == 2, f"the two concurrent requests went to {owners} (the router balances load)"
    victim = sorted(owners)[0]
    os.kill(agg.pids()[victim], signal.SIGKILL)
    ended = {agg.worker_of(rid): reason for rid, reason in (f.result(timeout=300) for f in futures)}
    assert ended[victim] != "length", ended  # the killed worker's request failed
    survivor = next(w for w in ended if w != victim)
    assert ended[survivor] == "length", ended  # the other one generated all its tokens
    # new requests are served by the survivor and decode correctly. Until the frontend drops the dead worker's
    # discovery entry, a request it routes there is answered 503 (Dynamo's behaviour; docs/deploy.md): bounded retry
    end = time.monotonic() + 180

    def served(p: str) -> dict[str, Any]:
        while True:
            try:
                return completion(agg, p)
            except urllib.error.HTTPError as e:
                if e.code != 503 or time.monotonic() > end:
                    raise
                time.sleep(1)

    for p in PROMPTS:
        got = served(p)
        assert agg.worker_of(got["id"]) == survivor
        assert got["choices"][0]["text"] == hf_greedy(hf_greedy.tokenizer.encode(p))


def test_disaggregated_equals_aggregated(build: Path, hf_greedy: Any, tmp_path: Path) -> None:
    dep = D.Deployment(build, tmp_path / "logs", "--disaggregated", "--metrics-port", "9100", port=8001).wait_ready()
    try:
        for p in PROMPTS:
            got = completion(dep, p)
            assert got["choices"][0]["text"] == hf_greedy(hf_greedy.tokenizer.encode(p)), p
            rid = got["id"].split("-", 1)[1]
            # the prefill worker generated the first token, the decode worker the answer
            assert dep.finished("prefill-0", got["id"]) == "length after 1 tokens"
            assert dep.finished("decode-1", got["id"]).startswith(("length", "eos")), rid
        assert {p.stem for p in (tmp_path / "logs").glob("*.log")} == {"frontend", "prefill-0", "decode-1"}
        # the speculative counters on each worker's metrics endpoint: the prefill worker generated one token per
        # request (the readiness probe's too), the decode worker the answers
        prefill, decode = (metrics(dep, port) for port in (9100, 9101))
        assert prefill['eagle_requests_total{worker="prefill"}'] == len(PROMPTS) + 1
        assert prefill['eagle_generated_tokens_total{worker="prefill"}'] == len(PROMPTS) + 1
        assert decode['eagle_requests_total{worker="decode"}'] == len(PROMPTS) + 1
        assert decode['eagle_accepted_draft_tokens_total{worker="decode"}'] > 0
    finally:
        lines = dep.stop()
    assert lines[-1] == "stopped"
