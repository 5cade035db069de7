"""ModelOpt FP8 on a mixture-of-experts row (current line, trtllm_version 1.4): a tiny random Qwen3-MoE target
quantized through the real CLI. The export is checked against the loader rules cited in the ledger (per-expert
linears, routers excluded, K/V scales); the reference engine's mirror holds the weights as TensorRT-LLM's fused-MoE
FP8 method leaves them (each expert's gate/up requantized to its larger scale, one input scale per MoE layer and GEMM);
the build measures tau against the 16-bit target and the quantized target decodes losslessly with its EAGLE-3 head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from builders.build import main as build_main
from builders.config import load_config
from builders.convert import hf_quant, hf_quant_generic
from ledger import check as ledger_check
from ledger import table as ledger
from testkit import tiny_models as tm
from tests.engine_cases import write_build_yaml

QUANT = {"weights": "fp8", "kv_cache": "fp8", "calibration": {"num_samples": 4, "max_length": 64}}
ENGINE = {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256, "device": "cpu"}
PROMPTS = ["The quick brown fox", "Hello world, this is", "Once upon a time"]
LAYERS, EXPERTS = 4, 4


def _target(root: Path, family: str) -> tuple[Path, Path]:
    from testkit.tiny_families import make_family_target

    target = make_family_target(root / "target", family, layers=LAYERS)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # TensorRT-LLM needs three distinct layers
    (head / "config.json").write_text(json.dumps(cfg))
    return target, head


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Qwen3-MoE: routed experts in every layer."""
    return _target(tmp_path_factory.mktemp("hfq_moe"), "qwen3_moe")


@pytest.fixture(scope="module", params=["qwen3_moe", "glm4_moe"])
def export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, moe: tuple[Path, Path]) -> Path:
    """ModelOpt's FP8 + FP8 KV export of each MoE row covered: Qwen3-MoE, and GLM-4.5 (a dense first layer, routed +
    shared experts, q/k/v biases, a router correction bias)."""
    root = tmp_path_factory.mktemp(f"hfq_{request.param}_export")
    target = moe[0] if request.param == "qwen3_moe" else _target(root, request.param)[0]
    hf_quant.export_quantized(target, root / "export", weights="fp8", kv_fp8=True, dtype="float16", prompts=PROMPTS,
                              max_length=32)
    return root / "export"


def _experts(t: dict[str, torch.Tensor]) -> list[str]:
    return sorted({k.split(".experts.")[0] + ".experts" for k in t if ".experts." in k})


@pytest.fixture(scope="module")
def reference_build(tmp_path_factory: pytest.TempPathFactory, moe: tuple[Path, Path]) -> tuple[Any, Path]:
    root = tmp_path_factory.mktemp("hfq_moe_ref")
    cfg = write_build_yaml(root / "c.yaml", output_dir=root / "build", target=moe[0], head=moe[1], draft="eagle3",
                           backend="reference", tree="chain-3", name="hfq-moe", version="1.4", engine=ENGINE,
                           quantization=QUANT)
    assert build_main([str(cfg)]) == 0
    return load_config(cfg), root / "build"


