"""FP8 checkpoints: the loader reads ModelOpt's TRT-LLM export layout (modelopt/torch/export/quant_utils.py,
model_config_utils.py: per-linear `weights_scaling_factor` + `activation_scaling_factor`, per-layer
`attention.kv_cache_scaling_factor` = max(k, v) scale; tensorrt_llm/quantization/layers.py FP8Linear) and computes
fp8 weights * scale with fake-quantized activations / KV.

The checkpoint is made by hand: a tiny float32 checkpoint's linears quantized to float8_e4m3fn with per-tensor scales.
The oracle is Hugging Face's LlamaForCausalLM with the dequantized weights and the same fake-quantization inserted
with hooks (inputs of every linear; K after RoPE and V before caching)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.checkpoint import CheckpointError
from engines.linear import fake_quant_fp8

LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
ACT_SCALE = 6.0 / 448  # covers |x| <= 6: RMS-normed inputs of the tiny model
KV_SCALE = 4.0 / 448
PROMPT = [5, 17, 33, 101, 7, 9, 250, 3, 64, 128, 200, 11]


pytestmark = pytest.mark.usefixtures("one_thread")


def quantize_checkpoint(src: Path, dst: Path, *, kv: bool, exclude: list[str]) -> dict[str, torch.Tensor]:
    """Quantize every transformer.layers.* linear of a float checkpoint to FP8 (per-tensor). Returns the dequantized
    float weights keyed by tensor name (what the engine should compute with)."""
    shutil.copytree(src, dst)
    t = load_file(str(dst / "rank0.safetensors"))
    deq: dict[str, torch.Tensor] = {}
    for name in list(t):
        module = name.rsplit(".", 1)[0]
        if not (name.startswith("transformer.layers.") and name.endswith(".weight") and module.endswith(LINEARS)):
            continue
        w = t[name].float()
        scale = w.abs().max() / 448
        q = (w / scale).to(torch.float8_e4m3fn)
        t[name] = q
        t[f"{module}.weights_scaling_factor"] = scale.reshape(1)
        t[f"{module}.activation_scaling_factor"] = torch.tensor([ACT_SCALE])
        deq[name] = q.float() * scale
    if kv:  # every attention gets a KV scale, the EAGLE drafter's too (TensorRT-LLM's kv_cache_quantize does)
        attentions = {n.rsplit(".", 3)[0] for n in t if n.endswith(".attention.qkv.weight")}
        for a in attentions:
            t[f"{a}.attention.kv_cache_scaling_factor"] = torch.tensor([KV_SCALE])
    save_file(t, str(dst / "rank0.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization"] = {
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8" if kv else None,
        "exclude_modules": exclude,
    }
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return deq


def fake_quant_hf(hf_dir: Path, deq: dict[str, torch.Tensor], kv: bool):
    """HF model with dequantized weights, FP8 fake-quantized linear inputs (and K/V when kv)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    act = torch.tensor(ACT_SCALE)
    cfg = model.config
    q, kvs = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for i, layer in enumerate(model.model.layers):
        pre = f"transformer.layers.{i}"
        wq, wk, wv = deq[f"{pre}.attention.qkv.weight"].split([q, kvs, kvs])
        pairs = [
            (layer.self_attn.q_proj, wq), (layer.self_attn.k_proj, wk), (layer.self_attn.v_proj, wv),
            (layer.self_attn.o_proj, deq[f"{pre}.attention.dense.weight"]),
            (layer.mlp.gate_proj, deq[f"{pre}.mlp.fc.weight"]), (layer.mlp.up_proj, deq[f"{pre}.mlp.gate.weight"]),
            (layer.mlp.down_proj, deq[f"{pre}.mlp.proj.weight"]),
        ]
        for lin, w in pairs:
            lin.weight.data.copy_(w)
            lin.register_forward_pre_hook(lambda m, args: (fake_quant_fp8(args[0], act),))
        if kv:
            layer.self_attn.v_proj.register_forward_hook(lambda m, a, out: fake_quant_fp8(out, torch.tensor(KV_SCALE)))
    if kv:
        original = modeling_llama.apply_rotary_pos_emb

        def rope_then_quantize_k(q_, k_, cos, sin, *a, **kw):  # K is cached after RoPE
            q2, k2 = original(q_, k_, cos, sin, *a, **kw)
            return q2, fake_quant_fp8(k2, torch.tensor(KV_SCALE))

        model._restore = (modeling_llama, original)
        modeling_llama.apply_rotary_pos_emb = rope_then_quantize_k
    return model


def prefill_logits(engine: ReferenceEngine, ids: list[int]) -> torch.Tensor:
    from tests.test_engine_model import engine_logits

    return engine_logits(engine, ids)


