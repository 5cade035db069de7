"""LLM API options YAML + trtllm-serve argv (engine.backend: pytorch), per TensorRT-LLM version, golden files.

Which keys exist per version is the ledger's (ledger/llmapi.py; tensorrt_llm/llmapi/llm_args.py);
what each version allows is the registry's (core/trtllm_versions.py). tests/test_ledger.py checks every emitted
key against the ledger; here: the values, the version differences and the refusals.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from builders.engine import llmapi, stage
from builders.pipeline import StageError, run_stage
from core import trtllm_versions
from tests.engine_cases import check_golden, make_cfg

E3 = ["engine.backend=pytorch", "draft.type=eagle3", "draft.model=/models/eagle3", "tree.choices=chain-3"]
HEAD_DIR = Path("/builds/golden/checkpoint/eagle3")
L = 32  # Llama-3.1-8B: EAGLE-3 input ids [2, 16, 29] = TensorRT-LLM's default capture [1, 15, 28]
DEFAULT_CAPTURE = llmapi.layers_to_capture([2, 16, 29], num_target_layers=L)
CASES = {
    "1.1_eagle3_chain": ["trtllm_version=1.1"] + E3 + ["tree.choices=chain-3"],
    "1.2_eagle3_chain": ["trtllm_version=1.2"] + E3 + ["tree.choices=chain-3"],
    "1.2_eagle3_static_tree_fp8kv": ["trtllm_version=1.2"] + E3 + ["tree.choices=eagle-default",
                                                                    "quantization.kv_cache=fp8"],
}


def _opts(name: str, capture: list[int] = DEFAULT_CAPTURE) -> dict:
    return llmapi.llm_api_options(make_cfg(*CASES[name]), HEAD_DIR, capture, L)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_llm_api_yaml(name: str) -> None:
    check_golden(f"llm_api_{name}.yaml", llmapi.dump_options(_opts(name)))


def test_yaml_values_render_from_the_config() -> None:
    opts = yaml.safe_load(llmapi.dump_options(_opts("1.2_eagle3_static_tree_fp8kv")))
    spec = opts["speculative_config"]
    assert spec["decoding_type"] == "Eagle" and spec["speculative_model_dir"] == str(HEAD_DIR)
    assert (spec["max_draft_len"], spec["max_total_draft_tokens"]) == (5, 25)  # depth, nodes of eagle-default
    assert spec["eagle_choices"][:4] == [[0], [1], [2], [3]] and len(spec["eagle_choices"]) == 25
    assert spec["eagle3_layers_to_capture"] == [1, 15, 28]
    assert opts["kv_cache_config"]["dtype"] == "fp8"
    assert (opts["max_batch_size"], opts["max_num_tokens"], opts["max_seq_len"]) == (4, 2048, 2048)


def test_1_1_writes_only_fields_it_has() -> None:
    # TensorRT-LLM 1.1's EagleDecodingConfig has no max_total_draft_tokens, and eagle3_layers_to_capture is not
    # proven there: a chain with the default capture layers carries neither.
    spec = _opts("1.1_eagle3_chain")["speculative_config"]
    assert spec == {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": str(HEAD_DIR),
                    "eagle3_one_model": True}
    assert _opts("1.2_eagle3_chain")["speculative_config"]["eagle3_layers_to_capture"] == DEFAULT_CAPTURE


def test_1_1_refuses_capture_layers_it_cannot_express() -> None:
    with pytest.raises(llmapi.LlmApiError, match=r"TensorRT-LLM 1\.1\.0 \(trtllm_version '1\.1'\); set trtllm_version: "
                       r"'1\.2'.*or use a head trained on the default layers"):
        _opts("1.1_eagle3_chain", capture=[0, 15, 28])
    assert _opts("1.2_eagle3_chain", capture=[0, 15, 28])["speculative_config"]["eagle3_layers_to_capture"] == [
        0,
        15,
        28,
    ]


@pytest.mark.parametrize(("ov", "msg"), [
    (["trtllm_version=1.1", "tree.choices=topk-2-2"],
     r"a draft tree \(6 nodes, depth 2\) with engine.backend=pytorch is not supported by TensorRT-LLM 1\.1\.0 "
     r"\(trtllm_version '1\.1'\); set trtllm_version: '1\.2' \(TensorRT-LLM 1\.2\.0\), or use tree.choices: chain-2"),
    (["trtllm_version=1.2", "tree.choices=null", "tree.dynamic={top_k: 2, depth: 3, total_draft_tokens: 6}",
      "engine.max_num_tokens=null"],
     r"tree.dynamic with engine.backend=pytorch is not supported by TensorRT-LLM 1\.2\.0 \(trtllm_version '1\.2'\); "
     r"set trtllm_version: '1\.4' \(TensorRT-LLM 1\.4\.0rc4\), or use tree.choices"),
    (["trtllm_version=1.3"], r"trtllm_version='1\.3' is not supported; use one of '1\.1', '1\.2', '1\.4'"),
    (["trtllm_version=1.2", "quantization.weights=fp8"],
     r"quantization.weights=fp8 with engine.backend=pytorch on TensorRT-LLM 1\.2\.0: this builder writes a quantized "
     r"Hugging Face checkpoint \(ModelOpt's unified export\) for the current line"),
    (["quantization.weights=nvfp4", "engine.backend=tensorrt", "trtllm_version=1.2", "draft.type=eagle",
      "draft.model=/models/eagle"],
     r"quantization.weights=nvfp4 on TensorRT-LLM 1\.2\.0 with engine.backend=tensorrt: NVFP4 is written as "
     r"ModelOpt's Hugging Face checkpoint for the current line only"),
])
def test_refused_before_anything_is_written(ov: list[str], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        make_cfg(*E3, *ov)


def test_eagle1_head_on_pytorch_is_refused() -> None:
    with pytest.raises(ValueError, match="runs EAGLE-3 heads only"):
        make_cfg("engine.backend=pytorch")


def test_a_new_version_is_a_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a version = one registry entry (+ its ledger rows): a version with dynamic trees on the PyTorch
    backend gets the dynamic-tree fields, with no other code change."""
    dyn = dataclasses.replace(trtllm_versions.VERSIONS["1.2"], key="dyn", pytorch_dynamic_tree=True)
    monkeypatch.setitem(trtllm_versions.VERSIONS, "dyn", dyn)
    cfg = make_cfg(*E3, "trtllm_version=dyn", "tree.choices=null", "parallel.tp=2", "target.dtype=bfloat16",
                   "tree.dynamic={top_k: 4, depth: 5, total_draft_tokens: 16}", "engine.max_num_tokens=null")
    opts = llmapi.llm_api_options(cfg, HEAD_DIR, DEFAULT_CAPTURE, L)
    spec = opts["speculative_config"]
    assert (spec["use_dynamic_tree"], spec["dynamic_tree_max_topK"], spec["max_draft_len"],
            spec["max_total_draft_tokens"]) == (True, 4, 5, 16)
    assert "eagle_choices" not in spec
    # derived: max(max_batch_size * (max_draft_len + 1), max_input_len) = max(4 * 17, 1024)
    assert (opts["tensor_parallel_size"], opts["max_num_tokens"]) == (2, max(4 * 17, 1024))
    with pytest.raises(ValueError, match="total_draft_tokens=40 > top_k \\* depth = 20"):
        make_cfg(*E3, "trtllm_version=dyn", "tree.choices=null", "engine.max_num_tokens=null",
                 "tree.dynamic={top_k: 4, depth: 5, total_draft_tokens: 40}")