def test_export_is_what_the_loader_reads(export: Path) -> None:
    q = json.loads((export / "hf_quant_config.json").read_text())["quantization"]
    assert (q["quant_algo"], q["kv_cache_quant_algo"]) == ("FP8", "FP8")
    t = load_file(str(export / "model.safetensors"))
    moes = _experts(t)
    assert len(moes) >= LAYERS - 1  # GLM-4.5's first layer is dense
    assert {"lm_head", "model.embed_tokens"} | {m.replace(".experts", ".gate") for m in moes} <= set(
        q["exclude_modules"])
    assert hf_quant_generic.loader_problems(export, weights="fp8", kv_fp8=True) == []
    for moe in moes:
        for e in range(EXPERTS):
            for lin in ("gate_proj", "up_proj", "down_proj"):
                m = f"{moe}.{e}.{lin}"
                assert t[f"{m}.weight"].dtype == torch.float8_e4m3fn
                assert t[f"{m}.weight_scale"].numel() == t[f"{m}.input_scale"].numel() == 1
        assert t[moe.replace(".experts", ".gate.weight")].dtype == torch.float16
    # the names against the ledger rows (the flags a Qwen3-MoE build with FP8 weights and KV cache sets)
    flags = ledger.flags_of(w_fp8=True, kv_fp8=True, w_quant=True, qk_norm=True, moe=True)
    emitted = ledger_check.hf_quant_names(export)
    assert ledger_check.check_emitted(emitted, "1.4", flags) == []
    # an export without its experts is missing required names; the dense MLP's are required of a dense row only
    no_experts = {**emitted, "hf_quant.tensor": {n for n in emitted["hf_quant.tensor"] if ".experts." not in n}}
    missing = ledger_check.check_emitted(no_experts, "1.4", flags)
    assert len(missing) == 9 and all(".mlp.experts.{e}." in p and "is missing" in p for p in missing), missing
    if "model.layers.{i}.mlp.gate_proj.weight" not in emitted["hf_quant.tensor"]:  # experts in every layer
        dense = ledger_check.check_emitted(emitted, "1.4", flags - {"moe"} | {"dense_mlp"})
        assert any("required 'model.layers.{i}.mlp.gate_proj.weight' is missing" in p for p in dense), dense


