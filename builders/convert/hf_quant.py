"""FP8 / NVFP4 targets on the current line: ModelOpt post-training quantization exported as a Hugging Face checkpoint
in ModelOpt's unified format, the directory TensorRT-LLM's PyTorch backend loads (trtllm_version 1.4).

1. `export_quantized`: the HF target in float32, `mtq.quantize` with ModelOpt's FP8_DEFAULT_CFG or NVFP4_DEFAULT_CFG
   (+ FP8_KV_CFG for an FP8 KV cache) over the calibration prompts (builders/convert/fp8.py: the same prompts, chat
   formatted), cast to target.dtype and written by `modelopt.torch.export.export_hf_checkpoint`: `config.json` (with
   an inline `quantization_config`), `hf_quant_config.json`, `model*.safetensors`; the target's tokenizer files are
   copied next to them (trtllm-serve --tokenizer and the Triton llmapi model read that directory).
2. `loader_problems`: the export checked against what TensorRT-LLM's loader reads (the ledger rows `hf_quant.*`,
   ledger/hf_quant.py): hf_quant_config.json keys, tensor names and dtypes per quantized linear,
   unquantized (excluded) modules kept 16-bit, the K/V scales of an FP8 KV cache.
3. `reference_checkpoint`: the same weights as TensorRT-LLM's PyTorch backend holds them after loading, as this
   project's TRT-LLM-layout checkpoint for the reference engine. FP8: q/k/v and gate/up are fused upstream, which
   requantizes each part to the largest weight_scale of the group (fp8 -> 16-bit * own scale / max scale -> fp8) and
   takes the largest input_scale (tensorrt_llm/_torch/modules/linear.py FP8QDQLinearMethod.rescale_fused_weights);
   the reference checkpoint holds exactly those FP8 tensors and scales. The FP8 KV cache is scaled by 1.0: the
   PyTorch backend's TrtllmAttention keeps kv_cache_scaling_factor at ones(1) and never overrides it
   (tensorrt_llm/_torch/attention_backend/trtllm.py); the export's k_scale / v_scale are loaded
   (FP8QDQLinearMethod.load_kv_scales) but used for an NVFP4 KV cache only (modules/linear.py, "K, V scales for NVFP4
   KV cache"), so the reference copy stores 1.0 and the acceptance check measures the cache as served.
   NVFP4: the weights dequantized (e2m1 value x fp8 block scale x weight_scale_2) into 16-bit; activations are not
   fake-quantized (the reference engine has no NVFP4 activation path), which the report says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from builders.convert.fp8 import DTYPES, Fp8Error, calibrate_model
from builders.convert.tokenizer import write_tokenizer_files

QUANT_CONFIG = "hf_quant_config.json"
ALGO = {"fp8": "FP8", "nvfp4": "NVFP4"}
NVFP4_GROUP = 16
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
# HF linear -> this project's TRT-LLM-layout name (builders/convert/llama.py), and the fused groups upstream loads
TRT_NAME = {"self_attn.o_proj": "attention.dense", "mlp.gate_proj": "mlp.fc", "mlp.up_proj": "mlp.gate",
            "mlp.down_proj": "mlp.proj"}
KV_SCALE_AS_SERVED = 1.0  # TrtllmAttention.kv_cache_scaling_factor on the PyTorch backend (ledger: hf_quant.kv_scale)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def export_quantized(hf_dir: Path, out: Path, *, weights: str, kv_fp8: bool, dtype: str, prompts: list[str],
                     max_length: int) -> None:
    """Calibrate and export `hf_dir` into `out` (a new directory) with the tokenizer files."""
    import warnings

    from modelopt.torch.export import export_hf_checkpoint

    model = calibrate_model(hf_dir, prompts, max_length, weights, kv_fp8)
    model = model.to(DTYPES[dtype])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_hf_checkpoint(model, dtype=DTYPES[dtype], export_dir=out)
    del model
    write_tokenizer_files(hf_dir, out)


def read_quant_config(export: Path) -> dict[str, Any]:
    f = export / QUANT_CONFIG
    try:
        return dict(json.loads(f.read_text()))
    except (OSError, ValueError) as e:
        raise Fp8Error(f"{f}: {e}; the ModelOpt export did not write its quantization config") from e


def _tensors(export: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(export.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _excluded(module: str, patterns: list[str]) -> bool:
    import fnmatch

    return any(module == p or module.startswith(p + ".") or fnmatch.fnmatch(module, p) for p in patterns)


SCALES = ("weight_scale", "input_scale", "k_scale", "v_scale", "weight_scale_2", "weight_scale_inv",
          "weights_scaling_factor", "activation_scaling_factor", "kv_cache_scaling_factor")


def scale_problems(t: dict[str, torch.Tensor], where: Path) -> list[str]:
    """Every quantization scale (HF export or TensorRT-LLM checkpoint names) finite and positive, float32 (NVFP4's
    e4m3 block scales finite and not negative: an all-zero block has scale 0)."""
    p = []
    for name in sorted(t):
        key = name.rsplit(".", 1)[-1]
        if key not in SCALES:
            continue
        s = t[name]
        block = key == "weight_scale" and s.dtype == torch.float8_e4m3fn and s.dim() == 2
        if s.dtype != torch.float32 and not block:
            p.append(f"{where}: {name} is {s.dtype}; a scale is float32")
            continue
        f = s.float()
        bad = f[~(torch.isfinite(f) & ((f >= 0) if block else (f > 0)))]
        if bad.numel():
            p.append(f"{where}: {name} holds {float(bad.flatten()[0])!r}; a quantization scale is finite and "
                     "positive (re-calibrate or re-export)")
    return p


def quant_section(export: Path) -> tuple[list[str], dict[str, Any] | None]:
    """The problems TensorRT-LLM's reading of hf_quant_config.json finds (core/quant.py), and its `quantization`
    section (None when there is none: the problems then say so)."""
    from core.quant import QuantConfigError, checkpoint_quant

    p: list[str] = []
    raw = read_quant_config(export)
    try:
        checkpoint_quant({}, raw, str(export))
    except QuantConfigError as e:
        p.append(str(e))
    q = raw.get("quantization")
    if not isinstance(q, dict):
        return p or [f"{export / QUANT_CONFIG}: no `quantization` section"], None
    return p, q


def loader_problems(export: Path, *, weights: str, kv_fp8: bool, layers: int) -> list[str]:
    """Where the export departs from what TensorRT-LLM's PyTorch backend loads (the `hf_quant.*` ledger rows): the
    hf_quant_config.json keys as TensorRT-LLM reads them (core/quant.py), the tensors, and every scale's value."""
    p, q = quant_section(export)
    if q is None:
        return p
    want_algo = ALGO.get(weights)
    if q.get("quant_algo") != want_algo:
        p.append(f"{QUANT_CONFIG}: quant_algo={q.get('quant_algo')!r}, expected {want_algo!r}")
    if q.get("kv_cache_quant_algo") != ("FP8" if kv_fp8 else None):
        p.append(f"{QUANT_CONFIG}: kv_cache_quant_algo={q.get('kv_cache_quant_algo')!r}")
    if weights == "nvfp4" and q.get("group_size") != NVFP4_GROUP:
        p.append(f"{QUANT_CONFIG}: group_size={q.get('group_size')!r}; TensorRT-LLM's NVFP4 takes {NVFP4_GROUP}")
    exclude = q.get("exclude_modules") or []
    if not isinstance(exclude, list):
        return p  # named by checkpoint_quant
    if weights != "none" and "lm_head" not in exclude:
        p.append(f"{QUANT_CONFIG}: lm_head is quantized; this builder keeps it 16-bit (exclude_modules)")
    t = _tensors(export)
    p += scale_problems(t, export)
    for i in range(layers):
        for lin in LINEARS:
            m = f"model.layers.{i}.{lin}"
            p += _linear_problems(t, m, weights if not _excluded(m, exclude) else "none")
        if weights == "nvfp4" and not p:
            p += _shared_scale_problems(t, f"model.layers.{i}")
        if kv_fp8:
            for kv, proj in (("k_scale", "k_proj"), ("v_scale", "v_proj")):
                name = f"model.layers.{i}.self_attn.{proj}.{kv}"
                if name not in t or t[name].dtype != torch.float32 or t[name].numel() != 1:
                    p.append(f"{name}: missing or not a float32 scalar (the FP8 KV cache scale)")
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        if name in t and t[name].dtype not in (torch.float16, torch.bfloat16):
            p.append(f"{name} is {t[name].dtype}; an excluded module stays 16-bit")
    return p


