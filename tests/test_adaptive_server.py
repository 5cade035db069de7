"""The adaptive loop on the real CPU Triton server (docs/adaptive.md): capture through the ensemble and the BLS model
with the opt-out honoured, `adaptive/refresh.py` on the captured store, `--publish` while requests are in flight (none
fails, outputs unchanged, live acceptance and the baseline labelled by version), `--rollback` in one command; and a
published version of the llmapi layout (model.yaml naming the new speculative model directory) served by the
reference mirror."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

from tests.test_adaptive import mimic3_build  # noqa: F401 (the module fixture)
from testkit.triton_requests import inputs, stream_call
from testkit.triton_servers import STOP_TIMEOUT_S, metric
from triton_repo.launch import TritonServer, free_port
from triton_repo.models import capture as C

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parent.parent
KEY = "adaptive-test-key"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "one", "two", "three"]
TEXTS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6)) + f" {i}" for i in range(24)]


@pytest.fixture(scope="module")
def server(mimic3_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # noqa: F811
    log = tmp_path_factory.mktemp("adaptive_logs") / "tritonserver.log"
    srv = TritonServer(mimic3_build / "triton_repo", grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, admin_key=KEY, explicit=True).start(timeout_s=240)
    try:
        yield srv
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def ask(srv: TritonServer, text: str, model: str = "ensemble", capture: bool = True) -> str:
    c = tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    try:
        out = stream_call(c, model, inputs(text, 12), parameters=None if capture else {C.OPT_OUT: False})
    finally:
        c.close()
    return "".join(o["text_output"].reshape(-1)[0].decode() for o in out)


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_ADMIN_KEY": KEY, "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "adaptive/refresh.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)


class InFlight:
    """Two clients streaming requests (not captured) until closed; every failure kept."""

    def __init__(self, srv: TritonServer) -> None:
        self.stop, self.done, self.errors = threading.Event(), [0, 0], []  # type: ignore[var-annotated]
        self.threads = [threading.Thread(target=self._run, args=(srv, k)) for k in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, srv: TritonServer, k: int) -> None:
        i = k
        while not self.stop.is_set():
            try:
                ask(srv, TEXTS[i % len(TEXTS)], capture=False)
                self.done[k] += 1
            except Exception as e:  # counted
                self.errors.append(repr(e))
            i += 2

    def close(self) -> tuple[int, list[str]]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)
        return sum(self.done), self.errors


def test_capture_refresh_publish_rollback_with_requests_in_flight(
    server: TritonServer, mimic3_build: Path  # noqa: F811 (the module fixture)
) -> None:
    build, store = mimic3_build, mimic3_build / "capture"
    C.purge(store)
    before = [ask(server, t, capture=(i % 4 != 3)) for i, t in enumerate(TEXTS)]  # every 4th opts out
    ask(server, TEXTS[0], model="tensorrt_llm_bls", capture=False)  # the BLS forwards the opt-out
    ask(server, TEXTS[1], model="tensorrt_llm_bls")
    deadline = time.monotonic() + 30
    while metric(server, "eagle_llm_capture_records_total") < 19 and time.monotonic() < deadline:
        time.sleep(0.2)  # segments seal after segment_seconds
    records = list(C.read_records(store))
    assert len(records) == 19 and metric(server, "eagle_llm_capture_dropped_total") == 0
    from engines.api import load_tokenizer

    tok = load_tokenizer(build / "checkpoint" / "tokenizer")
    captured = {tuple(r["prompt_ids"]) for r in records}
    assert tuple(tok(TEXTS[3])["input_ids"]) not in captured and tuple(tok(TEXTS[0])["input_ids"]) in captured
    assert all(r["model_version"] == "1" and r["sampling"]["temperature"] == 0.0 and r["acceptance"]["target_forwards"]
               for r in records)

    p = refresh("--build", str(build))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    run = sorted((build / "refresh").glob("run-*"))[-1]
    report = json.loads((run / "report.json").read_text())
    assert report["lossless"] and report["publishable"] and report["published"] is None
    assert (run / "head" / "model.safetensors").is_file() and (run / "head" / "recipe.yaml").is_file()
    for record in (run / "report.json", run / "head" / "recipe.yaml"):  # relative to the build or the checkout
        assert str(build) not in record.read_text(), record
    assert report["candidate"] == f"refresh/{run.name}/head" and report["build"] == "."
    from adaptive.dataset import prompt_groups, read_jsonl

    train, held = read_jsonl(run / "train.jsonl"), read_jsonl(run / "held_out.jsonl")
    assert len(train) == report["sizes"]["captured_train"] and len(held) == report["sizes"]["held_out"]
    assert 2 <= len(train) + len(held) <= 19  # near-duplicate prompts are one group, capped in training
    for g in prompt_groups(train + held):  # split by content: no prompt group on both sides
        assert all(c in train for c in g) or all(c in held for c in g)
    assert len(report["gate"]["head_digest"]) == 64 and report["gate"]["reference"]["prompts"] == 8
    for f in [run, run / "work", *run.rglob("*")]:  # captured prompts stay private to the server's user
        assert f.stat().st_mode & 0o077 == 0, (f, oct(f.stat().st_mode))

    flight = InFlight(server)
    time.sleep(1)
    p = refresh("--build", str(build), "--publish", str(run), "--server", server.http_url)
    time.sleep(1)
    done, errors = flight.close()
    assert p.returncode == 0 and "version 2 serving" in p.stdout, p.stdout + p.stderr
    assert errors == [] and done > 0
    assert (build / "triton_repo" / "tensorrt_llm" / "1").is_dir()  # the old version stays
    assert [ask(server, t, capture=False) for t in TEXTS] == before  # greedy: lossless on the new head too
    tau = json.loads((run / "report.json").read_text())["tau_after"]
    assert metric(server, "eagle_llm_baseline_tau", version="2") == pytest.approx(tau)
    assert metric(server, "eagle_llm_target_forwards_total", version="2") > 0

    flight = InFlight(server)
    time.sleep(1)
    p = refresh("--build", str(build), "--rollback", "--server", server.http_url)
    time.sleep(1)
    done, errors = flight.close()
    assert p.returncode == 0 and "serving version 1" in p.stdout, p.stdout + p.stderr
    assert errors == [] and done > 0
    assert not (build / "triton_repo" / "tensorrt_llm" / "2").exists()
    assert list((build / "refresh" / "retired").glob("2-*"))
    history = json.loads((build / "refresh" / "published.json").read_text())
    assert [h["action"] for h in history] == ["publish", "rollback"]
    p = refresh("--build", str(build), "--purge-capture")
    assert p.returncode == 0 and not list(C.read_records(store)), p.stderr
    assert not [f for f in (build / "refresh").rglob("*") if f.name in ("train.jsonl", "held_out.jsonl",
                                                                          "reference.jsonl", "work")]
    assert (run / "head" / "model.safetensors").is_file()  # the candidate holds no prompt: it stays


def test_llmapi_layout_serves_a_published_version(tmp_path: Path) -> None:
    """llmapi layout: version 2's model.yaml names its own speculative model directory and the mirror serves that
    head; a model.yaml naming another head is refused at load."""
    import yaml

    from adaptive import publish as P
    from builders.build import main as build_main
    from testkit import tiny_models as tm

    target, head = tm.make_llmapi_pair(tmp_path)
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"name: l\ntrtllm_version: '1.4'\noutput_dir: {tmp_path / 'build'}\n"
                   f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-3}\n"
                   "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n"
                   "capture: {enabled: true, segment_records: 1}\n")
    assert build_main([str(cfg)]) == 0
    build = tmp_path / "build"
    run = build / "refresh" / "run-x"
    (run / "head").parent.mkdir(parents=True)
    import shutil

    shutil.copytree(head, run / "head")
    gate = {"candidate": {"tau": 1.5, "position_acceptance": [0.5, 0.0, 0.0], "target_forwards": 1,
                          "accepted_draft_tokens": 0, "draft_tokens": 3}, "requests": 1}
    assert P.install(build, "tensorrt_llm", run, gate) == 2
    v2 = build / "triton_repo" / "tensorrt_llm" / "2"
    spec = yaml.safe_load((v2 / "model.yaml").read_text())["speculative_config"]
    key = "speculative_model_dir" if "speculative_model_dir" in spec else "speculative_model"  # per version
    assert spec[key] == "./tensorrt_llm/2/draft_head" and (v2 / "draft_head" / "config.json").is_file()
    assert {p.name for p in v2.iterdir()} >= {"model.py", "eagle_bootstrap.py", "model.yaml", "draft_head",
                                              "acceptance_baseline.json"}
    srv = TritonServer(build / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=tmp_path / "srv.log", admin_key=KEY, explicit=True).start(timeout_s=240)
    try:
        import urllib.request

        body = json.dumps({"text_input": "hello world", "sampling_param_max_tokens": 8}).encode()
        req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=120).read())["model_version"] == "2"
        deadline = time.monotonic() + 30
        while not list(C.read_records(build / "capture")) and time.monotonic() < deadline:
            time.sleep(0.1)
        [r] = C.read_records(build / "capture")  # the llmapi mirror records too, with this version's number
        assert r["model_version"] == "2" and len(r["output_ids"]) == 8 and r["sampling"]["seed"] is None
        assert metric(srv, "eagle_llm_baseline_tau", version="2") == 1.5
        doc = yaml.safe_load((v2 / "model.yaml").read_text())
        doc["speculative_config"][key] = "./tensorrt_llm/1"
        (v2 / "model.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(P.PublishError, match="refused to load"):
            P.load(srv.http_url, KEY, "tensorrt_llm", 2, timeout=120)
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
    assert "is not this version's head" in (tmp_path / "srv.log").read_text()