def test_export_check_bites(export: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    t = load_file(str(bad / "model.safetensors"))
    del t["model.layers.1.mlp.experts.2.up_proj.input_scale"]
    t["model.layers.3.mlp.gate.weight"] = t["model.layers.3.mlp.gate.weight"].to(torch.float8_e4m3fn)
    t["model.layers.2.mlp.experts.0.down_proj.weight_scale"] = torch.tensor([1.0, 2.0])
    del t["model.layers.2.self_attn.k_proj.k_scale"]
    save_file(t, str(bad / "model.safetensors"))
    assert hf_quant_generic.loader_problems(bad, weights="fp8", kv_fp8=True) == [
        "model.layers.1.mlp.experts.2.up_proj.input_scale: missing, expected torch.float32",
        "model.layers.2.mlp.experts.0.down_proj: FP8 weight_scale / input_scale must be per-tensor scalars "
        "(FP8QDQLinearMethod, FP8QDQFusedMoEMethod)",
        "model.layers.3.mlp.gate.weight is torch.float8_e4m3fn; a module TensorRT-LLM loads unquantized "
        "(exclude_modules) is 16-bit",
        "model.layers.2.self_attn.k_proj.k_scale: missing or not a float32 scalar (the FP8 KV cache scale)",
    ]


def _fp8_rescaled(w8: torch.Tensor, s: float, smax: float) -> torch.Tensor:
    """requantize_expert_w3_w1_weight_fp8_qdq / rescale_fused_weights: fp8 -> float16 x own scale / the larger ->
    fp8, then dequantized with the larger scale as the GEMM does."""
    w = (w8.to(torch.float16) * s / smax).to(torch.float8_e4m3fn)
    return (w.float() * smax).to(torch.float16)


def test_mirror_holds_the_weights_and_input_scales_as_the_fused_moe_loads_them(export: Path) -> None:
    t = load_file(str(export / "model.safetensors"))
    mirror, scales = hf_quant_generic.mirror_tensors(t, "float16")
    sc = {k: float(v.float().reshape(())) for k, v in t.items() if k.endswith(("weight_scale", "input_scale"))}
    for moe in _experts(t):
        for e in range(EXPERTS):
            g, u, d = (f"{moe}.{e}.{x}" for x in ("gate_proj", "up_proj", "down_proj"))
            smax = max(sc[f"{g}.weight_scale"], sc[f"{u}.weight_scale"])
            for m in (g, u):
                assert torch.equal(mirror[f"{m}.weight"], _fp8_rescaled(t[f"{m}.weight"], sc[f"{m}.weight_scale"],
                                                                         smax)), m
            assert torch.equal(mirror[f"{d}.weight"], (t[f"{d}.weight"].float() * sc[f"{d}.weight_scale"]).half())
        # one input scale per MoE layer and GEMM: the largest of its experts'
        assert scales["experts"][moe] == {
            "gate_up": max(sc[f"{moe}.{e}.{x}_proj.input_scale"] for e in range(EXPERTS) for x in ("gate", "up")),
            "down": max(sc[f"{moe}.{e}.down_proj.input_scale"] for e in range(EXPERTS))}
    for i in range(LAYERS):
        attn = f"model.layers.{i}.self_attn"
        qkv = max(sc[f"{attn}.{x}_proj.input_scale"] for x in "qkv")
        assert [scales["linears"][f"{attn}.{x}_proj"] for x in "qkvo"] == [qkv] * 3 + [sc[f"{attn}.o_proj.input_scale"]]
    for mlp in sorted({k.rsplit(".", 2)[0] for k in t if k.endswith("gate_proj.weight") and ".experts." not in k}):
        # a dense or shared-expert MLP: gate/up fused (the larger weight and input scale), down alone
        gs, us = sc[f"{mlp}.gate_proj.weight_scale"], sc[f"{mlp}.up_proj.weight_scale"]
        assert torch.equal(mirror[f"{mlp}.up_proj.weight"], _fp8_rescaled(t[f"{mlp}.up_proj.weight"], us, max(gs, us)))
        assert scales["linears"][f"{mlp}.gate_proj"] == max(sc[f"{mlp}.{x}_proj.input_scale"] for x in ("gate", "up"))
    if "model.layers.1.self_attn.q_proj.bias" in t:  # GLM-4.5: biases and the router's correction bias kept as they are
        assert torch.equal(mirror["model.layers.1.self_attn.q_proj.bias"], t["model.layers.1.self_attn.q_proj.bias"])
        assert torch.equal(mirror["model.layers.1.mlp.gate.e_score_correction_bias"],
                           t["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert not any(k.endswith(("_scale", "k_scale")) for k in mirror)


def test_quantized_moe_builds_measures_tau_and_decodes_losslessly(reference_build: tuple[Any, Path],
                                                                  moe: tuple[Path, Path]) -> None:
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    cfg, out = reference_build
    notes = json.loads((out / "checkpoint" / "manifest.json").read_text())["notes"]["quantization"]
    assert notes["held_out_prompts"] == 8 and notes["tau_16bit"] >= 1.0 and notes["tau_fp8"] >= 1.0
    log = (out / "logs" / "checkpoint.log").read_text()
    assert f"FP8: tau 16-bit {notes['tau_16bit']:.3f} vs FP8 {notes['tau_fp8']:.3f} on 8 held-out prompts" in log
    conf = json.loads((out / "checkpoint" / "config.json").read_text())
    assert conf["generic_target"] == "fp8_reference"
    assert (conf["quantization"]["quant_algo"], conf["quantization"]["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert json.loads((out / "checkpoint" / "fp8_reference" / "eagle_deploy_fp8.json").read_text())[
        "kv_cache_scale"] == 1.0
    eng = ReferenceEngine.from_build(out, device="cpu")
    tok = eng.tokenizer
    reqs = [GenerationRequest(prompt_ids=tok.encode(p), max_new_tokens=10, sampling=SamplingParams(),
                              stop_token_ids=[]) for p in PROMPTS]
    plain = eng.generate(reqs, speculative=False)
    spec = eng.generate(reqs, speculative=True)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]  # lossless vs the FP8 target's own greedy
    # the FP8 target is not the 16-bit one: its logits differ on the same tokens
    from engines.generic import load_generic

    ids = torch.tensor([tok.encode(PROMPTS[0])])
    q, f16 = (load_generic(d, torch.float32, torch.device("cpu")).model for d in
              (out / "checkpoint" / "fp8_reference", moe[0]))
    with torch.no_grad():
        diff = (q(ids).logits - f16(ids).logits).abs().max().item()
    assert 0 < diff < 5.0, diff


def test_pytorch_build_hands_the_export_to_tensorrt_llm_and_measures_tau(moe: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    """engine.backend pytorch: the export is the model the options name, checked by `eagle-ledger-check` with the MoE
    rules (a broken expert scale named); the mirror tau is measured on is temporary."""
    cfg_path = write_build_yaml(tmp_path / "c.yaml", output_dir=tmp_path / "build", target=moe[0], head=moe[1],
                                draft="eagle3", backend="pytorch", tree="chain-3", name="pt", version="1.4",
                                quantization=QUANT)
    assert build_main([str(cfg_path)]) == 0
    cfg, out = load_config(cfg_path), tmp_path / "build"
    export = out / "checkpoint" / "hf_quantized"
    notes = json.loads((out / "checkpoint" / "manifest.json").read_text())["notes"]
    assert notes["trtllm_model_dir"] == "checkpoint/hf_quantized" and notes["quantization"]["held_out_prompts"] == 8
    assert not (out / "checkpoint" / "fp8_reference").exists()
    emitted = {k: v for k, v in ledger_check.build_names(cfg, out).items() if k.startswith("hf_quant.")}
    flags = ledger_check.build_flags(cfg, out / "checkpoint")
    assert {"moe", "w_quant", "kv_fp8"} <= flags and "dense_mlp" not in flags
    assert ledger_check.check_emitted(emitted, "1.4", flags) == []
    assert ledger_check.quant_input_problems(cfg, out) == []
    f = export / "model.safetensors"
    t = load_file(str(f))
    t["model.layers.2.mlp.experts.1.gate_proj.input_scale"] = torch.tensor(float("nan"))
    save_file(t, str(f))
    assert ledger_check.quant_input_problems(cfg, out) == [
        f"{export}: model.layers.2.mlp.experts.1.gate_proj.input_scale holds nan; a quantization scale is finite "
        "and positive (re-calibrate or re-export)"]


def test_kv_cache_only_export_is_checked_and_mirrored(moe: tuple[Path, Path], tmp_path: Path) -> None:
    """`quantization.kv_cache: fp8` with 16-bit weights: ModelOpt's export writes no exclude_modules (TensorRT-LLM
    reads it with .get), the check accepts that only without quantized weights, and the mirror keeps the weights
    16-bit with the KV cache at the scale the PyTorch backend serves (1.0)."""
    from core.quant import QuantConfigError, checkpoint_quant

    export = tmp_path / "kv"
    hf_quant.export_quantized(moe[0], export, weights="none", kv_fp8=True, dtype="float16", prompts=PROMPTS,
                              max_length=32)
    q = json.loads((export / "hf_quant_config.json").read_text())
    assert q["quantization"]["quant_algo"] is None and "exclude_modules" not in q["quantization"]
    assert hf_quant_generic.loader_problems(export, weights="none", kv_fp8=True) == []
    assert checkpoint_quant({}, q, "kv").algo == "KV_ONLY"
    with pytest.raises(QuantConfigError, match="quantization.exclude_modules is missing"):
        checkpoint_quant({}, {"quantization": {**q["quantization"], "quant_algo": "FP8"}}, "w")
    hf_quant_generic.write_mirror(moe[0], export, tmp_path / "mirror", weights="none", kv_fp8=True, dtype="float16")
    scales = json.loads((tmp_path / "mirror" / hf_quant_generic.MIRROR_SCALES).read_text())
    assert (scales["linears"], scales["experts"], scales["kv_cache_scale"]) == ({}, {}, 1.0)
    t = load_file(str(tmp_path / "mirror" / "model.safetensors"))
    assert all(v.dtype == torch.float16 for v in t.values()) and not any(k.endswith("_scale") for k in t)
