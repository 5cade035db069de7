"""Production metrics on the real CPU Triton server and a real Prometheus (docs/production-metrics.md): the
speculative counters on /metrics equal the per-request perf outputs summed, per-position acceptance equals the
engine's own counts, the build's baseline is exported next to them, and the drift alert stays quiet for the head the
baseline was measured with and fires for a degraded one (read from Prometheus's /api/v1/alerts)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

from builders.build import main as build_main
from tests.prometheus_server import Prometheus
from testkit.triton_requests import inputs, stream_call
from testkit.triton_servers import STOP_TIMEOUT_S, metric, server_on
from triton_repo.launch import TritonServer
from triton_repo.models.spec_metrics import BASELINE_FILE

pytestmark = pytest.mark.server
PROMPTS = ["the quick brown fox jumps", "hello world how are you", "a b c d e f g", "one two three four five",
           "tell me a story about a cat", "the weather today is", "numbers and letters mix", "once upon a time"]
MAX_TOKENS = 16
WINDOW_S, FOR_S = 8, 2
# The matching head's prompts run at tau 1.25-2.29 (baseline 1.72), the degraded head's at 1.00-1.07: a drop of 35%
# (threshold 1.12) keeps even a window holding only the matching head's worst prompt quiet.
DROP = 0.35


def _degrade(head: Path, out: Path) -> Path:
    """The head with its fc replaced by noise: it drafts almost nothing the target accepts."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(head, out)
    t = load_file(str(out / "model.safetensors"))
    t["fc.weight"] = torch.randn(t["fc.weight"].shape, generator=torch.Generator().manual_seed(3))
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _build(root: Path, name: str, target: Path, head: Path, prompts: Path) -> Path:
    cfg = root / f"{name}.yaml"
    cfg.write_text(
        f"name: {name}\ntrtllm_version: '1.1'\noutput_dir: {root / name}\n"
        f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle, model: {head}}}\n"
        "tree: {choices: topk-2-3}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 200}\n"
        f"monitoring: {{calibration_prompts: {prompts}, calibration_max_new_tokens: {MAX_TOKENS}, "
        f"window: {WINDOW_S}s, alert_for: {FOR_S}s, tau_drop_fraction: {DROP}}}\n"
    )
    assert build_main([str(cfg)]) == 0
    return root / name / "triton_repo"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory, mimic_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """(matching, degraded): the degraded repository serves a noisy head with the matching build's baseline, as a
    deployment whose head was swapped for a worse one after the build measured its baseline."""
    root = tmp_path_factory.mktemp("prod_metrics")
    prompts = root / "calibration.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    target, head = mimic_pair
    good = _build(root, "good", target, head, prompts)
    bad = _build(root, "bad", target, _degrade(head, root / "noisy_head"), prompts)
    shutil.copyfile(good / BASELINE_FILE, bad / BASELINE_FILE)
    return good, bad


@pytest.fixture(scope="module")
def servers(repos: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TritonServer]]:
    log = tmp_path_factory.mktemp("prod_metrics_logs")
    started: list[TritonServer] = []
    try:
        for i, repo in enumerate(repos):
            started.append(server_on(repo, log / f"tritonserver{i}.log").start(timeout_s=240))
        yield started
    finally:
        for s in started:
            s.stop(timeout_s=STOP_TIMEOUT_S)


def scrape(server: TritonServer) -> dict[str, float]:
    """`name{labels}` -> value of every eagle_llm_* sample."""
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("eagle_llm_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _one(server: TritonServer, prompt: str) -> dict[str, Any]:
    c = tritonclient_grpc.InferenceServerClient(server.grpc_url)
    try:
        [resp] = stream_call(c, "ensemble", inputs(prompt, MAX_TOKENS, return_perf_metrics=(True, "BOOL")))
    finally:
        c.close()
    return resp


def _labels(model: str = "tensorrt_llm", **extra: str) -> str:
    lab = {"backend": "reference", "model": model, "version": "1", **extra}
    return ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))