@pytest.mark.parametrize("kv", [False, True], ids=["fp8-weights", "fp8-weights+kv"])
def test_fp8_logits_match_fake_quantized_hf(tmp_path: Path, tiny_target: Path, target_ckpt: Path, kv: bool) -> None:
    deq = quantize_checkpoint(target_ckpt, tmp_path / "fp8", kv=kv, exclude=["lm_head"])
    engine = ReferenceEngine.from_checkpoint(tmp_path / "fp8", tree=None, dtype="float32", device="cpu")
    assert engine._rt.target.layers[0].mlp.fc.act_scale is not None
    assert (engine._rt.target.layers[0].attn.kv_scale is not None) == kv
    assert engine._rt.target.lm_head.linear.act_scale is None  # excluded: stays 16-bit
    ours = prefill_logits(engine, PROMPT)
    hf = fake_quant_hf(tiny_target, deq, kv)
    try:
        with torch.inference_mode():
            ref = hf(torch.tensor([PROMPT])).logits[0]
    finally:
        if kv:
            mod, original = hf._restore
            mod.apply_rotary_pos_emb = original
    assert (ours - ref).abs().max().item() <= 1e-4
    plain = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    diff = (ours - prefill_logits(plain, PROMPT)).abs().max().item()
    assert 0 < diff < 1.0  # quantization changes the logits, a little


def test_fp8_target_with_16bit_head_is_lossless(tmp_path: Path, eagle_ckpt: Path) -> None:
    quantize_checkpoint(eagle_ckpt, tmp_path / "fp8e", kv=True, exclude=["lm_head", "eagle_nets*"])
    engine = ReferenceEngine.from_checkpoint(
        tmp_path / "fp8e", tree=DraftTree.from_choices(preset("eagle-default")), dtype="float32", device="cpu"
    )
    reqs = [
        GenerationRequest([5, 17, 33, 101, 7], 20, SamplingParams(), []),
        GenerationRequest([9, 8], 15, SamplingParams(), []),
    ]
    assert [r.output_ids for r in engine.generate(reqs)] == [
        r.output_ids for r in engine.generate(reqs, speculative=False)
    ]


def test_fp8_missing_scale_is_named(tmp_path: Path, target_ckpt: Path) -> None:
    quantize_checkpoint(target_ckpt, tmp_path / "bad", kv=False, exclude=["lm_head"])
    t = load_file(str(tmp_path / "bad" / "rank0.safetensors"))
    del t["transformer.layers.0.mlp.proj.weights_scaling_factor"]
    save_file(t, str(tmp_path / "bad" / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match=r"transformer\.layers\.0\.mlp\.proj\.weights_scaling_factor' is missing"):
        ReferenceEngine.from_checkpoint(tmp_path / "bad", tree=None, dtype="float32", device="cpu")


def test_fp8_unquantized_module_must_be_excluded(tmp_path: Path, target_ckpt: Path) -> None:
    quantize_checkpoint(target_ckpt, tmp_path / "noexcl", kv=False, exclude=[])
    with pytest.raises(
        CheckpointError, match=r"quant_algo is FP8 but lm_head\.weight is torch\.float32; add 'lm_head'"
    ):
        ReferenceEngine.from_checkpoint(tmp_path / "noexcl", tree=None, dtype="float32", device="cpu")


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf"), float("-inf"), -1.0])
@pytest.mark.parametrize("tensor", ["transformer.layers.0.mlp.proj.weights_scaling_factor",
                                    "transformer.layers.1.attention.qkv.activation_scaling_factor",
                                    "transformer.layers.0.attention.kv_cache_scaling_factor"])
def test_fp8_scales_that_are_not_finite_and_positive_are_refused(tmp_path: Path, target_ckpt: Path, tensor: str,
                                                                 value: float) -> None:
    """Weight, activation and KV-cache scales of 0, NaN, +-inf or a negative value would decode garbage without an
    error: the loader refuses each, naming the tensor and the value."""
    quantize_checkpoint(target_ckpt, tmp_path / "bad", kv=True, exclude=["lm_head"])
    t = load_file(str(tmp_path / "bad" / "rank0.safetensors"))
    t[tensor] = torch.tensor([value])
    save_file(t, str(tmp_path / "bad" / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{tensor.replace('.', '[.]')} holds {value!r}; a quantization scale is "
                                              "finite and positive"):
        ReferenceEngine.from_checkpoint(tmp_path / "bad", tree=None, dtype="float32", device="cpu")


@pytest.mark.parametrize(("replacement", "error"), [
    (torch.tensor([[1.0], [2.0]]), r"has shape \(2, 1\); expected one value"),
    (torch.tensor([1], dtype=torch.int32), r"is torch.int32; a scale is float32"),
])
def test_fp8_scales_of_the_wrong_shape_or_dtype_are_refused(tmp_path: Path, target_ckpt: Path,
                                                            replacement: torch.Tensor, error: str) -> None:
    quantize_checkpoint(target_ckpt, tmp_path / "bad", kv=False, exclude=["lm_head"])
    t = load_file(str(tmp_path / "bad" / "rank0.safetensors"))
    t["transformer.layers.0.attention.dense.activation_scaling_factor"] = replacement
    save_file(t, str(tmp_path / "bad" / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match=error):
        ReferenceEngine.from_checkpoint(tmp_path / "bad", tree=None, dtype="float32", device="cpu")
