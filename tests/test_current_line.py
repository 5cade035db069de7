"""The current TensorRT-LLM line (trtllm_version '1.4'): EAGLE-3 heads only, one-model, chains or dynamic trees with
exactly Eagle3DecodingConfig's fields; EAGLE-1/2 heads, static trees and the engine flow are refused at config
validation with the reason and the alternatives. The ledger rows are ledger/llmapi.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.engine import llmapi
from core import trtllm_versions
from ledger import table as ledger
from tests.engine_cases import make_cfg

HEAD = Path("/builds/golden/checkpoint/eagle3")
CAPTURE = [1, 15, 28]  # Llama-3.1-8B's default layers (32 layers)
E3 = ["trtllm_version=1.4", "draft.type=eagle3", "draft.model=/models/eagle3", "engine.max_num_tokens=null"]
DYN = ["tree.choices=null", "tree.dynamic={top_k: 4, depth: 5, total_draft_tokens: 16}"]


def _spec(*ov: str) -> dict:
    return llmapi.llm_api_options(make_cfg(*E3, *ov), HEAD, CAPTURE, 32)["speculative_config"]


def test_registry_entry() -> None:
    v = trtllm_versions.get("1.4")
    assert (v.engine_flow, v.eagle12_heads, v.static_trees, v.pytorch_dynamic_tree, v.triton_layout) == (
        False, False, False, True, "llmapi")
    assert trtllm_versions.for_installed("1.4.0rc4") is v and trtllm_versions.for_installed("1.3.0rc27") is None


def test_dynamic_tree_writes_exactly_eagle3_fields() -> None:
    for backend in ("pytorch", "reference"):
        assert _spec(f"engine.backend={backend}", *DYN) == {
            "decoding_type": "Eagle3", "max_draft_len": 5, "speculative_model": str(HEAD),
            "eagle3_layers_to_capture": CAPTURE, "max_total_draft_tokens": 16, "use_dynamic_tree": True,
            "dynamic_tree_max_topK": 4,
        }


def test_chain_writes_only_the_draft_length() -> None:
    assert _spec("engine.backend=pytorch", "tree.choices=chain-3") == {
        "decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": str(HEAD),
        "eagle3_layers_to_capture": CAPTURE}


def test_emitted_options_are_cited_and_choices_are_not() -> None:
    opts = llmapi.llm_api_options(make_cfg(*E3, "engine.backend=pytorch", *DYN), HEAD, CAPTURE, 32)
    names = ledger.flat_keys(opts)
    assert ledger.check("llmapi.option", "1.4", names, ledger.flags_of(dynamic=True)) == []
    p = ledger.check("llmapi.option", "1.4", names | {"speculative_config.eagle_choices"})
    assert p == ["llmapi.option: 'speculative_config.eagle_choices' is emitted but has no ledger row for "
                 "TensorRT-LLM 1.4.0rc4 (cite its upstream consumer or stop writing it)"]
    missing = ledger.check("llmapi.option", "1.4", names - {"speculative_config.use_dynamic_tree"},
                           ledger.flags_of(dynamic=True))
    assert missing == ["llmapi.option: required 'speculative_config.use_dynamic_tree' is missing (TensorRT-LLM "
                       "1.4.0rc4 reads it: NVIDIA/TensorRT-LLM@v1.4.0rc4:tensorrt_llm/llmapi/llm_args.py "
                       "Eagle3DecodingConfig (StrictBaseModel, extra='forbid'))"]


@pytest.mark.parametrize("backend", ["pytorch", "reference"])
def test_eagle12_head_is_refused_with_the_alternatives(backend: str) -> None:
    with pytest.raises(ValueError) as e:
        make_cfg("trtllm_version=1.4", f"engine.backend={backend}", "tree.choices=chain-3")
    msg = str(e.value)
    assert ("draft.type=eagle (an EAGLE-1/2 head) cannot run on TensorRT-LLM 1.4.0rc4 (trtllm_version '1.4'): it runs "
            "EAGLE-3 heads only") in msg
    assert "retrain the head as EAGLE-3 with this toolkit's trainer (`python training/train_head.py CONFIG`" in msg
    assert "set trtllm_version: '1.2' (or '1.1', the pinned NGC image) with engine.backend tensorrt" in msg


@pytest.mark.parametrize("backend", ["pytorch", "reference"])
def test_static_tree_is_refused_with_the_alternatives(backend: str) -> None:
    with pytest.raises(ValueError) as e:
        make_cfg(*E3, f"engine.backend={backend}", "tree.choices=topk-2-2")
    msg = str(e.value)
    assert ("tree.choices (a static tree, 6 nodes, depth 2) cannot run on TensorRT-LLM 1.4.0rc4 (trtllm_version "
            "'1.4'): static trees (eagle_choices) were removed (TensorRT-LLM PR #18210") in msg
    assert (
        "Use a dynamic tree (tree.dynamic: {top_k, depth, total_draft_tokens}) or a chain (tree.choices: chain-2)"
        in msg
    )
    assert msg.count("eagle_choices") == 1  # one message, not one per rule


def test_engine_flow_is_refused() -> None:
    with pytest.raises(ValueError, match=r"engine.backend=tensorrt \(trtllm-build engines\) is not supported by "
                       r"TensorRT-LLM 1\.4\.0rc4 \(trtllm_version '1\.4'\); set trtllm_version: '1\.1'"):
        make_cfg("trtllm_version=1.4", "tree.choices=chain-3", "draft.type=eagle3", "draft.model=/m")


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as e:
        make_cfg("trtllm_version=1.4", "engine.backend=pytorch", "tree.choices=topk-2-2")
    msg = str(e.value)
    assert "an EAGLE-1/2 head" in msg and "static trees (eagle_choices) were removed" in msg


def test_the_older_lines_still_take_what_the_current_one_refuses() -> None:
    make_cfg("trtllm_version=1.2", "tree.choices=topk-2-2")  # EAGLE-1 engine flow, static tree
    make_cfg("trtllm_version=1.1", "engine.backend=reference", "tree.choices=topk-2-2")


def test_serve_argv_leaves_out_the_removed_backend_flag() -> None:
    argv = llmapi.trtllm_serve_argv(Path("/t"), Path("/o.yaml"), backend_flag=trtllm_versions.get("1.4").engine_flow)
    assert "--backend" not in argv and argv[-2:] == ["--extra_llm_api_options", "/o.yaml"]
    assert ledger.check("trtllm-serve.flag", "1.4", ledger.argv_flags(argv)) == []


def test_new_configs_default_to_the_current_line() -> None:
    from builders.config import BuildConfig
    from tests.engine_cases import BASE

    data = {k: v for k, v in BASE.items() if k != "trtllm_version"}
    e3 = BuildConfig.model_validate({**data, "draft": {"type": "eagle3", "model": "/m"}, "tree": {"choices": "chain-3"},
                                     "engine": {**data["engine"], "backend": "pytorch"}})
    assert e3.trtllm_version == trtllm_versions.DEFAULT_VERSION == "1.4"
    with pytest.raises(ValueError) as e:  # an EAGLE-1 engine-flow config must now say which line it is for
        BuildConfig.model_validate(data)
    assert "set trtllm_version: '1.2' (or '1.1', the pinned NGC image) with engine.backend tensorrt" in str(e.value)
    pinned = trtllm_versions.get(trtllm_versions.PINNED_VERSION)
    assert pinned.triton_image == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