def test_counters_equal_the_perf_outputs_summed_and_positions_the_engines_counts(
    servers: list[TritonServer], repos: tuple[Path, Path]
) -> None:
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    srv = servers[0]
    before = scrape(srv)
    resps = [_one(srv, p) for p in PROMPTS]
    after = scrape(srv)

    def delta(name: str, **labels: str) -> float:
        key = f"{name}{{{_labels(**labels)}}}"
        return after[key] - before.get(key, 0.0)

    accepted = sum(int(r["total_accepted_draft_tokens"].reshape(-1)[0]) for r in resps)
    drafted = sum(int(r["total_draft_tokens"].reshape(-1)[0]) for r in resps)
    assert delta("eagle_llm_accepted_draft_tokens_total") == accepted > 0
    assert delta("eagle_llm_draft_tokens_total") == drafted > 0
    # the engine run alone on the same prompts (greedy: the same steps): forwards and per-position counts
    eng = ReferenceEngine.from_build(repos[0].parent)
    tok = eng.tokenizer
    reqs = [GenerationRequest(tok.encode(p, add_special_tokens=True), MAX_TOKENS, SamplingParams(), [tok.eos_token_id])
            for p in PROMPTS]
    results = [r for i in range(0, len(reqs), 4) for r in eng.generate(reqs[i:i + 4])]
    agg = ReferenceEngine.aggregate(results)
    assert agg.accepted_draft_tokens == accepted
    assert delta("eagle_llm_target_forwards_total") == agg.target_forwards
    depth = 3
    got_acc = [delta("eagle_llm_position_accepted_total", position=str(p)) for p in range(1, depth + 1)]
    got_att = [delta("eagle_llm_position_attempts_total", position=str(p)) for p in range(1, depth + 1)]
    assert got_acc == agg.acceptance_by_depth and sum(got_acc) == accepted
    assert got_att == [agg.target_forwards, *agg.acceptance_by_depth[:-1]]
    assert after[f"eagle_llm_speculation_enabled{{{_labels()}}}"] == 1
    # the build's baseline, measured on the same prompts: the gauges carry the file's values
    base = json.loads((repos[0] / BASELINE_FILE).read_text())
    assert base["tau"] == pytest.approx(1 + accepted / agg.target_forwards)
    assert after[f"eagle_llm_baseline_tau{{{_labels()}}}"] == pytest.approx(base["tau"])
    for p in range(1, depth + 1):
        key = f"eagle_llm_baseline_position_acceptance_ratio{{{_labels(position=str(p))}}}"
        assert after[key] == pytest.approx(base["position_acceptance"][p - 1])
        assert base["position_acceptance"][p - 1] == pytest.approx(got_acc[p - 1] / got_att[p - 1])


class Traffic:
    """Two clients cycling through the prompts until stopped."""

    def __init__(self, server: TritonServer) -> None:
        self.stop, self.errors = threading.Event(), []
        self.threads = [threading.Thread(target=self._run, args=(server, i), daemon=True) for i in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, server: TritonServer, k: int) -> None:
        i = k
        while not self.stop.is_set():
            try:
                _one(server, PROMPTS[i % len(PROMPTS)])
            except Exception as e:  # reported by close()
                self.errors.append(e)
                return
            i += 2

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors


def _acceptance_alerts(prom: Prometheus, instance: str) -> list[dict[str, Any]]:
    names = ("EagleTauBelowBaseline", "EaglePositionAcceptanceCollapsed", "EagleSpeculationOff")
    return [a for a in prom.alerts() if a["labels"].get("instance") == instance and a["labels"]["alertname"] in names]


