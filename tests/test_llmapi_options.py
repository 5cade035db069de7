"""The LLM-API options' guards and messages (builders/engine/llmapi.py), each exactly: which backends and layouts get
the YAML, and what a head whose layer ids cannot be expressed is told (the golden files are tests/test_llmapi.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.engine import llmapi
from tests.engine_cases import make_cfg

E3 = ["draft.type=eagle3", "draft.model=/models/eagle3", "tree.choices=chain-3"]
HEAD_DIR = Path("/builds/golden/checkpoint/eagle3")
L = 32


def test_yaml_only_for_pytorch_and_the_reference_mirror_of_the_llmapi_layout() -> None:
    capture = llmapi.layers_to_capture([2, 16, 29], L)
    assert llmapi.llm_api_options(make_cfg("engine.backend=pytorch", "trtllm_version=1.2", *E3), HEAD_DIR, capture, L)
    ok = make_cfg("engine.backend=reference", "trtllm_version=1.4", *E3)
    assert llmapi.llm_api_options(ok, HEAD_DIR, capture, L)["speculative_config"]["eagle3_layers_to_capture"] == capture
    for backend, cfg in (("reference", make_cfg("engine.backend=reference", "trtllm_version=1.1", *E3)),
                         ("tensorrt", make_cfg())):  # the engine flow (EAGLE-1, TensorRT-LLM 1.1)
        with pytest.raises(llmapi.LlmApiError) as err:
            llmapi.llm_api_options(cfg, HEAD_DIR, capture, L)
        assert str(err.value) == (
            f"engine.backend={backend}: the LLM API YAML is for engine.backend=pytorch (and the reference engine's "
            "mirror of the Triton llmapi model)")


def test_layer_id_messages() -> None:
    with pytest.raises(llmapi.LlmApiError) as err:
        llmapi.layers_to_capture([2, 2, 5], L)
    assert str(err.value) == (
        "EAGLE-3 layer ids [2, 2, 5] repeat a layer: TensorRT-LLM takes `eagle3_layers_to_capture` as a set, so the "
        "head's fc input width would not match; this head cannot run on the PyTorch backend")
    for bad in (0, L):
        with pytest.raises(llmapi.LlmApiError) as err:
            llmapi.layers_to_capture([bad, 5], L)
        assert str(err.value) == (
            f"EAGLE-3 layer id {bad}: TensorRT-LLM captures layer OUTPUTS, so the input of layer {bad} must be the "
            f"output of layer {bad - 1}; ids must lie in 1..{L - 1} (set draft.eagle3.layers_to_capture)")


def test_layer_ids_missing_or_contradictory_in_the_head_config() -> None:
    cfg = make_cfg("engine.backend=pytorch", "trtllm_version=1.2", *E3)
    with pytest.raises(llmapi.LlmApiError) as err:
        llmapi.resolve_input_layer_ids(cfg, {})
    assert str(err.value) == ("the EAGLE-3 head's config.json has no `eagle_aux_hidden_state_layer_ids`; "
                              "set draft.eagle3.layers_to_capture")
    both = {"eagle_aux_hidden_state_layer_ids": [2, 16, 29], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}
    with pytest.raises(llmapi.LlmApiError) as err:
        llmapi.resolve_input_layer_ids(cfg, both)
    assert str(err.value).startswith("eagle3/config.json: eagle_aux_hidden_state_layer_ids=[2, 16, 29] disagrees")

