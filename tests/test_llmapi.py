"""LLM API options YAML + trtllm-serve argv (engine.backend: pytorch), golden files.

Field names: tensorrt_llm/llmapi/llm_args.py, TensorRT-LLM 1.2 series (DecodingBaseConfig: max_draft_len,
max_total_draft_tokens, speculative_model_dir; EagleDecodingConfig: eagle_choices, use_dynamic_tree,
dynamic_tree_max_topK, eagle3_one_model, eagle3_layers_to_capture; KvCacheConfig: dtype, free_gpu_memory_fraction);
trtllm-serve flags: tensorrt_llm/commands/serve.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from builders.engine import llmapi, stage
from builders.pipeline import StageError, run_stage
from tests.engine_cases import check_golden, make_cfg

E3 = ["engine.backend=pytorch", "draft.type=eagle3", "draft.model=/models/eagle3"]
HEAD_DIR = Path("/builds/golden/checkpoint/eagle3")
CASES = {
    "eagle3_chain": E3 + ["tree.choices=chain-3"],
    "eagle3_static_tree_fp8kv": E3 + ["tree.choices=eagle-default", "quantization.kv_cache=fp8"],
    "eagle3_dynamic_tp2": E3 + ["tree.choices=null", "tree.dynamic={top_k: 4, depth: 5, total_draft_tokens: 16}",
                                "parallel.tp=2", "target.dtype=bfloat16", "engine.max_num_tokens=null"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_llm_api_yaml(name: str) -> None:
    cfg = make_cfg(*CASES[name])
    capture = llmapi.layers_to_capture([2, 16, 29], num_target_layers=32)  # Llama-3.1-8B EAGLE-3 default
    text = llmapi.dump_options(llmapi.llm_api_options(cfg, HEAD_DIR, capture))
    check_golden(f"llm_api_{name}.yaml", text)


def test_yaml_values_render_from_the_config() -> None:
    opts = yaml.safe_load(llmapi.dump_options(llmapi.llm_api_options(make_cfg(*CASES["eagle3_static_tree_fp8kv"]),
                                                                     HEAD_DIR, [1, 15, 28])))
    spec = opts["speculative_config"]
    assert spec["decoding_type"] == "Eagle" and spec["speculative_model_dir"] == str(HEAD_DIR)
    assert (spec["max_draft_len"], spec["max_total_draft_tokens"]) == (5, 25)  # depth, nodes of eagle-default
    assert spec["eagle_choices"][:4] == [[0], [1], [2], [3]] and len(spec["eagle_choices"]) == 25
    assert spec["eagle3_layers_to_capture"] == [1, 15, 28]
    assert opts["kv_cache_config"]["dtype"] == "fp8"
    assert (opts["max_batch_size"], opts["max_num_tokens"], opts["max_seq_len"]) == (4, 2048, 2048)


def test_chain_omits_tree_fields_for_older_releases() -> None:
    spec = llmapi.llm_api_options(make_cfg(*CASES["eagle3_chain"]), HEAD_DIR, [1])["speculative_config"]
    assert spec["max_draft_len"] == 3
    assert "eagle_choices" not in spec and "max_total_draft_tokens" not in spec and "use_dynamic_tree" not in spec


def test_dynamic_tree_fields() -> None:
    opts = llmapi.llm_api_options(make_cfg(*CASES["eagle3_dynamic_tp2"]), HEAD_DIR, [1])
    spec = opts["speculative_config"]
    assert (spec["use_dynamic_tree"], spec["dynamic_tree_max_topK"], spec["max_draft_len"],
            spec["max_total_draft_tokens"]) == (True, 4, 5, 16)
    assert "eagle_choices" not in spec
    # derived: max(max_batch_size * (max_draft_len + 1), max_input_len) = max(4 * 17, 1024)
    assert (opts["tensor_parallel_size"], opts["max_num_tokens"]) == (2, max(4 * 17, 1024))


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


@pytest.mark.parametrize(("ov", "msg"), [
    (["engine.backend=pytorch"], "runs EAGLE-3 heads only"),
    (E3 + ["quantization.weights=fp8"], "quantization.weights=fp8 with engine.backend=pytorch"),
    (E3 + ["tree.choices=null", "tree.dynamic={top_k: 2, depth: 3, total_draft_tokens: 8}", "engine.max_num_tokens=null"],
     "total_draft_tokens=8 > top_k * depth = 6"),
])
def test_problems(ov: list[str], msg: str) -> None:
    cfg = make_cfg(*ov)
    assert any(msg in p for p in llmapi.llmapi_problems(cfg)), llmapi.llmapi_problems(cfg)
    with pytest.raises(llmapi.LlmApiError, match=msg.replace("*", r"\*")):
        llmapi.llm_api_options(cfg, HEAD_DIR, [1])


def test_golden_serve_argv() -> None:
    argv = llmapi.trtllm_serve_argv(Path("/models/target"), Path("/builds/golden/engine/llm_api_options.yaml"))
    check_golden("trtllm_serve_argv.json", argv)
    assert argv[:2] == ["trtllm-serve", "/models/target"]
    assert argv[argv.index("--extra_llm_api_options") + 1].endswith("llm_api_options.yaml")


def test_pytorch_stage_writes_yaml_and_serve_command(tmp_path: Path, tiny_target: Path) -> None:
    cfg = make_cfg(*E3, f"output_dir={tmp_path}", f"target.model={tiny_target}", "tree.choices=topk-2-2")
    ck = tmp_path / "checkpoint"
    (ck / "eagle3").mkdir(parents=True)
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1]}))
    (ck / "manifest.json").write_text("{}")
    out, _ = run_stage(stage.ENGINE_STAGE, cfg, tmp_path)
    opts = yaml.safe_load((out / llmapi.OPTIONS_FILE).read_text())
    assert opts["speculative_config"]["speculative_model_dir"] == str(ck / "eagle3")
    assert opts["speculative_config"]["eagle3_layers_to_capture"] == [0]
    serve = json.loads((out / stage.SERVE_FILE).read_text())["argv"]
    assert serve[1] == str(tiny_target) and serve[-1] == str(out / llmapi.OPTIONS_FILE)
    # an EAGLE-3 id the engine cannot capture is refused with the fix
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [0, 1]}))
    with pytest.raises(StageError, match="set draft.eagle3.layers_to_capture"):
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path, force=True)
    (ck / "eagle3" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 1, 0]}))
    with pytest.raises(StageError, match=r"repeat a layer: TensorRT-LLM takes `eagle3_layers_to_capture` as a set"):
        run_stage(stage.ENGINE_STAGE, cfg, tmp_path, force=True)
