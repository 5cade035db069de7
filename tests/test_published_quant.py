"""Targets published already quantized (core/quant.py, builders/published.py): read as TensorRT-LLM's loader reads
them, sized at their real bytes, served by the reference engine dequantized with their scales, and refused by name
where the build would otherwise read the quantized tensors without their scales."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders import build
from core.quant import QuantConfigError, checkpoint_quant, weight_bytes
from core.shapes import shape_of_config

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
BLOCKS = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic", "fmt": "e4m3"}
GIB = 1 << 30


def _yaml(tmp_path: Path, name: str, target: Path, head: Path, backend: str, **over: object) -> Path:
    data: dict = {"name": name, "trtllm_version": "1.4", "output_dir": str(tmp_path / name),
                  "target": {"model": str(target), "dtype": "float32" if backend == "reference" else "bfloat16"},
                  "draft": {"type": "eagle3", "model": str(head)}, "tree": {"choices": "chain-3"},
                  "engine": {"backend": backend, "max_batch_size": 2, "max_input_len": 32, "max_seq_len": 64}}
    if backend == "reference":
        data["engine"]["device"] = "cpu"
    for key, value in over.items():
        section, field = key.split("__")
        data.setdefault(section, {})[field] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_published_deepseek_v3_fp8_blocks_plan_within_an_h200(tmp_path: Path, eagle3_head: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """DeepSeek-V3's published config.json carries 128x128 FP8 blocks: its weights are sized at one byte per
    quantized weight plus a float32 scale per block, the embedding, LM head and kv_b_proj (which TensorRT-LLM
    excludes) at 16 bits: about 627 GiB in all, 78 GiB per GPU at tp 8, so 141 GiB per GPU passes the memory check
    where bf16 sizing (156 GiB of weights per GPU) refused it."""
    cfg = json.loads((FIXTURES / "deepseek-v3.json").read_text()) | {"quantization_config": BLOCKS}
    quant = checkpoint_quant(cfg, None, "DeepSeek-V3")
    assert quant is not None and (quant.algo, quant.group_size) == ("FP8_BLOCK_SCALES", 128)
    assert "*kv_b_proj*" in quant.exclude
    shape = shape_of_config(cfg, "x")
    fp8 = weight_bytes(shape.params, vocab=129280, hidden=7168, tied=False, dtype_bytes=2, quant=quant,
                       kv_b_params=512 * 128 * 256 * 61)
    bf16 = weight_bytes(shape.params, vocab=129280, hidden=7168, tied=False, dtype_bytes=2, quant=None)
    assert bf16 == 2 * shape.params
    sixteen = 2 * 129280 * 7168 + 512 * 128 * 256 * 61
    assert fp8 == 2 * sixteen + -(-(shape.params - sixteen) * (8 * 16384 + 32) // (8 * 16384))
    assert 620 < fp8 / GIB < 635 and fp8 / 8 / GIB < 80
    target = tmp_path / "DeepSeek-V3"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(cfg))
    common = dict(parallel__tp=8, engine__max_batch_size=8, engine__max_input_len=4096, engine__max_seq_len=8192)
    assert build.main([str(_yaml(tmp_path, "h200", target, eagle3_head, "pytorch", engine__memory_budget_gib=141,
                                 **common)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer.json or tokenizer.model" in err and "GiB" not in err, err  # only the missing tokenizer
    assert build.main([str(_yaml(tmp_path, "small", target, eagle3_head, "pytorch", engine__memory_budget_gib=60,
                                 **common)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"weights {fp8 // 8 / GIB:,.2f} GiB" in err, err


@pytest.mark.parametrize(("config", "modelopt", "error"), [
    ({}, {"quantization": {"quant_algo": "fp8", "kv_cache_quant_algo": None, "exclude_modules": []}},
     r"quant_algo='fp8': not one of .*upper case: 'FP8'"),
    ({}, {"quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}},
     r"quantization\.kv_cache_quant_algo is missing"),
    ({}, {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": "lm_head"}},
     r"exclude_modules='lm_head': expected a list of module names"),
    ({}, {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "fp8", "exclude_modules": []}},
     r"kv_cache_quant_algo='fp8': not one of FP8, INT8, NVFP4"),
    ({}, {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "exclude_modules": [],
                           "group_size": 32}}, r"group_size=32: TensorRT-LLM's NVFP4 takes 16"),
    ({}, {"quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "exclude_modules": []}},
     r"MIXED_PRECISION.*not sized or checked"),
    ({}, {"producer": {"name": "modelopt"}}, r"no `quantization` object"),
    ({}, ["FP8"], r"not a JSON object"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}, None,
     r"weight_block_size=\[64, 64\]: TensorRT-LLM's FP8_BLOCK_SCALES takes \[128, 128\] only"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, None,
     r"without weight_block_size or activation_scheme 'static'.*without their scales"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, None,
     r"quant_method='awq': TensorRT-LLM's loader reads"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                              "modules_to_not_convert": "lm_head"}}, None,
     r"modules_to_not_convert='lm_head': expected a list"),
    ({"quantization_config": "fp8"}, None, r"quantization_config='fp8' is not an object"),
])
def test_quantization_configs_tensorrt_llm_would_misread_are_refused(config: dict, modelopt: object,
                                                                     error: str) -> None:
    with pytest.raises(QuantConfigError, match=error):
        checkpoint_quant(config, modelopt, "ckpt")  # type: ignore[arg-type]


def test_quantization_configs_as_tensorrt_llm_reads_them() -> None:
    mo = {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"],
                           "group_size": 16}}
    q = checkpoint_quant({"quantization_config": BLOCKS}, mo, "ckpt")  # the file wins over the inline block
    assert q is not None and (q.algo, q.kv_cache_algo, q.group_size, q.source) == (
        "NVFP4", "FP8", 16, "ckpt/hf_quant_config.json")
    assert checkpoint_quant({"quantization_config": {"quant_method": "mxfp4"}}, None, "c").algo == "W4A16_MXFP4"
    static = checkpoint_quant({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
                                                       "ignored_layers": ["model.layers.0.mlp"]}}, None, "c")
    assert static.algo == "FP8_BLOCK_SCALES" and "model.layers.0.mlp" in static.exclude
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}}
    assert checkpoint_quant({"quantization_config": ct}, None, "c").algo == "FP8"
    assert checkpoint_quant({}, None, "c") is None
    assert checkpoint_quant({}, {"quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8",
                                                  "exclude_modules": None}}, "c").algo == "KV_ONLY"


@pytest.fixture(scope="module")
def fp8_deepseek(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tiny DeepSeek-V3-shaped target quantized to FP8 128x128 blocks (hidden 128, MLA ranks 128, experts of 128:
    whole blocks, plus the ragged q_b / kv_a / kv_b / o edges DeepSeek's own shapes have), its dequantized twin and
    an EAGLE-3 head."""
    from testkit.quantized import fp8_block_target
    from testkit.tiny_families import make_family_target, make_mimic_eagle3_head

    root = tmp_path_factory.mktemp("fp8_deepseek")
    src = make_family_target(root / "src", "deepseek_v3", block_scale=0.3, hidden_size=128, intermediate_size=256,
                             moe_intermediate_size=128, q_lora_rank=128, kv_lora_rank=128)
    quantized, dequantized = fp8_block_target(src, root / "quantized", root / "dequantized")
    return quantized, dequantized, make_mimic_eagle3_head(root / "head", dequantized)


