"""ModelOpt's FP8 export of a target the reference engine runs through transformers' own model class (the family rows
core/capabilities.py marks "generic": Qwen3-MoE, GLM-4.5), checked against TensorRT-LLM's loader and mirrored for the
reference engine.

What the export holds (nvidia-modelopt 0.47 `export_hf_checkpoint`, read from its output): every linear of the decoder
in the checkpoint's own names, routed experts one per expert (`mlp.experts.<e>.gate_proj / up_proj / down_proj`), as
float8_e4m3fn `weight` + float32 scalar `weight_scale` and `input_scale`; the embedding, LM head and MoE routers
16-bit and listed in hf_quant_config.json's `exclude_modules`; with an FP8 KV cache `k_proj.k_scale` /
`v_proj.v_scale` per attention.

`loader_problems` checks that (the `hf_quant.*` ledger rows). `write_mirror` writes the target as TensorRT-LLM's
PyTorch backend holds it after loading, as a Hugging Face directory the reference engine's generic path loads
(engines/fp8_generic.py applies the activation scales it records):
- q/k/v and a dense (or shared-expert) MLP's gate/up are fused upstream: each part requantized to the group's largest
  weight_scale, the group's largest input_scale for its input (FP8QDQLinearMethod.rescale_fused_weights, as the
  native mirror, builders/convert/hf_quant.py);
- routed experts (FP8QDQFusedMoEMethod, core/capabilities.py MOE_FP8): each expert's gate (w1) and up (w3)
  requantized to that expert's larger weight_scale (requantize_expert_w3_w1_weight_fp8_qdq); the experts' inputs
  quantized with one scale per MoE layer: the largest gate/up input_scale of all experts for the gate/up GEMM, the
  largest down input_scale for the down GEMM (load_activation_scales_fp8_qdq, process_weights_after_loading);
- the FP8 KV cache at a scale of 1.0, as the PyTorch backend serves it (builders/convert/hf_quant.py
  KV_SCALE_AS_SERVED).
Weights are stored dequantized (fp8 x scale, in target.dtype): what the reference engine's linears compute with.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from builders.convert.fp8 import DTYPES, Fp8Error
from builders.convert.hf_quant import (KV_SCALE_AS_SERVED, QUANT_CONFIG, _excluded, _rescaled, _tensors,
                                       quant_section, read_quant_config, scale_problems)
from engines.api import FP8_SCALES_FILE as MIRROR_SCALES  # the activation and KV scales the reference engine applies

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # fused upstream (one weight and input scale)
_EXPERT = re.compile(r"^(?P<moe>.+\.experts)\.(?P<e>\d+)\.(?P<lin>gate_proj|up_proj|down_proj)$")
_FP8_KEYS = {"weight": torch.float8_e4m3fn, "weight_scale": torch.float32, "input_scale": torch.float32}


def _linears(t: dict[str, torch.Tensor]) -> list[str]:
    """Modules of the export with a 2-D weight (the linears and the embedding)."""
    return sorted(k[: -len(".weight")] for k, v in t.items() if k.endswith(".weight") and v.dim() == 2)


def loader_problems(export: Path, *, weights: str, kv_fp8: bool) -> list[str]:
    """Where the export departs from what TensorRT-LLM's PyTorch backend loads for a generic row."""
    p, q = quant_section(export)
    if q is None:
        return p
    want = "FP8" if weights == "fp8" else None
    if q.get("quant_algo") != want:
        p.append(f"{QUANT_CONFIG}: quant_algo={q.get('quant_algo')!r}, expected {want!r}")
    if q.get("kv_cache_quant_algo") != ("FP8" if kv_fp8 else None):
        p.append(f"{QUANT_CONFIG}: kv_cache_quant_algo={q.get('kv_cache_quant_algo')!r}")
    exclude = q.get("exclude_modules") or []
    if not isinstance(exclude, list):
        return p
    t = _tensors(export)
    p += scale_problems(t, export)
    modules = _linears(t)
    if weights == "fp8" and "lm_head" not in exclude:
        p.append(f"{QUANT_CONFIG}: lm_head is quantized; this builder keeps it 16-bit (exclude_modules)")
    for m in modules:
        w = t[f"{m}.weight"]
        if weights != "fp8" or _excluded(m, exclude):
            if w.dtype not in (torch.float16, torch.bfloat16):
                p.append(f"{m}.weight is {w.dtype}; a module TensorRT-LLM loads unquantized (exclude_modules) is "
                         "16-bit")
            continue
        p += [f"{m}.{k}: {'missing' if f'{m}.{k}' not in t else t[f'{m}.{k}'].dtype}, expected {dt}"
              for k, dt in _FP8_KEYS.items() if f"{m}.{k}" not in t or t[f"{m}.{k}"].dtype != dt]
        if all(f"{m}.{k}" in t for k in _FP8_KEYS) and (
                t[f"{m}.weight_scale"].numel() != 1 or t[f"{m}.input_scale"].numel() != 1):
            p.append(f"{m}: FP8 weight_scale / input_scale must be per-tensor scalars (FP8QDQLinearMethod, "
                     "FP8QDQFusedMoEMethod)")
    attentions = sorted(m[: -len(".k_proj")] for m in modules if m.endswith("self_attn.k_proj"))
    if not attentions:
        p.append(f"{export}: no self_attn.k_proj linear found; not the layout this check reads")
    for a in attentions if kv_fp8 else []:
        for kv, proj in (("k_scale", "k_proj"), ("v_scale", "v_proj")):
            name = f"{a}.{proj}.{kv}"
            if name not in t or t[name].dtype != torch.float32 or t[name].numel() != 1:
                p.append(f"{name}: missing or not a float32 scalar (the FP8 KV cache scale)")
    return p