def _shared_scale_problems(t: dict[str, torch.Tensor], layer: str) -> list[str]:
    """NVFP4LinearMethod.load_weight_scales asserts one input_scale (and takes one weight_scale_2) per fused group."""
    p = []
    for group in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
        for key in ("input_scale", "weight_scale_2"):
            values = {float(t[f"{layer}.{m}.{key}"].float().reshape(())) for m in group}
            if len(values) > 1:
                p.append(f"{layer}: {key} differs across the fused {'/'.join(m.split('.')[-1] for m in group)} "
                         f"({sorted(values)}); TensorRT-LLM loads one per fused group")
    return p


def _linear_problems(t: dict[str, torch.Tensor], m: str, algo: str) -> list[str]:
    w = t.get(f"{m}.weight")
    if w is None:
        return [f"{m}.weight: missing"]
    if algo == "none":
        return [] if w.dtype in (torch.float16, torch.bfloat16) else [f"{m}.weight is {w.dtype}, expected 16-bit"]
    want = {"fp8": {"weight": torch.float8_e4m3fn, "weight_scale": torch.float32, "input_scale": torch.float32},
            "nvfp4": {"weight": torch.uint8, "weight_scale": torch.float8_e4m3fn, "weight_scale_2": torch.float32,
                      "input_scale": torch.float32}}[algo]
    p = [f"{m}.{k}: {'missing' if f'{m}.{k}' not in t else t[f'{m}.{k}'].dtype}, expected {dt}"
         for k, dt in want.items() if f"{m}.{k}" not in t or t[f"{m}.{k}"].dtype != dt]
    if not p and algo == "fp8" and (t[f"{m}.weight_scale"].numel() != 1 or t[f"{m}.input_scale"].numel() != 1):
        p.append(f"{m}: FP8 weight_scale / input_scale must be per-tensor scalars (FP8QDQLinearMethod)")
    if not p and algo == "nvfp4":
        rows, packed = w.shape
        if tuple(t[f"{m}.weight_scale"].shape) != (rows, packed * 2 // NVFP4_GROUP):
            p.append(f"{m}.weight_scale has shape {tuple(t[f'{m}.weight_scale'].shape)}, expected "
                     f"({rows}, {packed * 2 // NVFP4_GROUP}): one e4m3 scale per {NVFP4_GROUP} weights")
    return p


# ---- the weights as the PyTorch backend holds them, for the reference engine --------------------------------------


def _rescaled(parts: list[tuple[torch.Tensor, torch.Tensor]], dt: torch.dtype) -> tuple[list[torch.Tensor], Any]:
    """FP8QDQLinearMethod.rescale_fused_weights: each fp8 part -> dtype, x its scale, / the group's largest scale,
    -> fp8; the group's weight_scale is that largest one."""
    smax = torch.stack([s.reshape(()) for _, s in parts]).max()
    out = []
    for w8, s in parts:
        w = w8.to(dt)
        w.mul_(s.reshape(()))
        w.div_(smax)
        out.append(w.to(torch.float8_e4m3fn))
    return out, smax.reshape(())


def nvfp4_dequantize(packed: torch.Tensor, block_scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """float32 weights of an NVFP4 tensor: two e2m1 codes per byte (low nibble first), one e4m3 scale per 16."""
    lo, hi = (packed & 0x0F).long(), (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    vals = E2M1[codes]
    scales = block_scale.float().repeat_interleave(NVFP4_GROUP, dim=1)
    return vals * scales * scale_2.float().reshape(())


def reference_tensors(export: Path, ours: dict[str, torch.Tensor], *, weights: str, kv_fp8: bool, layers: int,
                      dtype: str) -> dict[str, torch.Tensor]:
    """Our 16-bit rank-0 tensors with every quantized target linear replaced as the PyTorch backend loads it."""
    dt = DTYPES[dtype]
    t = _tensors(export)
    exclude = (read_quant_config(export).get("quantization") or {}).get("exclude_modules") or []
    out = dict(ours)
    for i in range(layers):
        hf, trt = f"model.layers.{i}", f"transformer.layers.{i}"
        if weights == "nvfp4":
            deq = {lin: nvfp4_dequantize(t[f"{hf}.{lin}.weight"], t[f"{hf}.{lin}.weight_scale"],
                                         t[f"{hf}.{lin}.weight_scale_2"]).to(dt) for lin in LINEARS
                   if not _excluded(f"{hf}.{lin}", exclude)}
            if len(deq) != len(LINEARS):
                raise Fp8Error(f"{export}: layer {i} leaves some linears unquantized; not supported for NVFP4")
            out[f"{trt}.attention.qkv.weight"] = torch.cat([deq[f"self_attn.{x}_proj"] for x in "qkv"])
            for lin, name in TRT_NAME.items():
                out[f"{trt}.{name}.weight"] = deq[lin]
        elif weights == "fp8":
            _fp8_layer(out, t, hf, trt, dt)
        if kv_fp8:  # the PyTorch backend's FP8 KV cache scale: 1.0 whatever k_scale / v_scale say (KV_SCALE_AS_SERVED)
            out[f"{trt}.attention.kv_cache_scaling_factor"] = torch.tensor([KV_SCALE_AS_SERVED])
    return out


def _fp8_layer(out: dict[str, torch.Tensor], t: dict[str, torch.Tensor], hf: str, trt: str, dt: torch.dtype) -> None:
    def part(lin: str) -> tuple[torch.Tensor, torch.Tensor]:
        return t[f"{hf}.{lin}.weight"], t[f"{hf}.{lin}.weight_scale"].float()

    def act(*lins: str) -> torch.Tensor:  # the group's largest input_scale (rescale_fused_weights)
        return torch.stack([t[f"{hf}.{x}.input_scale"].float().reshape(()) for x in lins]).max()

    qkv = [f"self_attn.{x}_proj" for x in "qkv"]
    ws, s = _rescaled([part(x) for x in qkv], dt)
    _put(out, f"{trt}.attention.qkv", torch.cat(ws), s, act(*qkv))
    gu, s = _rescaled([part("mlp.gate_proj"), part("mlp.up_proj")], dt)
    a = act("mlp.gate_proj", "mlp.up_proj")
    _put(out, f"{trt}.mlp.fc", gu[0], s, a)
    _put(out, f"{trt}.mlp.gate", gu[1], s, a)
    for lin in ("self_attn.o_proj", "mlp.down_proj"):
        w8, s = part(lin)
        _put(out, f"{trt}.{TRT_NAME[lin]}", w8, s.reshape(()), act(lin))


def _put(out: dict[str, torch.Tensor], module: str, w8: torch.Tensor, scale: torch.Tensor, act: torch.Tensor) -> None:
    if module + ".weight" not in out or tuple(out[module + ".weight"].shape) != tuple(w8.shape):
        raise Fp8Error(f"the export's {module} has shape {tuple(w8.shape)}, the converter's differs; report this")
    out[module + ".weight"] = w8
    out[module + ".weights_scaling_factor"] = scale.reshape(1).float().clone()
    out[module + ".activation_scaling_factor"] = act.reshape(1).float().clone()


def reference_checkpoint(ckpt16: Path, export: Path, out: Path, *, weights: str, kv_fp8: bool, dtype: str) -> None:
    """`out` = a copy of the 16-bit reference checkpoint `ckpt16` (tp=1) whose target holds the export's weights as
    the PyTorch backend loads them; config.json's quantization block says what the reference engine must apply."""
    from safetensors.torch import load_file, save_file

    conf = json.loads((ckpt16 / "config.json").read_text())
    if (conf.get("mapping") or {}).get("world_size", 1) != 1:
        raise Fp8Error("the reference engine's copy of an FP8 / NVFP4 export is written for parallel.tp 1")
    if not out.exists():
        shutil.copytree(ckpt16, out, symlinks=True, ignore=shutil.ignore_patterns("rank*.safetensors"))
    ours = load_file(str(ckpt16 / "rank0.safetensors"))
    merged = reference_tensors(export, ours, weights=weights, kv_fp8=kv_fp8, layers=int(conf["num_hidden_layers"]),
                               dtype=dtype)
    save_file({k: v.contiguous() for k, v in merged.items()}, str(out / "rank0.safetensors"),
              metadata={"format": "pt"})
    conf["quantization"] = {"quant_algo": "FP8" if weights == "fp8" else None,
                            "kv_cache_quant_algo": "FP8" if kv_fp8 else None, "exclude_modules": ["lm_head"]}
    conf.setdefault("eagle_deploy", {})["hf_quantized"] = {"quant_algo": ALGO.get(weights), "kv_fp8": kv_fp8}
    (out / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