def test_fp8_block_target_serves_hf_greedy_of_its_dequantized_weights(fp8_deepseek: tuple[Path, Path, Path],
                                                                      tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """The reference engine runs the published FP8 checkpoint as it is (weights x the scale of their 128x128 block)
    and decodes what transformers' greedy generate decodes on the dequantized twin; the PyTorch backend's build
    names the checkpoint directory itself as the model."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from core.types import GenerationRequest, SamplingParams
    from engines.api import ReferenceEngine
    from testkit.quantized import block_dequantize

    quantized, dequantized, head = fp8_deepseek
    raw = load_file(str(quantized / "model.safetensors"))
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"  # 136 rows: a ragged block edge
    assert raw[name].dtype == torch.float8_e4m3fn and raw[name.replace("weight", "weight_scale_inv")].shape == (2, 1)
    assert torch.equal(load_file(str(dequantized / "model.safetensors"))[name],
                       block_dequantize(raw[name], raw[name.replace("weight", "weight_scale_inv")]))
    assert build.main([str(_yaml(tmp_path, "ref", quantized, head, "reference")), "--only", "checkpoint",
                       "--only", "engine"]) == 0
    prompts = [[5, 17, 33, 42, 9], [11, 12, 13, 14, 15, 16, 100, 7]]
    res = ReferenceEngine.from_build(tmp_path / "ref", device="cpu").generate(
        [GenerationRequest(p, 12, SamplingParams(), []) for p in prompts])
    hf = AutoModelForCausalLM.from_pretrained(str(dequantized), dtype=torch.float32)
    want = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert [r.output_ids for r in res] == want
    assert sum(r.stats.accepted_draft_tokens for r in res) > 0
    capsys.readouterr()
    assert build.main([str(_yaml(tmp_path, "gpu", quantized, head, "pytorch")), "--only", "checkpoint"]) == 0
    # TensorRT-LLM loads the published directory, its scales with it; no 16-bit copy is written
    assert f"engine.backend pytorch loads the Hugging Face target ({quantized})" in capsys.readouterr().err
    assert not list((tmp_path / "gpu" / "checkpoint").glob("rank*.safetensors"))


def test_already_quantized_targets_are_refused_where_their_scales_would_be_dropped(
        fp8_deepseek: tuple[Path, Path, Path], tiny_target: Path, eagle3_head: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    """quantization.weights on an already quantized target; a ModelOpt FP8 export (or an HF FP8 checkpoint) of a
    Llama-family target on the reference engine, whose converter reads 16-bit tensors; a ModelOpt export on the
    reference engine's generic path: each refused at --dry-run, naming the quantization and the way out."""
    import shutil

    quantized, _, head = fp8_deepseek
    again = _yaml(tmp_path, "again", quantized, head, "pytorch", quantization__weights="fp8")
    assert build.main([str(again), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "is already quantized: FP8_BLOCK_SCALES, group 128" in err and "set quantization.weights: none" in err, err
    llama = tmp_path / "llama-fp8"
    shutil.copytree(tiny_target, llama)
    (llama / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}))
    for backend in ("reference", "pytorch"):
        assert build.main([str(_yaml(tmp_path, f"llama-{backend}", llama, eagle3_head, backend)), "--dry-run"]) \
            == (2 if backend == "reference" else 0)
        err = capsys.readouterr().err
        if backend == "reference":
            assert "is already quantized: FP8 (" in err and "would cast the quantized ones without their scales" \
                in err and "engine.backend pytorch" in err, err
    (llama / "hf_quant_config.json").write_text("{broken")
    assert build.main([str(_yaml(tmp_path, "broken", llama, eagle3_head, "pytorch")), "--dry-run"]) == 2
    assert "hf_quant_config.json: not valid JSON" in capsys.readouterr().err
    modelopt_generic = tmp_path / "ds-modelopt"
    shutil.copytree(quantized, modelopt_generic)
    cfg = json.loads((modelopt_generic / "config.json").read_text())
    del cfg["quantization_config"]
    (modelopt_generic / "config.json").write_text(json.dumps(cfg))
    (modelopt_generic / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}))
    assert build.main([str(_yaml(tmp_path, "generic", modelopt_generic, head, "reference")), "--dry-run"]) == 2
    assert "generic path with quant_method fp8 and 128x128 weight blocks only" in capsys.readouterr().err