def _group_of(m: str, fp8: set[str]) -> tuple[str, ...]:
    """The linears fused with `m` upstream (itself alone when it is in no group or a part is not FP8)."""
    parent, _, leaf = m.rpartition(".")
    for g in GROUPS:
        if leaf in g:
            parts = tuple(f"{parent}.{x}" for x in g)
            return parts if all(x in fp8 for x in parts) else (m,)
    return (m,)


def mirror_tensors(t: dict[str, torch.Tensor], dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(16-bit tensors as the loader leaves the weights, the activation scales per linear and per MoE layer)."""
    dt = DTYPES[dtype]
    fp8 = {k[: -len(".weight")] for k, v in t.items() if k.endswith(".weight") and v.dtype == torch.float8_e4m3fn}
    out = {k: v for k, v in t.items() if not k.endswith(("weight_scale", "input_scale", "k_scale", "v_scale"))
           and not (k.endswith(".weight") and k[: -len(".weight")] in fp8)}
    linears: dict[str, float] = {}
    moe: dict[str, dict[str, float]] = {}
    done: set[str] = set()
    for m in sorted(fp8):
        if m in done:
            continue
        group = _group_of(m, fp8)
        ws, smax = _rescaled([(t[f"{x}.weight"], t[f"{x}.weight_scale"].float()) for x in group], dt)
        act = max(float(t[f"{x}.input_scale"].float().reshape(())) for x in group)
        for x, w8 in zip(group, ws):
            out[f"{x}.weight"] = (w8.float() * smax).to(dt)
            done.add(x)
            hit = _EXPERT.match(x)
            if hit is None:
                linears[x] = act
                continue
            key = "down" if hit["lin"] == "down_proj" else "gate_up"
            scales = moe.setdefault(hit["moe"], {})
            scales[key] = max(scales.get(key, 0.0), act)  # one input scale per MoE layer: the largest expert's
    return out, {"linears": linears, "experts": moe}


def write_mirror(hf16: Path, export: Path, out: Path, *, weights: str, kv_fp8: bool, dtype: str) -> None:
    """`out`: a Hugging Face directory of the target as TensorRT-LLM's PyTorch backend holds the export (the 16-bit
    target's config.json, dequantized weights), with MIRROR_SCALES for the reference engine."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    tensors, scales = mirror_tensors(_tensors(export), dtype) if weights == "fp8" else (
        {k: v for k, v in _tensors(export).items() if not k.endswith(("k_scale", "v_scale"))},
        {"linears": {}, "experts": {}})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        if (hf16 / name).is_file():
            shutil.copy2(hf16 / name, out / name)
    scales["kv_cache_scale"] = KV_SCALE_AS_SERVED if kv_fp8 else None
    scales["source"] = {"quant_algo": "FP8" if weights == "fp8" else None, "kv_cache_quant_algo":
                        "FP8" if kv_fp8 else None, "exclude_modules":
                        (read_quant_config(export).get("quantization") or {}).get("exclude_modules")}
    (out / MIRROR_SCALES).write_text(json.dumps(scales, indent=2, sort_keys=True) + "\n")


def check_weights(weights: str) -> None:
    if weights not in ("fp8", "none"):
        raise Fp8Error(f"quantization.weights={weights}: the reference mirror of this target family is FP8 only")
