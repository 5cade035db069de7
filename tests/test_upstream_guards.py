"""Refusals and warnings for what TensorRT-LLM cannot serve yet: MLA EAGLE-3 draft heads (NVIDIA/TensorRT-LLM PR
#15426), recognized by the doctor and the converter before their tensors are read; an FP8 target with a 16-bit
EAGLE-3 head on the current line warned about (issue #7842)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders import build
from doctor.__main__ import main as doctor
from builders.published import fp8_head_warning
from tests.doctor_models import copy_head

MLA = [
    {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3"},
    {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64},
    {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "kv_lora_rank": 512},
    {"speculators_model_type": "eagle3", "transformer_layer_config": {"kv_lora_rank": 512, "qk_rope_head_dim": 64}},
]


@pytest.mark.parametrize("cfg", MLA)
def test_mla_draft_heads_are_refused_by_the_doctor_and_the_converter(cfg: dict, tmp_path: Path, tiny_target: Path,
                                                                      eagle3_head: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    head = copy_head(eagle3_head, tmp_path / "mla", cfg=dict(cfg))
    assert doctor(["--target", str(tiny_target), "--head", str(head), "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert f"--head {head}: an MLA EAGLE-3 draft head (" in err and "NVIDIA/TensorRT-LLM PR #15426" in err, err
    data = {"name": "mla", "trtllm_version": "1.4", "output_dir": str(tmp_path / "out"),
            "target": {"model": str(tiny_target), "dtype": "bfloat16"}, "draft": {"type": "eagle3", "model": str(head)},
            "tree": {"choices": "chain-3"}, "engine": {"backend": "pytorch"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    assert build.main([str(tmp_path / "c.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"draft.model {head}: an MLA EAGLE-3 draft head (" in err and "PR #15426" in err, err


@pytest.mark.parametrize(("version", "backend", "weights", "target_quant", "warned"), [
    ("1.4", "pytorch", "fp8", None, True),
    ("1.4", "pytorch", "none", {"quant_method": "fp8", "weight_block_size": [128, 128]}, True),
    ("1.4", "pytorch", "nvfp4", None, False),
    ("1.4", "pytorch", "none", None, False),
    ("1.4", "reference", "fp8", None, False),
    ("1.2", "pytorch", "none", {"quant_method": "fp8", "weight_block_size": [128, 128]}, False),
])
def test_fp8_target_with_a_16bit_eagle3_head_names_issue_7842(version: str, backend: str, weights: str,
                                                               target_quant: dict | None, warned: bool,
                                                               tmp_path: Path, tiny_target: Path,
                                                               eagle3_head: Path) -> None:
    import json
    import shutil

    from builders.config import load_config

    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    if target_quant:
        cfg = json.loads((target / "config.json").read_text()) | {"quantization_config": target_quant}
        (target / "config.json").write_text(json.dumps(cfg))
    data = {"name": "w", "trtllm_version": version, "output_dir": str(tmp_path / "out"),
            "target": {"model": str(target), "dtype": "bfloat16"},
            "draft": {"type": "eagle3", "model": str(eagle3_head)},
            "tree": {"choices": "chain-3"}, "engine": {"backend": backend},
            "quantization": {"weights": weights, "kv_cache": "fp8" if weights != "none" else "none"}}
    if backend == "reference":
        data["engine"]["device"] = "cpu"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    msg = fp8_head_warning(load_config(tmp_path / "c.yaml"), target)
    if warned:
        assert msg is not None and "TensorRT-LLM issue #7842" in msg and "16-bit EAGLE-3 head" in msg, msg
        assert ("FP8_BLOCK_SCALES" if target_quant else "FP8 (quantization.weights)") in msg, msg
    else:
        assert msg is None