def test_drift_alert_quiet_for_the_matching_head_and_fires_for_a_degraded_one(
    servers: list[TritonServer], repos: tuple[Path, Path], tmp_path: Path
) -> None:
    good, bad = (f"127.0.0.1:{s.metrics_port}" for s in servers)
    prom = Prometheus(tmp_path, [good, bad], repos[0] / "prometheus-rules.yml").start()
    try:
        traffic = Traffic(servers[0])
        try:  # a window and the alerts' `for` with live tau from the matching head: nothing pending or firing
            deadline = time.monotonic() + WINDOW_S + 3 * FOR_S + 4
            seen_tau = []
            while time.monotonic() < deadline:
                assert _acceptance_alerts(prom, good) == []
                seen_tau += [float(r["value"][1]) for r in prom.query(f'eagle:llm_tau:window{{instance="{good}"}}')]
                time.sleep(1)
        finally:
            traffic.close()
        baseline = json.loads((repos[0] / BASELINE_FILE).read_text())["tau"]
        assert seen_tau and min(seen_tau) > (1 - DROP) * baseline > 1.1, (seen_tau, baseline)
        traffic = Traffic(servers[1])
        try:
            deadline, fired = time.monotonic() + 60, []
            while time.monotonic() < deadline and not fired:
                fired = [a for a in _acceptance_alerts(prom, bad)
                         if a["labels"]["alertname"] == "EagleTauBelowBaseline" and a["state"] == "firing"]
                time.sleep(1)
        finally:
            traffic.close()
        assert fired, prom.alerts()
        assert fired[0]["labels"]["model"] == "tensorrt_llm"
        live = float(prom.query(f'eagle:llm_tau:window{{instance="{bad}"}}')[0]["value"][1])
        assert live < (1 - DROP) * baseline
        from builders.monitoring.dashboard import queries

        for expr in queries():  # every dashboard panel is valid PromQL on this Prometheus
            prom.query(expr.replace("$__rate_interval", f"{WINDOW_S}s").replace("$llm_model", "tensorrt_llm"))
        assert prom.query("max by (instance) (eagle_llm_speculation_enabled)")
    finally:
        prom.stop()


