"""The head refresh on the current line (engine.backend pytorch, docs/adaptive.md "On a GPU"): capture is accepted
for the PyTorch-backend config; its reference twin (the same config, engine.backend reference: the reference mirror
of the llmapi model) serves with capture on and writes the store; `refresh.py --build PYTORCH_BUILD --twin TWIN`
recomputes the target's features from the captured tokens, fine-tunes from the head the PyTorch build serves, gates
on the twin's engine and writes its run under the PyTorch build; a publish installs version 2 there with model.yaml's
`speculative_model` naming that version's head (the key TensorRT-LLM 1.4 reads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from builders.build import main as build_main
from testkit import tiny_models as tm
from testkit.triton_servers import STOP_TIMEOUT_S
from triton_repo.launch import TritonServer, free_port
from triton_repo.models import capture as C

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parent.parent
WORDS = ["alpha", "river", "stone", "cloud", "green", "market", "violin", "orbit", "paper", "silver", "engine", "tiger"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "adaptive/refresh.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})


def test_capture_on_the_current_line_trains_a_refresh_through_its_twin(tmp_path: Path) -> None:
    target, head = tm.make_llmapi_pair(tmp_path)
    store = tmp_path / "store"
    base = (f"name: cur\ntrtllm_version: '1.4'\ntarget: {{model: {target}, dtype: float16}}\n"
            f"draft: {{type: eagle3, model: {head}}}\ntree: {{choices: chain-3}}\n"
            f"capture: {{enabled: true, dir: {store}, segment_records: 2, segment_seconds: 1.0}}\n"
            "refresh: {original_share: 0.0, epochs: 1, gate_max_new_tokens: 8, gate_margin: 0.0, "
            "reference_tolerance: 10.0, max_requests: 40}\n")
    cfg = tmp_path / "cur.yaml"
    cfg.write_text(base + f"output_dir: {tmp_path / 'build'}\n"
                   "engine: {backend: pytorch, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n")
    assert build_main([str(cfg)]) == 0  # capture accepted for engine.backend pytorch
    build, twin = tmp_path / "build", tmp_path / "twin"
    assert build_main([str(cfg), "--set", "engine.backend=reference", "--set", "engine.device=cpu",
                       "--set", f"output_dir={twin}"]) == 0
    p = _cli("--build", str(build))
    assert p.returncode == 2 and "give --twin TWIN" in p.stderr, p.stderr
    srv = TritonServer(twin / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=tmp_path / "twin.log").start(timeout_s=240)
    try:
        for i in range(12):
            text = " ".join(WORDS[(i + 5 * j) % len(WORDS)] for j in range(4 + i % 3)) + f" number {i}"
            body = json.dumps({"text_input": text, "sampling_param_max_tokens": 8}).encode()
            req = urllib.request.Request(f"http://{srv.http_url}/v2/models/tensorrt_llm/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=120).read()
        deadline = time.monotonic() + 30
        while len(list(C.read_records(store))) < 12 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)
    assert len(list(C.read_records(store))) == 12

    p = _cli("--build", str(build), "--twin", str(twin), "--run", "r1")
    assert p.returncode in (0, 1), p.stdout[-2000:] + p.stderr[-2000:]  # 1: the gate refused the candidate
    run = build / "refresh" / "r1"
    report = json.loads((run / "report.json").read_text())
    assert report["sizes"]["captured_train"] >= 1 and report["sizes"]["held_out"] >= 1
    assert (build / report["twin"]).resolve() == twin.resolve() and (run / "head" / "model.safetensors").is_file()
    assert report["served_head"].endswith("checkpoint/eagle3")  # the PyTorch build's own head, version 1
    if report["publishable"]:
        p = _cli("--build", str(build), "--publish", str(run))
        assert p.returncode == 0, p.stderr
        v2 = build / "triton_repo" / "tensorrt_llm" / "2"
        spec = yaml.safe_load((v2 / "model.yaml").read_text())["speculative_config"]
        assert spec["speculative_model"] == "./tensorrt_llm/2/draft_head" and "speculative_model_dir" not in spec
    wrong = _cli("--build", str(build), "--twin", str(build), "--run", "r2")
    assert wrong.returncode == 2 and "is not a reference build of this config" in wrong.stderr
