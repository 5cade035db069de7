"""FP8 / NVFP4 targets on the current line (trtllm_version 1.4): ModelOpt's Hugging Face export of a tiny random
target, checked against the loader rules cited in the ledger (ledger/hf_quant.py: hf_quant_config.json
keys, tensor names and dtypes, excluded modules, K/V scales), pointed at by the LLM API options and the llmapi model;
the reference backend's copy holds the weights exactly as the PyTorch backend's loader leaves them (fused q/k/v and
gate/up requantized to the largest scale), is served through the real Triton server, and its acceptance is compared
with the 16-bit target's in the build report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from ledger import check as ledger_check
from builders.build import main as build_main
from builders.config import load_config
from builders.convert import hf_quant
from testkit import tiny_models as tm
from tests.engine_cases import make_cfg, write_build_yaml

QUANT = {"weights": "fp8", "kv_cache": "fp8", "calibration": {"num_samples": 4, "max_length": 64}}
ENGINE = {"max_batch_size": 2, "max_input_len": 128, "max_seq_len": 256, "device": "cpu"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hfq_pair")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg = json.loads((head / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # TensorRT-LLM needs three distinct layers
    (head / "config.json").write_text(json.dumps(cfg))
    return target, head


def _build(root: Path, pair: tuple[Path, Path], backend: str, quant: dict[str, Any] | None) -> tuple[Any, Path]:
    out = root / "build"
    sections = {"quantization": quant} if quant else {}
    cfg = write_build_yaml(root / "c.yaml", output_dir=out, target=pair[0], head=pair[1], draft="eagle3",
                           backend=backend, tree="chain-3", name=f"hfq-{backend}", version="1.4",
                           engine=ENGINE if backend == "reference" else None, **sections)
    assert build_main([str(cfg)]) == 0
    return load_config(cfg), out


@pytest.fixture(scope="module")
def pytorch_fp8(tmp_path_factory: pytest.TempPathFactory, pair: tuple[Path, Path]) -> tuple[Any, Path]:
    return _build(tmp_path_factory.mktemp("hfq_pt"), pair, "pytorch", QUANT)


@pytest.fixture(scope="module")
def reference_fp8(tmp_path_factory: pytest.TempPathFactory, pair: tuple[Path, Path]) -> tuple[Any, Path]:
    return _build(tmp_path_factory.mktemp("hfq_ref"), pair, "reference", QUANT)


def test_export_is_what_the_loader_reads_and_what_the_options_point_at(pytorch_fp8: tuple[Any, Path]) -> None:
    cfg, out = pytorch_fp8
    export = out / "checkpoint" / "hf_quantized"
    q = json.loads((export / "hf_quant_config.json").read_text())["quantization"]
    assert (q["quant_algo"], q["kv_cache_quant_algo"]) == ("FP8", "FP8") and "lm_head" in q["exclude_modules"]
    assert hf_quant.loader_problems(export, weights="fp8", kv_fp8=True, layers=4) == []
    t = load_file(str(export / "model.safetensors"))
    assert t["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert t["model.layers.3.mlp.down_proj.input_scale"].dtype == torch.float32
    assert t["lm_head.weight"].dtype == torch.float16 and (export / "tokenizer.json").is_file()
    emitted = ledger_check.build_names(cfg, out)
    assert {"hf_quant.config", "hf_quant.inline", "hf_quant.tensor"} <= set(emitted)
    flags = ledger_check.build_flags(cfg, out / "checkpoint")
    assert ledger_check.check_emitted(emitted, "1.4", flags) == []
    # the serving path loads the export: trtllm-serve's model and tokenizer, and the llmapi model's `model`
    serve = json.loads((out / "engine" / "trtllm_serve.json").read_text())["argv"]
    assert serve[1] == serve[3] == str(export)
    doc = yaml.safe_load((out / "triton_repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert (out / "triton_repo" / doc["model"]).resolve() == export.resolve()
    assert not list(out.rglob("rank*.safetensors"))  # the 16-bit and reference copies were temporary
    notes = json.loads((out / "checkpoint" / "manifest.json").read_text())["notes"]
    assert notes["trtllm_model_dir"] == "checkpoint/hf_quantized" and notes["quantization"]["held_out_prompts"] == 8


def test_loader_rules_bite(pytorch_fp8: tuple[Any, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(pytorch_fp8[1] / "checkpoint" / "hf_quantized", bad)
    t = load_file(str(bad / "model.safetensors"))
    t["model.layers.1.self_attn.o_proj.weight_scale"] = t["model.layers.1.self_attn.o_proj.weight_scale"].half()
    del t["model.layers.2.self_attn.v_proj.v_scale"]
    save_file(t, str(bad / "model.safetensors"))
    qc = json.loads((bad / "hf_quant_config.json").read_text())
    qc["quantization"]["exclude_modules"] = ["model.embed_tokens"]
    (bad / "hf_quant_config.json").write_text(json.dumps(qc))
    assert hf_quant.loader_problems(bad, weights="fp8", kv_fp8=True, layers=4) == [
        "hf_quant_config.json: lm_head is quantized; this builder keeps it 16-bit (exclude_modules)",
        f"{bad}: model.layers.1.self_attn.o_proj.weight_scale is torch.float16; a scale is float32",
        "model.layers.1.self_attn.o_proj.weight_scale: torch.float16, expected torch.float32",
        "model.layers.2.self_attn.v_proj.v_scale: missing or not a float32 scalar (the FP8 KV cache scale)",
    ]
    assert hf_quant.loader_problems(bad, weights="nvfp4", kv_fp8=True, layers=4)[0] == (
        "hf_quant_config.json: quant_algo='FP8', expected 'NVFP4'")


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf"), float("-inf"), -1.0])
def test_export_check_and_ledger_check_refuse_scales_that_are_not_finite_and_positive(
        pytorch_fp8: tuple[Any, Path], tmp_path: Path, value: float, capsys: pytest.CaptureFixture) -> None:
    """A weight, activation or KV-cache scale of 0, NaN, +-inf or -1 in the export: the build's export check and
    `eagle-ledger-check` (python -m ledger.check) both name the tensor and its value."""
    cfg, build = pytorch_fp8
    copy = tmp_path / "build"
    shutil.copytree(build, copy, symlinks=True)
    export = copy / "checkpoint" / "hf_quantized"
    t = load_file(str(export / "model.safetensors"))
    names = ["model.layers.0.mlp.down_proj.weight_scale", "model.layers.1.self_attn.q_proj.input_scale",
             "model.layers.3.self_attn.k_proj.k_scale"]
    for n in names:
        t[n] = torch.tensor(value)
    save_file(t, str(export / "model.safetensors"))
    got = hf_quant.loader_problems(export, weights="fp8", kv_fp8=True, layers=4)
    for n in names:
        assert any(f"{export}: {n} holds {value!r}; a quantization scale is finite and positive" in m for m in got), got
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text(yaml.safe_dump({**cfg.model_dump(mode="json", exclude_unset=True), "output_dir": str(copy)}))
    assert ledger_check.main([str(yaml_path)]) == 1
    out = capsys.readouterr().out
    assert all(f"{n} holds {value!r}" in out for n in names), out


@pytest.mark.parametrize(("edit", "error"), [
    (lambda q: q.update(quant_algo="fp8"), "quant_algo='fp8': not one of"),
    (lambda q: q.pop("kv_cache_quant_algo"), "quantization.kv_cache_quant_algo is missing"),
    (lambda q: q.update(exclude_modules="lm_head"), "exclude_modules='lm_head': expected a list"),
    (lambda q: q.update(kv_cache_quant_algo="FP16"), "kv_cache_quant_algo='FP16': not one of FP8, INT8, NVFP4"),
    (None, "hf_quant_config.json: [Errno 2]"),
])
def test_export_check_and_ledger_check_refuse_bad_quant_configs(pytorch_fp8: tuple[Any, Path], tmp_path: Path,
                                                                edit: Any, error: str,
                                                                capsys: pytest.CaptureFixture) -> None:
    """hf_quant_config.json as TensorRT-LLM reads it (QuantAlgo names, kv_cache_quant_algo present, exclude_modules a
    list) or deleted: both checks name the problem."""
    cfg, build = pytorch_fp8
    copy = tmp_path / "build"
    shutil.copytree(build, copy, symlinks=True)
    f = copy / "checkpoint" / "hf_quantized" / "hf_quant_config.json"
    if edit is None:
        f.unlink()
    else:
        qc = json.loads(f.read_text())
        edit(qc["quantization"])
        f.write_text(json.dumps(qc))
    export = f.parent
    if edit is None:
        with pytest.raises(Exception, match=re.escape(error)):
            hf_quant.loader_problems(export, weights="fp8", kv_fp8=True, layers=4)
    else:
        assert any(error in m for m in hf_quant.loader_problems(export, weights="fp8", kv_fp8=True, layers=4))
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text(yaml.safe_dump({**cfg.model_dump(mode="json", exclude_unset=True), "output_dir": str(copy)}))
    assert ledger_check.main([str(yaml_path)]) == 1
    assert error in capsys.readouterr().out


def test_reference_copy_holds_the_weights_as_the_pytorch_backend_loads_them(pytorch_fp8: tuple[Any, Path],
                                                                            pair: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    from builders.convert.llama import convert_llama

    export = pytorch_fp8[1] / "checkpoint" / "hf_quantized"
    ck16 = tmp_path / "ck16"
    convert_llama(pair[0], ck16, dtype="float16")
    hf_quant.reference_checkpoint(ck16, export, tmp_path / "ref", weights="fp8", kv_fp8=True, dtype="float16")
    ref, t = load_file(str(tmp_path / "ref" / "rank0.safetensors")), load_file(str(export / "model.safetensors"))
    pre = "model.layers.2.self_attn"
    scales = [t[f"{pre}.{p}_proj.weight_scale"].float() for p in "qkv"]
    smax = max(float(s) for s in scales)
    assert float(ref["transformer.layers.2.attention.qkv.weights_scaling_factor"]) == pytest.approx(smax, rel=0)
    parts = []
    for p, s in zip("qkv", scales):  # FP8QDQLinearMethod.rescale_fused_weights, written out independently
        w = t[f"{pre}.{p}_proj.weight"].to(torch.float16) * s.to(torch.float16)
        parts.append((w.float() / smax).to(torch.float16).to(torch.float8_e4m3fn))
    got = ref["transformer.layers.2.attention.qkv.weight"]
    assert got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), torch.cat(parts).view(torch.uint8))
    acts = [float(t[f"{pre}.{p}_proj.input_scale"]) for p in "qkv"]
    assert float(ref["transformer.layers.2.attention.qkv.activation_scaling_factor"]) == max(acts)
    # the PyTorch backend keeps the FP8 KV cache scale at 1.0 whatever k_scale / v_scale say
    assert float(t[f"{pre}.k_proj.k_scale"]) != 1.0
    assert float(ref["transformer.layers.2.attention.kv_cache_scaling_factor"]) == 1.0
    down = "model.layers.0.mlp.down_proj"
    assert torch.equal(ref["transformer.layers.0.mlp.proj.weight"].view(torch.uint8),
                       t[f"{down}.weight"].view(torch.uint8))
    conf = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert conf["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}


def test_reference_backend_serves_it_through_triton_and_reports_tau_against_16bit(
        reference_fp8: tuple[Any, Path]) -> None:
    pytest.importorskip("tritonclient.grpc")
    from clients import schema as sch
    from clients.client import LLMClient
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
    from triton_repo.launch import TritonServer, free_port

    cfg, out = reference_fp8
    notes = json.loads((out / "checkpoint" / "manifest.json").read_text())["notes"]["quantization"]
    assert notes["held_out_prompts"] == 8 and notes["tau_16bit"] >= 1.0 and notes["tau_fp8"] >= 1.0
    assert notes["relative_drop"] == pytest.approx((notes["tau_16bit"] - notes["tau_fp8"]) / notes["tau_16bit"])
    log = (out / "logs" / "checkpoint.log").read_text()
    assert f"FP8: tau 16-bit {notes['tau_16bit']:.3f} vs FP8 {notes['tau_fp8']:.3f} on 8 held-out prompts" in log
    assert json.loads((out / "checkpoint" / "config.json").read_text())["quantization"]["quant_algo"] == "FP8"
    eng = ReferenceEngine.from_build(out, device="cpu")
    tok = eng.tokenizer
    prompt = "The quick brown fox"
    req = GenerationRequest(prompt_ids=tok.encode(prompt), max_new_tokens=12, sampling=SamplingParams(),
                            stop_token_ids=[])
    (res,) = eng.generate([req], speculative=False)
    srv = TritonServer(out / "triton_repo", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                       log_path=out / "tritonserver.log")
    srv.start(timeout_s=300)
    try:
        with LLMClient(srv.grpc_url, schema=sch.from_repository(out / "triton_repo")) as c:
            served = c.generate(prompt, max_tokens=12)
            stats = c.last_stats
    finally:
        assert srv.stop() == 0
    # the served FP8 target decodes what the FP8 reference engine decodes without speculation (lossless)
    assert served.text == tok.decode(res.output_ids, skip_special_tokens=True)
    assert stats is not None and stats.draft_tokens > 0


def test_nvfp4_export_dequantizes_and_is_refused_off_the_current_line(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    export = tmp_path / "nvfp4"
    hf_quant.export_quantized(pair[0], export, weights="nvfp4", kv_fp8=False, dtype="float16",
                              prompts=["The quick brown fox", "Hello world"], max_length=32)
    assert hf_quant.loader_problems(export, weights="nvfp4", kv_fp8=False, layers=4) == []
    t, w16 = load_file(str(export / "model.safetensors")), load_file(str(pair[0] / "model.safetensors"))
    m = "model.layers.1.mlp.up_proj"
    assert t[f"{m}.weight"].dtype == torch.uint8 and t[f"{m}.weight_scale"].dtype == torch.float8_e4m3fn
    deq = hf_quant.nvfp4_dequantize(t[f"{m}.weight"], t[f"{m}.weight_scale"], t[f"{m}.weight_scale_2"])
    w = w16[f"{m}.weight"].float()
    assert deq.shape == w.shape and float((deq - w).norm() / w.norm()) < 0.2  # 4-bit: coarse, but the same matrix
    with pytest.raises(ValueError, match="NVFP4 is written as ModelOpt's Hugging Face checkpoint for the current"):
        make_cfg("trtllm_version=1.2", "quantization.weights=nvfp4")


def test_bench_quant_tau_script(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """bench/bench_quant_tau.py (docs/fp8.md) on the tiny pair: 16-bit and FP8 builds, tau on held-out prompts."""
    import subprocess
    import sys

    cfg = write_build_yaml(tmp_path / "c.yaml", output_dir=tmp_path / "unused", target=pair[0], head=pair[1],
                           draft="eagle3", backend="pytorch", tree="chain-3", name="tau", version="1.4",
                           quantization=QUANT)
    script = Path(__file__).resolve().parent.parent / "bench" / "bench_quant_tau.py"
    # --out relative to where it runs (as docs/fp8.md writes it), not to the config file
    proc = subprocess.run([sys.executable, str(script), str(cfg), "--out", "out", "--prompts", "2",
                           "--max-new-tokens", "4", "--set", "engine.device=cpu", "--set", "engine.max_batch_size=2"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 held-out MT-bench prompts (questions 5..6)" in proc.stdout and "| fp8 | " in proc.stdout
    taus = json.loads((tmp_path / "out" / "tau.json").read_text())["tau"]
    assert set(taus) == {"16-bit", "fp8"} and all(t >= 1.0 for t in taus.values())