# A word of each row's reason: what ModelOpt's export or TensorRT-LLM's loader does that the build cannot follow
REFUSED = {"deepseek_v3": "kv_b_proj", "gpt_oss": "fused 3-D FP8 tensors", "qwen3_next": "gated delta-net",
           "nemotron_h": "pt_name_sentinel", "laguna": "g_proj", "deepseek_v4": "wo_a",
           "seed_oss": "which of its linears", "llama4": "is_multimodal_model"}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_modelopt_quantization_is_refused_by_name_where_the_row_is_not_covered(
        family: str, fp8_deepseek: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`quantization.weights: fp8` on a 16-bit target of a row ModelOpt's export or the mirror does not cover: refused
    at --dry-run naming the architecture, the row's reason (core/capabilities.py) and what to do instead."""
    from core.capabilities import modelopt_refusal
    from core.families import BY_NAME
    from testkit.tiny_families import make_family_target

    _, dequantized, head = fp8_deepseek
    target = dequantized if family == "deepseek_v3" else make_family_target(tmp_path / family, family)
    arch = json.loads((target / "config.json").read_text())["architectures"][0]
    cfg = _yaml(tmp_path, "q", target, head, "pytorch", quantization__weights="fp8")
    assert build.main([str(cfg), "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"this builder does not quantize {arch} ({BY_NAME[arch].label}) with ModelOpt: " in err, err
    assert " ".join(modelopt_refusal(BY_NAME[arch]).split()) in err and REFUSED[family] in err, err
    assert "quantization.weights: none" in err, err


@pytest.mark.parametrize("family", ["qwen3_moe", "glm4_moe"])
def test_moe_rows_quantize_fp8_and_refuse_nvfp4_by_name(family: str, eagle3_head: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The MoE rows ModelOpt's FP8 export covers pass the quantization preflight with FP8 weights; NVFP4 (no
    reference path for their experts) is refused naming the row and the way through."""
    from testkit.tiny_families import make_family_target

    target = make_family_target(tmp_path / family, family)
    arch = json.loads((target / "config.json").read_text())["architectures"][0]
    for weights, rc in (("fp8", 0), ("nvfp4", 2)):
        cfg = _yaml(tmp_path, weights, target, eagle3_head, "pytorch", quantization__weights=weights)
        code = build.main([str(cfg), "--dry-run"])
        err = " ".join(capsys.readouterr().err.split())
        assert "with ModelOpt" not in err, err
        assert (f"quantization.weights=nvfp4 on {arch}: this builder quantizes that row with FP8 weights" in err) == (
            weights == "nvfp4"), err
        assert code == rc, err
