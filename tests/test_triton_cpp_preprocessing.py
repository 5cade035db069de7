"""engine.backend tensorrt: engine-flow EAGLE accepts drafts greedily, so the rendered repository's preprocessing
model refuses a sampling request with INVALID_ARGUMENT and the reason. The C++ tensorrtllm backend cannot run here,
so a real tritonserver serves the rendered preprocessing model alone (the ensemble and the BLS reach the same
check through it: their temperature / top_k / top_p inputs map to its TEMPERATURE / RUNTIME_TOP_K / RUNTIME_TOP_P).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from builders.build import main as build_main  # noqa: E402
from builders.config import load_config  # noqa: E402
from triton_repo import render  # noqa: E402
from triton_repo.launch import TritonServer, free_port  # noqa: E402

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Any:
    root = tmp_path_factory.mktemp("cpp_pre")
    f = root / "trt.yaml"
    f.write_text(
        f"name: cpp-pre\noutput_dir: {root / 'build'}\ntarget: {{model: {tiny_target}, dtype: float16}}\n"
        f"draft: {{type: eagle, model: {eagle_head}}}\ntree: {{choices: topk-2-2}}\n"
        "engine: {backend: tensorrt, max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n"
    )
    assert build_main([str(f), "--only", "checkpoint"]) == 0
    cfg = load_config(f)
    full = root / "repo_full"
    render.render(cfg, root / "build", full)
    only = root / "repo"
    shutil.copytree(full / "preprocessing", only / "preprocessing")
    srv = TritonServer(only, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=root / "tritonserver.log")
    srv.start(timeout_s=240)
    yield tritonclient_grpc.InferenceServerClient(srv.grpc_url)
    assert srv.stop() == 0


def _inputs(**sampling: float) -> list[Any]:
    def tensor(name: str, value: Any, dtype: Any, wire: str) -> Any:
        arr = np.array([[value]], dtype=dtype)
        t = tritonclient_grpc.InferInput(name, list(arr.shape), wire)
        t.set_data_from_numpy(arr)
        return t

    ins = [tensor("QUERY", "The quick brown fox", object, "BYTES"), tensor("REQUEST_OUTPUT_LEN", 8, np.int32, "INT32")]
    spec = {"TEMPERATURE": (np.float32, "FP32"), "RUNTIME_TOP_K": (np.int32, "INT32"), "RUNTIME_TOP_P": (np.float32, "FP32")}
    return ins + [tensor(k, v, *spec[k]) for k, v in sampling.items()]


def test_greedy_requests_pass(client: Any) -> None:
    for sampling in ({}, {"TEMPERATURE": 0.0}, {"RUNTIME_TOP_K": 1, "TEMPERATURE": 0.7},
                     {"TEMPERATURE": 0.7, "RUNTIME_TOP_K": 0, "RUNTIME_TOP_P": 0.0}):
        out = client.infer("preprocessing", _inputs(**sampling))
        assert out.as_numpy("INPUT_ID").shape[0] == 1 and out.as_numpy("REQUEST_INPUT_LEN")[0, 0] > 0, sampling


@pytest.mark.parametrize("sampling", [{"RUNTIME_TOP_K": 40}, {"RUNTIME_TOP_P": 0.9}, {"TEMPERATURE": 0.7, "RUNTIME_TOP_K": 5}])
def test_sampling_requests_are_refused_with_the_reason(client: Any, sampling: dict[str, float]) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.infer("preprocessing", _inputs(**sampling))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "ask for sampling, but this model serves an engine-flow EAGLE engine (engine.backend tensorrt), which " \
           "accepts draft tokens greedily" in e.value.message()