def test_layers_to_capture_is_output_indexed() -> None:
    # EAGLE fuses the INPUTS of layers (2, L//2, L-3); TRT-LLM captures OUTPUTS (default {1, L//2-1, L-4}).
    assert llmapi.layers_to_capture([2, 16, 29], 32) == [1, 15, 28]
    with pytest.raises(llmapi.LlmApiError, match="ids must lie in 1..31"):
        llmapi.layers_to_capture([0, 16, 29], 32)
    with pytest.raises(llmapi.LlmApiError, match="ids must lie in 1..31"):
        llmapi.layers_to_capture([2, 32], 32)


def test_layer_ids_from_config_or_head() -> None:
    cfg = make_cfg(*E3)
    assert llmapi.resolve_input_layer_ids(cfg, {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}) == [1, 2, 3]
    with pytest.raises(llmapi.LlmApiError, match="set draft.eagle3.layers_to_capture"):
        llmapi.resolve_input_layer_ids(cfg, {})
    cfg2 = make_cfg(*E3, "draft.eagle3.layers_to_capture=[4, 5, 6]")
    assert llmapi.resolve_input_layer_ids(cfg2, {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}) == [4, 5, 6]


def test_layer_ids_inside_an_eagle_config_block() -> None:
    # SpecForge / ModelOpt exports keep them in `eagle_config`
    cfg = make_cfg(*E3)
    assert llmapi.resolve_input_layer_ids(cfg, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 9, 13]}}) == [
        2, 9, 13]
    with pytest.raises(llmapi.LlmApiError, match="disagrees with eagle_config.eagle_aux_hidden_state_layer_ids"):
        llmapi.resolve_input_layer_ids(cfg, {"eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                                             "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 9, 13]}})


