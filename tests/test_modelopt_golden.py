"""Golden comparison of our target conversion with nvidia-modelopt's `export_tensorrt_llm_checkpoint`
(modelopt/torch/export/model_config_export.py), the exporter NVIDIA's own EAGLE FP8 flow uses
(TensorRT-LLM examples/eagle/quantize.py). Same tiny HF model in, checkpoints compared tensor by tensor.

Findings with modelopt 0.47 + transformers 5.24 (checked here, so a change upstream shows up):
- tensor names, shapes and values agree exactly (including the gate_proj -> mlp.fc / up_proj -> mlp.gate swap).
- ModelOpt drops `rotary_base` and `rotary_scaling` (it reads `rope_theta` / `rope_scaling`, which transformers 5
  moved into `rope_parameters`); TRT-LLM would then silently use rotary_base 10000 and no llama3 scaling. Ours
  writes both (values asserted in test_convert.py).
- ModelOpt writes `logits_dtype` = the model dtype; upstream convert_checkpoint.py writes "float32" (as we do).
- ModelOpt sets `use_parallel_embedding: true` (vocab-sharded embedding); we keep upstream convert_checkpoint's
  default false (replicated embedding), so at tp > 1 only the embedding tensor differs in layout.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from builders.convert import convert_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Config keys TRT-LLM's LLaMAConfig/PretrainedConfig read that both exporters must agree on.
SHARED_KEYS = (
    "architecture", "dtype", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
    "intermediate_size", "head_size", "vocab_size", "norm_epsilon", "max_position_embeddings", "hidden_act",
    "position_embedding_type", "share_embedding_table", "residual_mlp", "embedding_sharding_dim", "mapping",
)


def _modelopt_export(hf_dir: Path, out: Path, tp: int) -> None:
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.export import export_tensorrt_llm_checkpoint

        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        export_tensorrt_llm_checkpoint(
            model, "llama", dtype=torch.float16, export_dir=out, inference_tensor_parallel=tp
        )


@pytest.mark.parametrize("fixture", ["tiny_target", "tiny_target_tied"])
def test_matches_modelopt_tp1(fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    hf_dir: Path = request.getfixturevalue(fixture)
    _modelopt_export(hf_dir, tmp_path / "modelopt", tp=1)
    convert_llama(hf_dir, tmp_path / "ours", dtype="float16")
    mo = load_file(str(tmp_path / "modelopt" / "rank0.safetensors"))
    ours = load_file(str(tmp_path / "ours" / "rank0.safetensors"))
    assert sorted(mo) == sorted(ours)
    for name in mo:
        assert mo[name].dtype == ours[name].dtype == torch.float16, name
        assert torch.equal(mo[name], ours[name]), name
    mo_cfg = json.loads((tmp_path / "modelopt" / "config.json").read_text())
    our_cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    for key in SHARED_KEYS:
        assert mo_cfg[key] == our_cfg[key], key
    assert mo_cfg["quantization"]["quant_algo"] is our_cfg["quantization"]["quant_algo"] is None
    # Documented divergences (see module docstring); where ModelOpt writes rope keys they must agree with ours.
    for key in ("rotary_base", "rotary_scaling"):
        if key in mo_cfg:
            assert mo_cfg[key] == our_cfg[key], key
    assert our_cfg["logits_dtype"] == "float32" and our_cfg["use_parallel_embedding"] is False


def test_matches_modelopt_tp2_layers(tiny_target: Path, tmp_path: Path) -> None:
    _modelopt_export(tiny_target, tmp_path / "modelopt", tp=2)
    convert_llama(tiny_target, tmp_path / "ours", dtype="float16", tp=2)
    for r in range(2):
        mo = load_file(str(tmp_path / "modelopt" / f"rank{r}.safetensors"))
        ours = load_file(str(tmp_path / "ours" / f"rank{r}.safetensors"))
        assert sorted(mo) == sorted(ours)
        for name in mo:
            if name == "transformer.vocab_embedding.weight":  # ModelOpt shards it (use_parallel_embedding=true)
                assert torch.equal(torch.chunk(ours[name], 2)[r], mo[name])
                continue
            assert torch.equal(mo[name], ours[name]), (r, name)
