"""engine.backend tensorrt: the rendered `tensorrt_llm` model carries what the C++ tensorrtllm backend reads
(triton_backend/inflight_batcher_llm/src), and, since engine-flow EAGLE accepts drafts greedily, the preprocessing
model refuses a sampling request with INVALID_ARGUMENT and the reason. The C++ backend cannot run here, so a real
tritonserver serves the rendered preprocessing model alone (the ensemble and the BLS reach the same check through
it: their temperature / top_k / top_p inputs map to its TEMPERATURE / RUNTIME_TOP_K / RUNTIME_TOP_P).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from builders.build import main as build_main
from builders.config import load_config
from tests.engine_cases import write_build_yaml
from builders.triton import render
from triton_repo.launch import TritonServer, free_port


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> tuple[Path, Path]:
    """(build dir, rendered repository) of an engine-flow build (trtllm-build cannot run here: checkpoint stage
    + the repository the triton stage renders)."""
    root = tmp_path_factory.mktemp("cpp_model")
    f = write_build_yaml(root / "trt.yaml", output_dir=root / "build", target=tiny_target, head=eagle_head,
                         draft="eagle", backend="tensorrt", tree="topk-2-2", name="cpp-model",
                         engine={"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128})
    assert build_main([str(f), "--only", "checkpoint"]) == 0
    render.render(load_config(f), root / "build", root / "repo_full")
    return root / "build", root / "repo_full"


def _parse(repo: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), mc.ModelConfig())


def test_tensorrt_llm_model_matches_the_cpp_backend(rendered: tuple[Path, Path]) -> None:
    """The guided-decoding parameters it reads unconditionally, [1] inputs reshaped to [] and ragged ids for
    splitBatchInputsTensors, every perf output it writes declared, and no parameter it does not read."""
    build, repo = rendered
    llm = _parse(repo, "tensorrt_llm")
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert (params["guided_decoding_backend"], params["xgrammar_tokenizer_info_path"]) == ("", "")
    # relative to the repository, so the build can move (builders/triton/render.py REPOSITORY_RELATIVE)
    assert (repo / params["tokenizer_dir"]).resolve() == (build / "checkpoint" / "tokenizer").resolve()
    assert "FORCE_CPU_ONLY_INPUT_TENSORS" not in params  # a python-backend parameter; the C++ backend never reads it
    for i in llm.input:
        assert i.HasField("reshape") == (list(i.dims) == [1]), i.name
        assert list(i.reshape.shape) == []
        assert i.allow_ragged_batch == (i.name in ("input_ids", "stop_words_list")), i.name
    outputs = {o.name: mc.DataType.Name(o.data_type) for o in llm.output}
    assert {k: outputs[k] for k in ("arrival_time_ns", "kv_cache_alloc_new_blocks", "acceptance_rate")} == {
        "arrival_time_ns": "TYPE_INT64", "kv_cache_alloc_new_blocks": "TYPE_INT32", "acceptance_rate": "TYPE_FP32"}
    assert len(outputs) == 12
    assert _parse(repo, "preprocessing").parameters["greedy_only"].string_value == "true"
    desc = json.loads((repo / "client.json").read_text())
    assert desc["perf_semantics"].startswith("TensorRT-LLM's C++ runtime") and "steps x depth" in desc["perf_semantics"]


@pytest.fixture(scope="module")
def client(rendered: tuple[Path, Path]) -> Any:
    full = rendered[1]
    only = full.parent / "repo"
    shutil.copytree(full / "preprocessing", only / "preprocessing")
    srv = TritonServer(only, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=full.parent / "tritonserver.log", drain_s=30)  # a clean unload on a loaded machine
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
    spec = {
        "TEMPERATURE": (np.float32, "FP32"),
        "RUNTIME_TOP_K": (np.int32, "INT32"),
        "RUNTIME_TOP_P": (np.float32, "FP32"),
    }
    return ins + [tensor(k, v, *spec[k]) for k, v in sampling.items()]


@pytest.mark.server
def test_greedy_requests_pass(client: Any) -> None:
    for sampling in ({}, {"TEMPERATURE": 0.0}, {"RUNTIME_TOP_K": 1, "TEMPERATURE": 0.7},
                     {"TEMPERATURE": 0.7, "RUNTIME_TOP_K": 0, "RUNTIME_TOP_P": 0.0}):
        out = client.infer("preprocessing", _inputs(**sampling))
        assert out.as_numpy("INPUT_ID").shape[0] == 1 and out.as_numpy("REQUEST_INPUT_LEN")[0, 0] > 0, sampling


@pytest.mark.server
@pytest.mark.parametrize(
    "sampling", [{"RUNTIME_TOP_K": 40}, {"RUNTIME_TOP_P": 0.9}, {"TEMPERATURE": 0.7, "RUNTIME_TOP_K": 5}]
)
def test_sampling_requests_are_refused_with_the_reason(client: Any, sampling: dict[str, float]) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.infer("preprocessing", _inputs(**sampling))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "ask for sampling, but this model serves an engine-flow EAGLE engine (engine.backend tensorrt), which " \
           "accepts draft tokens greedily" in e.value.message()