@pytest.fixture(scope="module")
def llmapi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path]]:
    """The `llmapi` layout (trtllm_version 1.4) on the reference engine: a tiny target + EAGLE-3 head, chain-3."""
    from testkit import tiny_models as tm

    root = tmp_path_factory.mktemp("prod_metrics_llmapi")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg_h = json.loads((head / "config.json").read_text())
    cfg_h["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg_h))
    cfg = root / "llmapi.yaml"
    cfg.write_text(
        f"name: llmapi-metrics\ntrtllm_version: '1.4'\noutput_dir: {root / 'build'}\n"
        f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
        "tree: {choices: chain-3}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n"
    )
    assert build_main([str(cfg)]) == 0
    srv = server_on(root / "build" / "triton_repo", root / "tritonserver.log").start(timeout_s=240)
    try:
        yield srv, root / "build"
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def test_llmapi_layout_counters_equal_the_perf_outputs_summed(llmapi_server: tuple[TritonServer, Path]) -> None:
    import urllib.request

    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    srv, build = llmapi_server
    before = scrape(srv)
    outs = []
    for p in PROMPTS[:4]:
        body = json.dumps({"text_input": p, "sampling_param_max_tokens": MAX_TOKENS,
                           "sampling_param_return_perf_metrics": True}).encode()
        req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        outs.append(json.loads(urllib.request.urlopen(req, timeout=120).read()))
    after = scrape(srv)

    def delta(name: str, **labels: str) -> float:
        key = f"{name}{{{_labels(**labels)}}}"
        return after[key] - before.get(key, 0.0)

    accepted = sum(int(o["total_accepted_draft_tokens"]) for o in outs)
    assert delta("eagle_llm_accepted_draft_tokens_total") == accepted
    assert delta("eagle_llm_draft_tokens_total") == sum(int(o["total_draft_tokens"]) for o in outs) > 0
    eng = ReferenceEngine.from_build(build)
    tok = eng.tokenizer
    agg = ReferenceEngine.aggregate(eng.generate([
        GenerationRequest(tok.encode(p, add_special_tokens=True), MAX_TOKENS, SamplingParams(), [tok.eos_token_id])
        for p in PROMPTS[:4]]))
    assert agg.accepted_draft_tokens == accepted
    assert delta("eagle_llm_target_forwards_total") == agg.target_forwards > 0
    got = [delta("eagle_llm_position_accepted_total", position=str(p)) for p in (1, 2, 3)]
    assert got == agg.acceptance_by_depth
    assert [delta("eagle_llm_position_attempts_total", position=str(p)) for p in (1, 2, 3)] == [
        agg.target_forwards, *agg.acceptance_by_depth[:-1]]
    # The gauge drops when the request's slot is freed, just after its final response went out: poll briefly.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") > 0:
        time.sleep(0.05)
    assert metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") == 0
    assert not any(k.startswith("eagle_llm_baseline_") for k in after)  # no calibration prompts: no baseline


def test_llmapi_layout_in_flight_gauge_moves_where_tritons_pending_count_does_not(
    llmapi_server: tuple[TritonServer, Path]
) -> None:
    """The decoupled llmapi model returns from execute() at once: Triton's pending count stays 0 with requests
    running, ours counts them (what the autoscaler scales on), and drops back to 0 when they end."""
    import urllib.request


    srv, _build = llmapi_server
    n, threads = 3, []

    def one(i: int) -> None:
        body = json.dumps({"text_input": PROMPTS[i], "sampling_param_max_tokens": 100}).encode()
        req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()

    for i in range(n):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    seen, pending = 0.0, []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and seen < n:
        seen = metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm")
        time.sleep(0.05)
    for _ in range(5):  # all three running (100 tokens each): Triton's scheduler holds none of them
        pending.append((metric(srv, "nv_inference_pending_request_count", model="tensorrt_llm"),
                        metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm")))
    for t in threads:
        t.join(timeout=120)
    assert seen == n
    assert any(p == 0 and f == n for p, f in pending), pending
    deadline = time.monotonic() + 30  # the gauge drops after the response is sent: poll, as a scraper would
    while metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm") == 0


def test_llmapi_bridge_exports_upstreams_iteration_stats_and_in_flight(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine.backend pytorch, llmapi layout: the rendered bridge over a stand-in of upstream's model (installed by
    serve's own copy step) counts the LLM API's iteration statistics and upstream's in-flight count."""
    import urllib.request

    from testkit import tiny_models as tm
    from tests.deploy_files import serve

    root = tmp_path_factory.mktemp("prod_metrics_bridge")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg_h = json.loads((head / "config.json").read_text())
    cfg_h["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg_h))
    cfg_file = root / "pt.yaml"
    cfg_file.write_text(f"name: bridge\ntrtllm_version: '1.4'\noutput_dir: {root / 'build'}\n"
                        f"target: {{model: {target}, dtype: float16}}\ndraft: {{type: eagle3, model: {head}}}\n"
                        "tree: {choices: chain-3}\n"
                        "engine: {backend: pytorch, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n")
    assert build_main([str(cfg_file)]) == 0
    from builders.config import load_config

    repo = root / "build" / "triton_repo"
    assert "enable_iter_perf_stats: true" in (repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    monkeypatch.setenv(serve.UPSTREAM_LLMAPI_ENV, str(Path(__file__).parent / "fixtures" / "llmapi_upstream_standin"))
    serve.install_upstream_llmapi_model(load_config(cfg_file), repo)
    srv = server_on(repo, root / "tritonserver.log").start(timeout_s=240)
    try:
        prompts, threads = ["one two three", "four five", "six seven eight nine"], []

        def one(p: str) -> None:
            body = json.dumps({"text_input": p}).encode()
            req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()

        for p in prompts:
            threads.append(threading.Thread(target=one, args=(p,)))
            threads[-1].start()
        seen, deadline = 0.0, time.monotonic() + 30
        while time.monotonic() < deadline and seen == 0:  # the bridge polls every second; requests take 2.5 s
            seen = metric(srv, "eagle_llm_requests_in_flight", model="tensorrt_llm", backend="pytorch")
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=60)
        words = sum(len(p.split()) for p in prompts)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and metric(srv, "eagle_llm_accepted_draft_tokens_total") < words:
            time.sleep(0.2)
        assert seen > 0
        assert metric(srv, "eagle_llm_accepted_draft_tokens_total", backend="pytorch") == words
        assert metric(srv, "eagle_llm_draft_tokens_total", backend="pytorch") == 3 * words
        assert metric(srv, "eagle_llm_target_forwards_total", backend="pytorch") == words
        assert metric(srv, "eagle_llm_speculation_enabled", backend="pytorch") == 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and metric(srv, "eagle_llm_requests_in_flight") > 0:
            time.sleep(0.2)
        assert metric(srv, "eagle_llm_requests_in_flight", backend="pytorch") == 0
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
