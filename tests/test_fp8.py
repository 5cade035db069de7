"""FP8 (ModelOpt) calibration + TRT-LLM checkpoint export merged with the EAGLE head, on the tiny models.

Checks the structure TensorRT-LLM expects (tensorrt_llm/quantization/layers.py FP8Linear: float8_e4m3fn `weight`,
fp32 `weights_scaling_factor` / `activation_scaling_factor`; `attention.kv_cache_scaling_factor` with an FP8 KV
cache; ModelOpt export modelopt/torch/export/model_config_export.py), the 16-bit head and lm_head
(`exclude_modules`), that the FP8 weights decode to the original ones within e4m3 precision, and that the reference
engine runs the FP8 checkpoint with a sane tau.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from builders.convert import fp8
from builders.convert.stage import CONVERT_STAGE
from builders.pipeline import run_stage
from tests.engine_cases import make_cfg

PROMPTS = ["What is the capital of France?", "The quick brown fox", "Hello world! Speculative decoding",
           "EAGLE drafts tokens"]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        names = f.keys()  # a safetensors file handle, not a dict: it is not iterable
        return {k: f.get_tensor(k) for k in names}


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> dict:
    """The convert stage run twice on the tiny models: 16-bit, and with FP8 weights + FP8 KV cache calibrated on
    4 MT-bench prompts (the stage's FP8 branch: calibrate, export, merge, tau both ways)."""
    root = tmp_path_factory.mktemp("fp8")
    common = ["engine.backend=reference", "engine.device=cpu", "tree.choices=topk-2-2", "target.dtype=float16",
              f"target.model={tiny_target}", f"draft.model={eagle_head}"]
    cfg16 = make_cfg(*common, f"output_dir={root / 'b16'}")
    cfg = make_cfg(*common, f"output_dir={root / 'b8'}", "quantization.weights=fp8", "quantization.kv_cache=fp8",
                   "quantization.calibration.max_length=64", "quantization.calibration.num_samples=4")
    ckpt16, _ = run_stage(CONVERT_STAGE, cfg16, root / "b16")
    ckpt, _ = run_stage(CONVERT_STAGE, cfg, root / "b8")
    notes = json.loads((ckpt / "manifest.json").read_text())["notes"]["fp8"]
    report = fp8.Fp8Report(notes["calibration_prompts"], notes["tau_16bit"], notes["tau_fp8"], notes["max_tau_drop"])
    return {"cfg": cfg, "ckpt": ckpt, "ckpt16": ckpt16, "report": report, "notes": notes,
            "log": (root / "b8" / "logs" / "checkpoint.log").read_text()}


def test_config_quantization_block(fp8_build: dict) -> None:
    conf = json.loads((fp8_build["ckpt"] / "config.json").read_text())
    assert conf["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                    "exclude_modules": ["lm_head", "eagle_nets.*"]}
    assert conf["architecture"] == "EagleForCausalLM" and conf["eagle_deploy"]["random_head"] is False
    # examples/eagle/convert_checkpoint.py copies the block: the drafter's attention is built from eagle_net_config
    assert conf["eagle_net_config"]["quantization"] == conf["quantization"]


def test_fp8_tensor_dtypes_and_scales(fp8_build: dict) -> None:
    t = _tensors(fp8_build["ckpt"] / "rank0.safetensors")
    for i in range(2):
        for lin in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
            pre = f"transformer.layers.{i}.{lin}"
            assert t[f"{pre}.weight"].dtype == torch.float8_e4m3fn, pre
            for s in ("weights_scaling_factor", "activation_scaling_factor"):
                sf = t[f"{pre}.{s}"]
                assert sf.dtype == torch.float32 and sf.numel() == 1 and float(sf) > 0, (pre, s)
        kv = t[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"]
        assert kv.dtype == torch.float32 and float(kv) > 0
    for name in ("lm_head.weight", "transformer.vocab_embedding.weight", "transformer.ln_f.weight"):
        assert t[name].dtype == torch.float16, name


def test_head_linears_stay_16bit_and_drafter_attention_gets_kv_scales(fp8_build: dict) -> None:
    new = _tensors(fp8_build["ckpt"] / "rank0.safetensors")
    old = _tensors(fp8_build["ckpt16"] / "rank0.safetensors")
    head = [k for k in old if k.startswith("eagle_nets.")]
    for k in head:
        assert new[k].dtype == torch.float16 and torch.equal(new[k], old[k]), k
    # TensorRT-LLM's kv_cache_quantize gives EVERY Attention a kv_cache_scaling_factor, the drafter's included:
    # without these PretrainedModel.load raises "Required but not provided tensors".
    cfg = fp8_build["cfg"]
    layers = json.loads((fp8_build["ckpt"] / "config.json").read_text())["eagle_net_config"]["num_hidden_layers"]
    want = {f"eagle_nets.{k}.drafter.layers.{j}.attention.kv_cache_scaling_factor"
            for k in range(cfg.limits().num_eagle_layers) for j in range(layers)}
    got = {k for k in new if k.startswith("eagle_nets.") and "scaling_factor" in k}
    assert got == want
    scales = [float(new[k]) for k in sorted(want)]
    assert all(new[k].dtype == torch.float32 and new[k].shape == (1,) for k in want)
    assert min(scales) > 0 and len(set(scales[: layers])) >= 1 and scales[:layers] == scales[layers: 2 * layers]


def test_fp8_weights_decode_to_the_16bit_weights(fp8_build: dict) -> None:
    """w ~= fp8 * weights_scaling_factor, per tensor, within e4m3's 3-bit mantissa (rel. error <= 2^-4 of |w|,
    plus the subnormal floor scale * 2^-9); also proves the export's fc/gate mapping matches the converter's."""
    new = _tensors(fp8_build["ckpt"] / "rank0.safetensors")
    old = _tensors(fp8_build["ckpt16"] / "rank0.safetensors")
    for i in range(2):
        for lin in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
            pre = f"transformer.layers.{i}.{lin}"
            s = new[f"{pre}.weights_scaling_factor"].float()
            w8 = new[f"{pre}.weight"].float() * s
            w = old[f"{pre}.weight"].float()
            # scale = amax / 448; TRT-LLM fuses gate+up into one GEMM, so ModelOpt gives fc and gate the max of both
            fused = lin in ("mlp.fc", "mlp.gate")
            pair = [f"transformer.layers.{i}.mlp.fc", f"transformer.layers.{i}.mlp.gate"] if fused else [pre]
            amax = max(float(old[f"{p}.weight"].float().abs().max()) for p in pair)
            assert amax == pytest.approx(float(s) * 448, rel=2e-3), pre
            err = (w8 - w).abs()
            assert bool((err <= w.abs() * 2**-4 + float(s) * 2**-9 + 1e-6).all()), (pre, float(err.max()))


def test_tau_reported_and_sane(fp8_build: dict) -> None:
    rep: fp8.Fp8Report = fp8_build["report"]
    depth = fp8_build["cfg"].limits().num_eagle_layers
    assert rep.prompts == 4 and fp8_build["notes"]["tau_prompts"] == 4
    assert 1.0 <= rep.tau_16bit <= 1 + depth and 1.0 <= rep.tau_fp8 <= 1 + depth
    assert f"FP8: tau 16-bit {rep.tau_16bit:.3f} vs FP8 {rep.tau_fp8:.3f} on 4 calibration prompts" in fp8_build["log"]
    assert fp8_build["notes"]["max_tau_drop"] == 0.1


def test_calibration_prompts_from_both_sets() -> None:
    mt = fp8.calibration_prompts(make_cfg("quantization.calibration.num_samples=3"))
    assert len(mt) == 3 and all(isinstance(p, str) and p for p in mt)
    sg = fp8.calibration_prompts(make_cfg("quantization.calibration.num_samples=2",
                                          "quantization.calibration.dataset=sharegpt"))
    assert len(sg) == 2 and sg != mt[:2]
    with pytest.raises(fp8.Fp8Error, match="num_samples=81 but mtbench has only 80 prompts"):
        fp8.calibration_prompts(make_cfg("quantization.calibration.num_samples=81"))


def test_fp8_speculative_output_equals_fp8_target_only(fp8_build: dict, tiny_target: Path) -> None:
    """Greedy speculative decoding is lossless on the FP8 checkpoint too (the head only proposes)."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    cfg = fp8_build["cfg"]
    eng = ReferenceEngine.from_checkpoint(fp8_build["ckpt"], tree=cfg.static_tree(), dtype="float16", device="cpu")
    ids = [t[0].tolist() for t in fp8.encode_prompts(eng.tokenizer, PROMPTS[:2], 64)]
    reqs = [GenerationRequest(prompt_ids=i, max_new_tokens=12, sampling=SamplingParams(), stop_token_ids=[])
            for i in ids]
    spec = eng.generate(reqs, speculative=True)
    plain = eng.generate(reqs, speculative=False)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]


def test_report_warning_threshold() -> None:
    assert fp8.Fp8Report(8, 2.0, 1.9, 0.1).warning is None
    w = fp8.Fp8Report(8, 2.0, 1.5, 0.1).warning
    assert w is not None and "FP8 costs 25.0% of tau (2.000 -> 1.500)" in w and "max_tau_drop=10%" in w


def test_merge_refuses_layout_mismatch() -> None:
    f8 = torch.float8_e4m3fn
    ours = {"transformer.layers.0.mlp.proj.weight": torch.zeros(4, 2), "eagle_nets.0.x": torch.zeros(1)}
    with pytest.raises(fp8.Fp8Error, match=r"FP8 export has transformer.layers.0.mlp.proj.weight \(3, 2\) but the "
                                           r"checkpoint has \(4, 2\)"):
        fp8.merge_rank(ours, {"transformer.layers.0.mlp.proj.weight": torch.zeros(3, 2, dtype=f8)}, "rank0")
    ours["transformer.layers.0.mlp.fc.weight"] = torch.zeros(4, 2)
    with pytest.raises(fp8.Fp8Error, match=r"did not quantize \['transformer.layers.0.mlp.fc.weight'\]"):
        fp8.merge_rank(ours, {"transformer.layers.0.mlp.proj.weight": torch.zeros(4, 2, dtype=f8),
                              "transformer.layers.0.mlp.proj.weights_scaling_factor": torch.ones(1)}, "rank0")
    # same shape, rows in another order (what a different tp split of q/k/v would produce): refused
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    swapped = {"transformer.layers.0.mlp.proj.weight": w.flip(0).to(f8),
               "transformer.layers.0.mlp.proj.weights_scaling_factor": torch.ones(1)}
    with pytest.raises(fp8.Fp8Error, match="does not dequantize to the checkpoint's 16-bit weight"):
        fp8.merge_rank({"transformer.layers.0.mlp.proj.weight": w}, swapped, "rank0")


def test_problems() -> None:
    assert fp8.fp8_problems(
        make_cfg("quantization.weights=fp8", "target.dtype=float32", "engine.backend=reference")
    ) == [
        "quantization with target.dtype=float32: FP8 checkpoints keep 16-bit activations and non-quantized "
        "tensors; set target.dtype to float16 or bfloat16"
    ]
    assert fp8.fp8_problems(make_cfg()) == []


def test_tp2_fp8_export_matches_the_converter_layout(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    """Under tp=2 ModelOpt shards the FP8 linears itself; every shard must dequantize to our converter's shard of
    the same name (merge_rank checks it element-wise), embeddings stay replicated as our config.json says."""
    cfg = make_cfg("engine.backend=reference", "tree.choices=chain-2", "target.dtype=bfloat16", "parallel.tp=2",
                   f"target.model={tiny_target}", f"draft.model={eagle_head}", f"output_dir={tmp_path}",
                   "quantization.weights=fp8", "quantization.calibration.num_samples=2",
                   "quantization.calibration.max_length=32")
    out, _ = run_stage(CONVERT_STAGE, cfg, tmp_path)
    for r in range(2):
        t = _tensors(out / f"rank{r}.safetensors")
        assert t["transformer.layers.1.attention.qkv.weight"].dtype == torch.float8_e4m3fn
        assert tuple(t["transformer.vocab_embedding.weight"].shape) == (320, 64)  # replicated, as converted
        assert t["eagle_nets.0.drafter.fc.weight"].dtype == torch.bfloat16
    log = (tmp_path / "logs" / "checkpoint.log").read_text()
    assert "tau NOT measured (parallel.tp=2" in log
    notes = json.loads((out / "manifest.json").read_text())["notes"]["fp8"]
    assert notes["tau_16bit"] is None and notes["tau_prompts"] == 0


def test_base_model_without_chat_template_calibrates_on_raw_text(tmp_path: Path, tiny_target: Path,
                                                                 eagle_head: Path) -> None:
    """A base model's tokenizer has no chat template: calibration (and the tau check) use the raw prompt text
    instead of stopping with 'the tokenizer has no chat_template'."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_target, base)
    (base / "chat_template.jinja").unlink()
    tok_cfg = json.loads((base / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    assert fp8.prompt_format(tok) == "raw"
    ids = fp8.encode_prompts(tok, ["The quick brown fox"], 64)[0][0].tolist()
    assert ids == tok("The quick brown fox", add_special_tokens=True)["input_ids"]
    cfg = make_cfg("engine.backend=reference", "engine.device=cpu", "tree.choices=topk-2-2", "target.dtype=float16",
                   f"target.model={base}", f"draft.model={eagle_head}", f"output_dir={tmp_path / 'b'}",
                   "quantization.kv_cache=fp8", "quantization.calibration.max_length=32",
                   "quantization.calibration.num_samples=2")
    ckpt, _ = run_stage(CONVERT_STAGE, cfg, tmp_path / "b")
    notes = json.loads((ckpt / "manifest.json").read_text())["notes"]["fp8"]
    assert notes["prompt_format"] == "raw" and notes["tau_fp8"] is not None
    assert "calibrated on the raw prompt text" in (tmp_path / "b" / "logs" / "checkpoint.log").read_text()


def test_fp8_drafter_variant_decodes_loads_and_stays_lossless(fp8_build: dict, tmp_path: Path) -> None:
    """The measurement-only FP8 drafter (bench/bench_fp8_drafter.py): drafter amax observed on the 16-bit
    checkpoint, linears rewritten as FP8Linear tensors that decode to the 16-bit weights, exclude_modules narrowed to
    the lm_heads in both quantization blocks, and the reference engine runs it losslessly."""
    import shutil

    from builders.convert.fp8_drafter import LINEARS, calibrate_drafter, write_fp8_drafter
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    cfg = fp8_build["cfg"]
    n = cfg.limits().num_eagle_layers
    stats = calibrate_drafter(fp8_build["ckpt16"], cfg.static_tree(), "float16", "cpu",
                              lambda tok: [t[0].tolist() for t in fp8.encode_prompts(tok, PROMPTS[:2], 32)], 6)
    assert stats.kv and all(v > 0 for v in stats.kv.values()) and stats.inputs["fc"] > 0
    ck = tmp_path / "checkpoint"
    shutil.copytree(fp8_build["ckpt"], ck)
    write_fp8_drafter(ck, stats, n)
    conf = json.loads((ck / "config.json").read_text())
    want_ex = ["lm_head"] + [f"eagle_nets.{i}.lm_head" for i in range(n)]
    assert (
        conf["quantization"]["exclude_modules"]
        == want_ex
        == conf["eagle_net_config"]["quantization"]["exclude_modules"]
    )
    new, old = _tensors(ck / "rank0.safetensors"), _tensors(fp8_build["ckpt16"] / "rank0.safetensors")
    layers = conf["eagle_net_config"]["num_hidden_layers"]
    for k in range(n):
        for lin in ["fc"] + [f"layers.{j}.{x}" for j in range(layers) for x in LINEARS]:
            pre = f"eagle_nets.{k}.drafter.{lin}"
            s = new[f"{pre}.weights_scaling_factor"].float()
            assert (
                new[f"{pre}.weight"].dtype == torch.float8_e4m3fn and float(new[f"{pre}.activation_scaling_factor"]) > 0
            )
            w = old[f"{pre}.weight"].float()
            err = (new[f"{pre}.weight"].float() * s - w).abs()
            assert bool((err <= w.abs() * 2**-4 + float(s) * 2**-9 + 1e-6).all()), pre
        assert new[f"eagle_nets.{k}.lm_head.weight"].dtype == torch.float16
    eng = ReferenceEngine.from_checkpoint(ck, tree=cfg.static_tree(), dtype="float16", device="cpu")
    ids = [t[0].tolist() for t in fp8.encode_prompts(eng.tokenizer, PROMPTS[:2], 64)]
    reqs = [GenerationRequest(prompt_ids=i, max_new_tokens=10, sampling=SamplingParams(), stop_token_ids=[])
            for i in ids]
    spec, plain = eng.generate(reqs, speculative=True), eng.generate(reqs, speculative=False)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