def test_golden_serve_argv() -> None:
    argv = llmapi.trtllm_serve_argv(Path("/models/target"), Path("/builds/golden/engine/llm_api_options.yaml"))
    check_golden("trtllm_serve_argv.json", argv)
    assert argv[:2] == ["trtllm-serve", "/models/target"]
    assert argv[argv.index("--extra_llm_api_options") + 1].endswith("llm_api_options.yaml")


def test_pytorch_stage_writes_yaml_and_serve_command(tmp_path: Path, tiny_target: Path) -> None:
    cfg = make_cfg(*E3, "trtllm_version=1.2", f"output_dir={tmp_path}", f"target.model={tiny_target}",
                   "tree.choices=topk-2-2")
    ck = tmp_path / "checkpoint"
    (ck / "eagle3").mkdir(parents=True)
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "architecture": "LlamaForCausalLM"}))
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1]}))
    hf_model = ck / "hf_model"  # the convert stage's note: the directory TensorRT-LLM loads (builders/layout.py)
    (ck / "manifest.json").write_text(json.dumps({"notes": {"hf_target_dir": str(tiny_target),
                                                            "trtllm_model_dir": str(hf_model)}}))
    out, _ = run_stage(stage.ENGINE_STAGE, cfg, tmp_path)
    opts = yaml.safe_load((out / llmapi.OPTIONS_FILE).read_text())
    assert opts["speculative_config"]["speculative_model_dir"] == str(ck / "eagle3")
    assert opts["speculative_config"]["eagle3_layers_to_capture"] == [0]
    serve_file = json.loads((out / stage.SERVE_FILE).read_text())
    serve = serve_file["argv"]
    assert serve[1] == serve[5] == str(hf_model) and serve[4] == "--tokenizer"
    assert serve[-1] == str(out / llmapi.OPTIONS_FILE)
    assert serve_file["trtllm_version"] == "1.2"
    # an EAGLE-3 id the engine cannot capture is refused with the fix
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [0, 1]}))
    with pytest.raises(StageError, match="set draft.eagle3.layers_to_capture"):
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path, force=True)
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 1, 0]}))
    with pytest.raises(StageError, match=r"repeat a layer: TensorRT-LLM takes `eagle3_layers_to_capture` as a set"):
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path, force=True)
