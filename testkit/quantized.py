"""Tiny pre-quantized targets, as their authors publish the big ones: FP8 weights with one float32 scale per 128x128
block (`weight_scale_inv`, DeepSeek-V3's layout: weight = fp8 x scale of its block) and config.json's
`quantization_config: {quant_method: fp8, weight_block_size: [128, 128], activation_scheme: dynamic}`; and the same
weights dequantized into a plain float32 directory (the model the quantized one stands for)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

BLOCK = 128
FP8_MAX = 448.0
QUANTIZATION_CONFIG = {"quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK], "activation_scheme": "dynamic",
                       "fmt": "e4m3"}


def _quantized_name(name: str, t: torch.Tensor) -> bool:
    """The decoder layers' linear weights (MLA projections, dense MLPs, experts), not norms, routers or embeddings."""
    return (name.startswith("model.layers.") and name.endswith(".weight") and "_proj" in name and t.dim() in (2, 3)
            and "norm" not in name)


def block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, float32 scale_inv per 128x128 block) of a 2-D weight (ragged edge blocks as DeepSeek's)."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale = torch.empty(br, bc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].float()
            s = max(float(blk.abs().max()), 1e-12) / FP8_MAX
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def block_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[: q.shape[0], : q.shape[1]]
    return q.float() * full


def fp8_block_target(src: Path, quantized: Path, dequantized: Path) -> tuple[Path, Path]:
    """From a float32 HF directory `src`: `quantized` (FP8 128x128 blocks + scales, quantization_config) and
    `dequantized` (those FP8 weights x their scales, float32, no quantization_config)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    q_out, d_out = {}, {}
    for name, t in tensors.items():
        if not _quantized_name(name, t) or t.dim() != 2:
            q_out[name] = d_out[name] = t
            continue
        q, s = block_quantize(t)
        q_out[name], q_out[name[: -len("weight")] + "weight_scale_inv"] = q, s
        d_out[name] = block_dequantize(q, s)
    for out, tens, quant in ((quantized, q_out, True), (dequantized, d_out, False)):
        shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
        save_file({k: v.contiguous() for k, v in tens.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
        if quant:
            cfg = json.loads((out / "config.json").read_text())
            cfg["quantization_config"] = dict(QUANTIZATION_CONFIG)
            (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return quantized, dequantized
